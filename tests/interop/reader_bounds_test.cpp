// Sizes and types read from checkpoint files are checked before they are trusted:
//   - a .pt tensor whose element count or extent overflows 64 bits (sizes (2^32, 2^32), strides
//     (2^32, 1)) is refused when the file is opened, naming it; no tensor of a wrapped size is made;
//   - Hugging Face config.json integers are read as 64 bits and range-checked (n_layer 2^32 + 2 is
//     not a 2-layer model), norm epsilons and rope_theta must be positive finite numbers, dropout
//     rates in [0, 1), all at import with config.json's names;
//   - a safetensors tensor relabelled F32 -> I32 is not a weight: refused, naming the tensor;
//   - a Tensor whose byte size overflows is an Error, not a wrapped allocation.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_bounds.h"
#include "core/safetensors.h"
#include "core/torch_file.h"
#include "core/zip_archive.h"
#include "interop/hf_reference_util.h"
#include "test_util.h"
#include "training/hf_checkpoint.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

// A .pt file (torch.save's zip format) holding {"w": tensor} whose pickle records `sizes`,
// `strides` and `offset` over a storage of 16 floats; the pickle is written opcode by opcode, as
// no tensor with such a geometry can be made to write it.
fs::path pt_with_geometry(const fs::path& dir, const Shape& sizes, const Shape& strides,
                          int64_t offset = 0) {
  std::string p;
  const auto text = [&](const std::string& s) {  // BINUNICODE
    p += 'X';
    for (int i = 0; i < 4; ++i) p += char(uint32_t(s.size()) >> (8 * i));
    p += s;
  };
  const auto integer = [&](int64_t v) {  // LONG1 with 8 bytes
    p += "\x8a\x08";
    for (int i = 0; i < 8; ++i) p += char(uint64_t(v) >> (8 * i));
  };
  const auto tuple = [&](const Shape& s) {
    p += '(';
    for (int64_t d : s) integer(d);
    p += 't';
  };
  p += "\x80\x02}";  // PROTO 2, EMPTY_DICT
  text("w");
  p += "ctorch._utils\n_rebuild_tensor_v2\n((";
  text("storage");
  p += "ctorch\nFloatStorage\n";
  text("0");
  text("cpu");
  integer(16);
  p += "tQ";  // the persistent id tuple, BINPERSID
  integer(offset);
  tuple(sizes);
  tuple(strides);
  p += "\x89" "ccollections\nOrderedDict\n)RtRs.";  // False, OrderedDict(), REDUCE, SETITEM, STOP
  const fs::path file = dir / "bad.pt";
  ZipWriter zip(file);
  const auto add = [&](const std::string& name, const std::string& bytes) {
    zip.add(name, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  };
  add("bad/data.pkl", p);
  add("bad/data/0", std::string(64, '\0'));
  add("bad/version", "3\n");
  zip.finish();
  return file;
}

TEST(ReaderBounds, PtTensorsWhoseSizesWrapAreRefusedAtOpen) {
  mt::TempDir tmp;
  const int64_t big = int64_t(1) << 32;
  struct Case {
    Shape sizes, strides;
    int64_t offset;
    const char* says;
  };
  const Case cases[] = {
      {{big, big}, {big, 1}, 0, "element count or extent overflows 64 bits"},  // 2^64 elements
      {{2, int64_t(1) << 62}, {1, 1}, 0, "overflows 64 bits"},                 // bytes overflow
      {{5, 2}, {int64_t(1) << 62, 1}, 0, "overflows 64 bits"},                  // extent overflows
      {{2, 2}, {1, 1}, INT64_MAX - 1, "reaches element 9223372036854775808"},   // offset + extent
      {{4, 8}, {8, 1}, 0, "has more elements than its storage"},
      {{4, 4}, {4, 1}, 1, "reaches element 16 of storage"},
  };
  for (const Case& c : cases) {
    const fs::path file = pt_with_geometry(tmp.path(), c.sizes, c.strides, c.offset);
    const std::string e = mt::error_of([&] { TorchFile::open(file); });
    EXPECT_NE(e.find(file.string()), std::string::npos) << e;
    EXPECT_NE(e.find(c.says), std::string::npos) << shape_str(c.sizes) << ": " << e;
  }
  // The same file with its true geometry reads.
  const TorchFile ok = TorchFile::open(pt_with_geometry(tmp.path(), {2, 4}, {4, 1}, 8));
  EXPECT_EQ(ok.tensor(*ok.root().get("w")).shape(), (Shape{2, 4}));
}

TEST(ReaderBounds, TensorSizesThatOverflowAreErrors) {
  const int64_t big = int64_t(1) << 32;
  const std::string e = mt::error_of([&] { Tensor::empty({big, big}, DType::F32); });
  EXPECT_NE(e.find("tensor of shape [4294967296, 4294967296] cannot exist"), std::string::npos) << e;
  EXPECT_THROW(Tensor::empty({0, big, big}, DType::F32), Error);  // no elements, but its strides
  uint64_t bytes = 0;
  EXPECT_TRUE(checked_shape_bytes({0, big}, 4, &bytes));
  EXPECT_EQ(bytes, 0u);
  EXPECT_FALSE(checked_shape_bytes({-1, 2}, 4, &bytes));
  EXPECT_FALSE(checked_shape_bytes({int64_t(1) << 62}, 4, &bytes));
}

// A safetensors header whose shape has no elements but whose other sizes multiply past 64 bits
// (no data to hold, strides that cannot exist): refused naming the file and the tensor.
TEST(ReaderBounds, SafetensorsShapesWhoseStridesOverflowAreRefused) {
  const std::string header = R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char(header.size() >> (8 * i));
  file += header;
  const std::string e = mt::error_of([&] {
    parse_safetensors(std::span(reinterpret_cast<const uint8_t*>(file.data()), file.size()), "x.safetensors");
  });
  EXPECT_NE(e.find("x.safetensors: tensor 't' has an impossibly large shape [0, 4611686018427387904, 4]"),
            std::string::npos) << e;
}

std::string import_error(const fs::path& folder) {
  return mt::error_of([&] { training::read_hf_checkpoint(folder, 8, 1, std::nullopt); });
}

TEST(ReaderBounds, HfConfigIntegersAre64BitAndRangeChecked) {
  mt::TempDir tmp;
  using training::hf_test::tiny_gpt2_config;
  using training::hf_test::tiny_gpt2_tensors;
  using training::hf_test::write_folder;
  // The hand-made folder imports as it is.
  EXPECT_EQ(training::read_hf_checkpoint(write_folder(tmp / "ok", tiny_gpt2_config(), tiny_gpt2_tensors()),
                                         8, 1, std::nullopt).args.model.num_layers, 1);
  struct Case {
    const char* field;
    json value;
    const char* says;
  };
  const Case gpt2[] = {
      {"n_layer", json(uint64_t(4294967298)), "\"n_layer\" must be an integer in [1, 2147483647], got 4294967298"},
      {"n_layer", json(int64_t(-2)), "\"n_layer\" must be an integer in [1, 2147483647], got -2"},
      {"n_layer", json(18446744073709551615ull), "got 18446744073709551615"},
      {"n_embd", json(uint64_t(4294967304)), "\"n_embd\" must be an integer"},
      {"n_head", json(uint64_t(1) << 33), "\"n_head\" must be an integer"},
      {"n_positions", json(uint64_t(1) << 40), "\"n_positions\" must be an integer"},
      {"n_inner", json(uint64_t(1) << 32), "\"n_inner\" must be an integer"},
      {"vocab_size", json(uint64_t(1) << 32), "\"vocab_size\" must be an integer"},
      {"n_layer", json(2.0), "\"n_layer\" must be an integer"},
      {"layer_norm_epsilon", json(-1e-5), "\"layer_norm_epsilon\" must be a positive finite number, got -1e-05"},
      {"layer_norm_epsilon", json(0.0), "\"layer_norm_epsilon\" must be a positive finite number"},
      {"layer_norm_epsilon", json(1e-60), "is not representable as a positive single-precision number"},
      {"resid_pdrop", json(1.5), "\"resid_pdrop\" must be in [0, 1), got 1.5"},
      {"attn_pdrop", json(-0.1), "\"attn_pdrop\" must be in [0, 1)"},
  };
  int k = 0;
  for (const Case& c : gpt2) {
    json config = tiny_gpt2_config();
    config[c.field] = c.value;
    const fs::path dir = write_folder(tmp / ("gpt2_" + std::to_string(k++)), config, tiny_gpt2_tensors());
    const std::string e = import_error(dir);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.field << " = " << c.value << ": " << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  }
  const json llama = {{"model_type", "llama"}, {"hidden_size", 8}, {"intermediate_size", 16},
                      {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"vocab_size", 10}};
  const Case llama_cases[] = {
      {"num_hidden_layers", json(uint64_t(4294967297)), "\"num_hidden_layers\" must be an integer"},
      {"intermediate_size", json(uint64_t(1) << 35), "\"intermediate_size\" must be an integer"},
      {"num_key_value_heads", json(uint64_t(1) << 32), "\"num_key_value_heads\" must be an integer"},
      {"head_dim", json(uint64_t(1) << 31), "\"head_dim\" must be an integer"},
      {"head_dim", json(int64_t(1) << 30), "does not fit in 32 bits"},
      {"rms_norm_eps", json(-1e-6), "\"rms_norm_eps\" must be a positive finite number, got -1e-06"},
      {"rope_theta", json(0.0), "\"rope_theta\" must be a positive finite number, got 0.0"},
      {"rope_theta", json(-10000.0), "\"rope_theta\" must be a positive finite number"},
      {"attention_dropout", json(1.0), "\"attention_dropout\" must be in [0, 1)"},
  };
  for (const Case& c : llama_cases) {
    json config = llama;
    config[c.field] = c.value;
    const fs::path dir = write_folder(tmp / ("llama_" + std::to_string(k++)), config, tiny_gpt2_tensors());
    const std::string e = import_error(dir);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.field << " = " << c.value << ": " << e;
  }
}

// The header of a safetensors file relabels one tensor's F32 bytes as I32: the bytes are a valid
// I32 tensor of the same size, but a weight must be floating point.
TEST(ReaderBounds, ASafetensorsDtypeRelabelledToAnIntegerIsRefused) {
  mt::TempDir tmp;
  using training::hf_test::tiny_gpt2_config;
  using training::hf_test::tiny_gpt2_tensors;
  for (const std::string name : {"transformer.h.0.mlp.c_fc.bias", "transformer.wte.weight"}) {
    const fs::path dir = training::hf_test::write_folder(tmp / name, tiny_gpt2_config(), tiny_gpt2_tensors());
    std::string bytes = mt::read_file(dir / "model.safetensors");
    const size_t at = bytes.find("\"F32\"", bytes.find("\"" + name + "\""));
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 5, "\"I32\"");
    mt::write_file(dir / "model.safetensors", bytes);
    EXPECT_EQ(read_safetensors(dir / "model.safetensors").tensors.at(name).dtype(), DType::I32);
    const std::string e = import_error(dir);
    EXPECT_NE(e.find("tensor '" + name + "' has dtype I32; a weight must be floating point"),
              std::string::npos) << e;
    EXPECT_NE(e.find((dir / "model.safetensors").string()), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace megatron
