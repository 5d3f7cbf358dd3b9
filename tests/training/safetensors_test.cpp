// The shared safetensors reader/writer (src/core/safetensors.h): the documented byte layout, a
// round trip of every dtype the checkpoints use (file and in-memory parsers), and every
// malformed-file case as a megatron::Error naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;

std::string file_bytes(const fs::path& p) { return testing::read_file(p); }

void write_raw(const fs::path& p, const std::string& header, const std::string& data,
               int64_t header_len_override = -1) {
  std::string out(8, '\0');
  const uint64_t n = header_len_override >= 0 ? uint64_t(header_len_override) : header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  testing::write_file(p, out + header + data);
}

void expect_read_error(const fs::path& p, const std::string& needle) {
  try {
    read_safetensors(p);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
  // The in-memory parser applies the same checks.
  const std::string bytes = file_bytes(p);
  EXPECT_THROW(parse_safetensors({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "x"),
               Error);
}

TEST(Safetensors, WorkedExampleBytes) {
  testing::TempDir dir;
  const fs::path p = dir / "w.safetensors";
  write_safetensors(p, {{"w", Tensor::from_vector<float>({1.0f, 2.0f}, {2})}});
  const std::string b = file_bytes(p);
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(b.size(), 8u + 56u + 8u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x38\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(b.substr(8, 56), header + "  ");
  EXPECT_EQ(b.substr(64), std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8));
}

TEST(Safetensors, RoundTripDtypesAndMetadata) {
  testing::TempDir dir;
  const fs::path p = dir / "t.safetensors";
  Tensor f32 = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f}, {2, 3});
  Tensor bf = f32.to(DType::BF16), f16 = f32.to(DType::F16);
  Tensor i64 = Tensor::from_vector<int64_t>({-5, 1LL << 40}, {2});
  Tensor u8 = Tensor::from_vector<uint8_t>({1, 2, 3}, {3});
  Tensor scalar = Tensor::from_vector<int64_t>({42}, {});
  Tensor empty = Tensor::empty({0, 4}, DType::F32);
  Tensor strided = f32.transpose(0, 1);  // non-contiguous: written as its contiguous copy
  write_safetensors(p, {{"b.f32", f32}, {"a.bf16", bf}, {"f16", f16}, {"i64", i64}, {"u8", u8},
                        {"scalar", scalar}, {"empty", empty}, {"t", strided}},
                    {{"format", "pt"}});
  for (int mode = 0; mode < 2; ++mode) {
    SafetensorsContents c;
    if (mode == 0) {
      c = read_safetensors(p);
    } else {
      const std::string bytes = file_bytes(p);
      c = parse_safetensors({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "mem");
    }
    ASSERT_EQ(c.tensors.size(), 8u);
    EXPECT_EQ(c.metadata.at("format"), "pt");
    auto same_bytes = [](const Tensor& a, const Tensor& b) {
      return a.dtype() == b.dtype() && a.shape() == b.shape() &&
             std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
    };
    EXPECT_TRUE(same_bytes(c.tensors.at("b.f32"), f32));
    EXPECT_TRUE(same_bytes(c.tensors.at("a.bf16"), bf));
    EXPECT_TRUE(same_bytes(c.tensors.at("f16"), f16));
    EXPECT_TRUE(same_bytes(c.tensors.at("i64"), i64));
    EXPECT_TRUE(same_bytes(c.tensors.at("u8"), u8));
    EXPECT_TRUE(same_bytes(c.tensors.at("scalar"), scalar));
    EXPECT_EQ(c.tensors.at("empty").shape(), (Shape{0, 4}));
    EXPECT_TRUE(same_bytes(c.tensors.at("t"), strided.contiguous()));
  }
  // The header lists tensors in the order given, data in the same order.
  const std::string b = file_bytes(p);
  EXPECT_LT(b.find("\"b.f32\""), b.find("\"a.bf16\""));
}

TEST(Safetensors, MalformedFilesAreErrorsNamingTheFile) {
  testing::TempDir dir;
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\1');
  int n = 0;
  auto file = [&] { return dir / ("bad" + std::to_string(n++) + ".safetensors"); };
  fs::path p;

  p = file();
  testing::write_file(p, "abc");
  expect_read_error(p, "too short");
  p = file();
  write_raw(p, "{" + ok_entry + "}", data8, 1 << 20);
  expect_read_error(p, "header length field says 1048576");
  p = file();
  write_raw(p, "{" + ok_entry + "}", data8, 1LL << 62);
  expect_read_error(p, "header length field says");
  p = file();
  write_raw(p, "{\"w\":{\"dtype\":\"F32\",", data8);
  expect_read_error(p, "not valid JSON");
  p = file();
  write_raw(p, "[1,2]", data8);
  expect_read_error(p, "not a JSON object");
  p = file();
  write_raw(p, "{" + ok_entry + "}", data8.substr(0, 5));
  expect_read_error(p, "truncated: tensor 'w' ends at data offset 8 but the data region has only 5");
  p = file();
  write_raw(p, "{" + ok_entry + "}", data8 + "xx");
  expect_read_error(p, "2 bytes after the last tensor");
  p = file();
  write_raw(p, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8);
  expect_read_error(p, "needs 12 bytes");
  p = file();
  write_raw(p, "{" + ok_entry + R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8);
  expect_read_error(p, "overlaps");
  p = file();
  write_raw(p, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8);
  expect_read_error(p, "gap of 4 bytes before tensor 'w'");
  p = file();
  write_raw(p, R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data8);
  expect_read_error(p, "unsupported dtype 'Q4'");
  p = file();
  write_raw(p, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8);
  expect_read_error(p, "shape entry");
  p = file();
  write_raw(p, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data8);
  expect_read_error(p, "impossibly large");
  p = file();
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2]}})", data8);
  expect_read_error(p, "malformed header entry for tensor 'w'");
  p = file();
  write_raw(p, "{" + ok_entry + "," + ok_entry + "}", data8);
  expect_read_error(p, "'w' appears twice");
  p = file();
  write_raw(p, R"({"__metadata__":{"a":1},)" + ok_entry + "}", data8);
  expect_read_error(p, "__metadata__ value for 'a'");
  EXPECT_THROW(read_safetensors(dir / "missing.safetensors"), Error);
}

}  // namespace
}  // namespace megatron
