// PyTorch files without Python (core/torch_file.h, core/pickle.h, core/zip_archive.h), against
// Debian's torch (tests/reference/torch_files.py): what torch.save writes (zip and legacy formats,
// every dtype, views with offsets and strides, OrderedDict with _metadata, argparse.Namespace,
// NumPy RNG state, sets, bytes, big ints) reads back with the same values; files naming
// os.system, builtins.eval or __import__ are refused with the global named and nothing executed;
// what we write torch.load reads; truncated and corrupted files give errors naming the file;
// crafted pickles (memo, stack, lengths, cycles) fail cleanly; ZIP64 archives round-trip.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"
#include "core/zip_archive.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;
using pickle::Document;
using pickle::Kind;
using pickle::Value;

std::string reference(const std::string& args) {
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/torch_files.py").string() +
                                 " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out;
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype()) {
      case DType::I64: out.push_back(double(c.data<int64_t>()[i])); break;
      case DType::I32: out.push_back(double(c.data<int32_t>()[i])); break;
      case DType::U8: out.push_back(double(c.data<uint8_t>()[i])); break;
      default: out.push_back(c.item_as_double(i));
    }
  }
  return out;
}

std::string torch_name(DType t, bool is_bool) {
  if (is_bool) return "bool";
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F64: return "float64";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    default: return dtype_name(t);
  }
}

void expect_tensors(const TorchFile& f, const Value* mapping, const json& expect, const std::string& what) {
  ASSERT_NE(mapping, nullptr) << what;
  for (const auto& [name, e] : expect.items()) {
    const Value* v = mapping->get(name);
    ASSERT_NE(v, nullptr) << what << " " << name;
    ASSERT_EQ(v->kind, Kind::Tensor) << what << " " << name;
    const Tensor t = f.tensor(*v);
    EXPECT_EQ(torch_name(t.dtype(), v->is_bool), e["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t.shape(), e["shape"].get<Shape>()) << name;
    EXPECT_EQ(values_of(t), e["values"].get<std::vector<double>>()) << what << " " << name;
  }
}

// objects.pt, objects_legacy.pt and objects.json, written once per test process.
const mt::TempDir& objects() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    reference("objects " + dir.path().string());
    made = true;
  }
  return dir;
}

TEST(TorchFile, ReadsWhatTorchSaveWrites) {
  const mt::TempDir& dir = objects();
  const json expect = json::parse(mt::read_file(dir / "objects.json"));
  for (const char* name : {"objects.pt", "objects_legacy.pt"}) {
    SCOPED_TRACE(name);
    const TorchFile f = TorchFile::open(dir / name);
    const Value& root = f.root();
    ASSERT_EQ(root.kind, Kind::Dict);
    expect_tensors(f, root.get("tensors"), expect["tensors"], "tensors");
    const Value* sd = root.get("state_dict");
    ASSERT_NE(sd, nullptr);
    EXPECT_TRUE(sd->ordered);
    ASSERT_EQ(sd->entries.size(), 2u);  // weight, bias; the _metadata attribute is dropped
    EXPECT_EQ(sd->entries[0].first->text, "weight");
    expect_tensors(f, sd, expect["state_dict"], "state_dict");

    const Value* args = root.get("args");
    ASSERT_NE(args, nullptr);
    ASSERT_EQ(args->kind, Kind::Namespace);
    EXPECT_EQ(args->get("num_layers")->integer, 2);
    EXPECT_EQ(args->get("lr")->real, 3e-4);
    EXPECT_TRUE(args->get("fp16")->boolean);
    EXPECT_EQ(args->get("name")->text, "gpt");
    EXPECT_EQ(args->get("params_dtype")->kind, Kind::TorchDType);
    EXPECT_EQ(args->get("params_dtype")->dtype, DType::F16);
    EXPECT_EQ(args->get("data_path")->items.size(), 2u);
    EXPECT_EQ(args->get("none")->kind, Kind::None);
    EXPECT_EQ(args->get("big")->kind, Kind::BigInt);
    EXPECT_EQ(args->get("neg")->integer, -5);
    EXPECT_EQ(args->get("ids")->kind, Kind::List);
    EXPECT_EQ(args->get("raw")->kind, Kind::Bytes);
    EXPECT_EQ(args->get("raw")->text, std::string("\x00\xffxy", 4));

    const Value* numbers = root.get("numbers");
    ASSERT_NE(numbers, nullptr);
    const std::vector<int64_t> ints = {1, -1, 255, 256, 65535, 65536, -(int64_t(1) << 31),
                                       int64_t(1) << 31, int64_t(1) << 62};
    ASSERT_EQ(numbers->items.size(), ints.size() + 2);
    for (size_t i = 0; i < ints.size(); ++i) EXPECT_EQ(numbers->items[i]->integer, ints[i]) << i;
    EXPECT_EQ(numbers->items[9]->real, 1.5);
    EXPECT_TRUE(std::signbit(numbers->items[10]->real));

    const Value* np_state = root.get("np_rng_state");
    ASSERT_NE(np_state, nullptr);
    ASSERT_EQ(np_state->items.size(), 5u);
    EXPECT_EQ(np_state->items[0]->text, "MT19937");
    const Value* keys = np_state->items[1];
    ASSERT_EQ(keys->kind, Kind::NdArray);
    EXPECT_EQ(keys->member, "<u4");
    EXPECT_EQ(keys->shape, Shape{624});
    ASSERT_EQ(keys->text.size(), 624u * 4);
    for (int i = 0; i < 4; ++i) {
      uint32_t k = 0;
      std::memcpy(&k, keys->text.data() + 4 * i, 4);
      EXPECT_EQ(k, expect["np_rng_keys"][size_t(i)].get<uint32_t>());
    }
    EXPECT_EQ(np_state->items[2]->integer, expect["np_rng_pos"].get<int64_t>());
    const Value* py_state = root.get("random_rng_state");
    ASSERT_NE(py_state, nullptr);
    EXPECT_EQ(py_state->items[1]->items.size(), 625u);
    EXPECT_EQ(root.get(3)->text, "int key");
    EXPECT_EQ(root.get("empty")->get("tuple")->kind, Kind::Tuple);
  }
}

TEST(TorchFile, ForbiddenGlobalsAreRefusedAndNothingRuns) {
  mt::TempDir dir;
  const fs::path marker = dir / "MARKER";
  reference("forbidden " + dir.path().string() + " " + marker.string());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"os_system.pt", "'posix.system'"},
      {"eval.pt", "'__builtin__.eval'"},
      {"getattr.pt", "'__builtin__.__import__'"},
      {"namespace.pt", "'posix.system'"},
  };
  for (const auto& [file, global] : cases) {
    const std::string msg = mt::error_of([&] { TorchFile::open(dir / file); });
    EXPECT_NE(msg.find(global), std::string::npos) << file << ": " << msg;
    EXPECT_NE(msg.find((dir / file).string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("nothing was executed"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(marker));
  // The same files do run code under torch.load: the test files are what they claim to be.
  const auto r = mt::run_command("cd " + dir.path().string() + " && /usr/bin/python3 -c \"import torch; "
                                 "torch.load('os_system.pt')\" 2>&1");
  EXPECT_TRUE(fs::exists(marker)) << r.output;
}

TEST(TorchFile, WrittenFilesLoadInTorchBitForBit) {
  mt::TempDir dir;
  pickle::Document doc;
  Value* root = doc.dict();
  doc.root = root;
  Value* tensors = doc.dict(true);
  json expect_tensors_json = json::object();
  auto add = [&](const std::string& name, const Tensor& t, const char* torch_dtype) {
    Document::set(tensors, doc.str(name), doc.tensor(t));
    json e = {{"dtype", torch_dtype}, {"shape", t.shape()}, {"values", values_of(t)}};
    expect_tensors_json[name] = e;
  };
  Tensor f32 = Tensor::empty({3, 4}, DType::F32);
  for (int i = 0; i < 12; ++i) f32.data<float>()[i] = 0.25f * float(i) - 1.0f;
  add("f32", f32, "float32");
  add("bf16", f32.to(DType::BF16), "bfloat16");
  add("f16", f32.to(DType::F16), "float16");
  add("transposed", f32.transpose(0, 1), "float32");  // written contiguous
  add("i64", Tensor::from_vector<int64_t>({-(int64_t(1) << 40), 0, 7}, {3}), "int64");
  add("scalar", Tensor::from_vector<float>({2.5f}, {}), "float32");
  Document::set(root, doc.str("tensors"), tensors);
  Value* ns = doc.namespace_();
  Document::set(ns, doc.str("num_layers"), doc.integer(24));
  Document::set(ns, doc.str("lr"), doc.real(1.5e-4));
  Document::set(ns, doc.str("params_dtype"), doc.torch_dtype(DType::BF16));
  Document::set(ns, doc.str("big"), doc.integer(int64_t(1) << 50));
  Document::set(ns, doc.str("neg"), doc.integer(-70000));
  Document::set(root, doc.str("args"), ns);
  Document::set(root, doc.str("version"), doc.real(3.0));
  Document::set(root, doc.str("list"), doc.list({doc.none(), doc.boolean(true), doc.str("é")}));
  std::string raw(624 * 4, '\0');
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = char(i * 7);
  Document::set(root, doc.str("np"), doc.tuple({doc.str("MT19937"), doc.ndarray(raw, "<u4", {624}),
                                                doc.integer(624), doc.integer(0), doc.real(0.0)}));
  write_torch_file(dir / "ours.pt", *root, "ours");
  const json expect = {
      {"tensors", expect_tensors_json},
      {"args", {{"num_layers", 24}, {"lr", 1.5e-4}, {"big", int64_t(1) << 50}, {"neg", -70000},
                {"params_dtype", {{"__str__", "torch.bfloat16"}}}}},
      {"version", 3.0},
      {"list", {nullptr, true, "é"}},
      {"np", {"MT19937", {{"__ndarray__", {"uint32", {624}, {0x150E0700u, 0x312A231Cu}}}}, 624, 0, 0.0}}};
  mt::write_file(dir / "expect.json", expect.dump());
  EXPECT_EQ(reference("check " + (dir / "ours.pt").string() + " " + (dir / "expect.json").string()), "ok\n");

  // And back, bit for bit.
  const TorchFile f = TorchFile::open(dir / "ours.pt");
  for (const auto& [name, e] : expect_tensors_json.items())
    EXPECT_EQ(values_of(f.tensor(*f.root().get("tensors")->get(name))), e["values"].get<std::vector<double>>())
        << name;
  EXPECT_EQ(f.root().get("np")->items[1]->text, raw);
}

TEST(TorchFile, TruncatedAndCorruptedFilesNameTheFile) {
  mt::TempDir dir;
  const std::string good = mt::read_file(objects() / "objects.pt");
  const fs::path bad = dir / "bad.pt";
  // Every truncation is an error naming the file (never a crash).
  for (size_t n = 0; n < good.size(); n += 61) {
    mt::write_file(bad, good.substr(0, n));
    const std::string msg = mt::error_of([&] { TorchFile::open(bad); });
    EXPECT_NE(msg.find(bad.string()), std::string::npos) << n << ": " << msg;
  }
  // A flipped byte inside a tensor's record fails its CRC-32 and names the record.
  const ZipReader z = ZipReader::open(objects() / "objects.pt");
  const ZipEntry* storage = z.find("objects/data/0");
  ASSERT_NE(storage, nullptr);
  std::string flipped = good;
  flipped[size_t(storage->data_offset) + 1] ^= 0x10;
  mt::write_file(bad, flipped);
  std::string msg = mt::error_of([&] {  // found when the tensors are read
    const TorchFile f = TorchFile::open(bad);
    for (const auto& [name, t] : f.root().get("tensors")->entries) f.tensor(*t);
  });
  EXPECT_NE(msg.find("objects/data/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
  mt::write_file(bad, "definitely not a checkpoint");
  msg = mt::error_of([&] { TorchFile::open(bad); });
  EXPECT_NE(msg.find("is not a PyTorch checkpoint"), std::string::npos) << msg;
  msg = mt::error_of([&] { TorchFile::open(dir / "missing.pt"); });
  EXPECT_NE(msg.find("missing.pt"), std::string::npos) << msg;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Unpickler, CraftedPicklesFailCleanly) {
  auto err = [](const std::string& p) {
    return mt::error_of([&] { pickle::unpickle(bytes_of(p), "t.pkl"); });
  };
  EXPECT_NE(err("h\x05.").find("never stored"), std::string::npos);                  // BINGET
  EXPECT_NE(err(std::string("X\xff\xff\xff\x7f", 5)).find("ends early"), std::string::npos);
  EXPECT_NE(err("0.").find("empty stack"), std::string::npos);                      // POP
  EXPECT_NE(err("a.").find("empty stack"), std::string::npos);                      // APPEND
  EXPECT_NE(err("(K\x01K\x02K\x03" "d.").find("odd number"), std::string::npos);     // DICT
  EXPECT_NE(err("cos\nsystem\n.").find("'os.system'"), std::string::npos);
  EXPECT_NE(err("i__main__\nX\n.").find("INST"), std::string::npos);
  EXPECT_NE(err("I1\n.").find("protocol-0"), std::string::npos);
  EXPECT_NE(err("K\x01").find("ends early"), std::string::npos);                    // no STOP
  // A huge memo index allocates nothing; a list that contains itself is a finite tree of
  // pointers (the arena owns it).
  const pickle::Document d = pickle::unpickle(bytes_of(std::string("]r\xff\xff\xff\xffj\xff\xff\xff\xff" "a.", 13)), "t");
  ASSERT_EQ(d.root->kind, Kind::List);
  ASSERT_EQ(d.root->items.size(), 1u);
  EXPECT_EQ(d.root->items[0], d.root);
  // Protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL.
  const std::string p4 = std::string("\x80\x04\x95\x10\0\0\0\0\0\0\0", 11) + "\x8c\x0b" "collections" "\x94" +
                         "\x8c\x0b" "OrderedDict" "\x94\x93\x94)R\x94."  ;
  const pickle::Document od = pickle::unpickle(bytes_of(p4), "p4");
  EXPECT_EQ(od.root->kind, Kind::Dict);
  EXPECT_TRUE(od.root->ordered);
  EXPECT_TRUE(pickle::is_allowed_global("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_FALSE(pickle::is_allowed_global("builtins", "eval"));
  EXPECT_FALSE(pickle::is_allowed_global("megatron.core.enums", "Popen"));
}

TEST(ZipArchive, Zip64EntryCountsRoundTrip) {
  mt::TempDir dir;
  const fs::path file = dir / "many.zip";
  const int n = 70000;  // > 65535 entries: the ZIP64 end records
  {
    ZipWriter w(file);
    for (int i = 0; i < n; ++i) {
      const std::string s = std::to_string(i * 3);
      w.add("a/" + std::to_string(i), bytes_of(s));
    }
    w.finish();
  }
  const ZipReader z = ZipReader::open(file);
  ASSERT_EQ(z.entries().size(), size_t(n));
  const auto d = z.read(*z.find("a/69999"));
  EXPECT_EQ(std::string(d.begin(), d.end()), std::to_string(69999 * 3));
  EXPECT_EQ(z.entries()[5].data_offset % 64, 0u);  // data aligned as PyTorch's
  const auto r = mt::run_command("/usr/bin/python3 -c \"import zipfile; z = zipfile.ZipFile('" + file.string() +
                                 "'); print(len(z.infolist()), z.testzip(), z.read('a/12'))\"");
  EXPECT_EQ(r.output, "70000 None b'36'\n");
  EXPECT_EQ(crc32(bytes_of("123456789")), 0xCBF43926u);  // the standard check value
}

}  // namespace
}  // namespace megatron
