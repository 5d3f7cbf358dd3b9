// The .metadata pickle of torch_dist checkpoints in protocol 4, as PyTorch's FileSystemWriter
// writes it (filesystem.py: pickle.dump with Python's default protocol, 4 from 3.8 to 3.13):
// PROTO 4, 64 KiB frames, SHORT_BINUNICODE strings, memoized STACK_GLOBALs. Python's pickle reads
// ours back to the same objects (pickletools lists the opcodes), and the restricted unpickler
// reads protocol 2 and protocol 4 alike to the same tree.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/pickle.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using pickle::Document;
using pickle::Kind;
using pickle::Value;

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";

// A metadata-like tree: many MetadataIndex objects (more than one frame), torch.Size tuples,
// long and short strings, ints of every width, floats, bytes and the enum and dtype members.
Document sample() {
  Document d;
  Value* storage = d.dict();
  for (int i = 0; i < 3000; ++i) {
    Value* index = d.namespace_();
    index->text = std::string(kMeta) + "MetadataIndex";
    d.set(index, "fqn", d.str("decoder.layers.mlp.experts.experts.linear_fc1.weight" + std::to_string(i)));
    Value* size = d.tuple({d.integer(i), d.integer(70000), d.integer(int64_t(1) << 40)});
    size->text = "torch.Size";
    d.set(index, "offset", size);
    d.set(index, "index", d.integer(i % 7));
    Value* info = d.namespace_();
    info->text = "torch.distributed.checkpoint.filesystem._StorageInfo";
    d.set(info, "relative_path", d.str("__" + std::to_string(i % 8) + "_0.distcp"));
    d.set(info, "offset", d.integer(-i));
    d.set(info, "length", d.real(0.5 * i));
    Document::set(storage, index, info);
  }
  Value* root = d.dict();
  d.set(root, "storage_data", storage);
  d.set(root, "long", d.str(std::string(300, 'x')));
  d.set(root, "dtype", d.torch_dtype(DType::BF16));
  Value* format = d.make(Kind::Enum);
  format->text = std::string(kMeta) + "_MEM_FORMAT_ENCODING";
  format->member = "TORCH_CONTIGUOUS_FORMAT";
  d.set(root, "format", format);
  d.set(root, "flags", d.list({d.boolean(true), d.none(), d.integer(255), d.integer(65535), d.integer(-2)}));
  d.root = root;
  return d;
}

// A canonical text of a tree (depth-bounded), to compare two readings.
std::string canon(const Value& v, int depth = 0) {
  if (depth > 16) return "...";
  std::string s = std::string(pickle::kind_name(v.kind)) + ":" + v.text + ":" + v.member + ":" +
                  std::to_string(v.integer) + ":" + std::to_string(v.real) + ":" + (v.boolean ? "T" : "F") + "[";
  for (const Value* x : v.items) s += canon(*x, depth + 1) + ",";
  s += "]{";
  for (const auto& [k, x] : v.entries) s += canon(*k, depth + 1) + "=" + canon(*x, depth + 1) + ",";
  return s + "}";
}

TEST(TorchDistMetadata, ProtocolFourIsWhatPythonsPickleReadsAndOursReadsBoth) {
  const Document d = sample();
  std::vector<std::pair<std::string, Tensor>> none;
  const std::vector<uint8_t> p2 = pickle::pickle(*d.root, none, 2), p4 = pickle::pickle(*d.root, none, 4);
  ASSERT_GE(p4.size(), 12u);
  EXPECT_EQ(p4[0], 0x80);
  EXPECT_EQ(p4[1], 4);
  EXPECT_EQ(p4[2], 0x95);  // FRAME
  EXPECT_EQ(p2[1], 2);
  EXPECT_LT(p4.size(), p2.size());  // the memoized globals
  const Document a = pickle::unpickle_distcp_metadata(p2, "p2"), b = pickle::unpickle_distcp_metadata(p4, "p4");
  EXPECT_EQ(canon(*a.root), canon(*b.root));

  mt::TempDir dir;
  const fs::path file = dir.path() / "p4.pickle";
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(p4.data()), std::streamsize(p4.size()));
  const std::string script =
      "import sys, pickle, pickletools\n"
      "sys.path.insert(0, sys.argv[1])\n"
      "import write_torch_dist\n"
      "data = open(sys.argv[2], 'rb').read()\n"
      "ops = [(o.name, a) for o, a, _ in pickletools.genops(data)]\n"
      "assert ops[0] == ('PROTO', 4), ops[0]\n"
      "frames = [a for n, a in ops if n == 'FRAME']\n"
      "assert sum(frames) + 2 + 9 * len(frames) == len(data), (frames, len(data))\n"
      "assert all(f >= 65536 for f in frames[:-1]), frames\n"
      "assert 'GLOBAL' not in [n for n, _ in ops]\n"
      "obj = pickle.loads(data)\n"
      "items = sorted(obj['storage_data'].items(), key=lambda kv: kv[0].offset[0])\n"
      "assert len(items) == 3000\n"
      "k, v = items[1234]\n"
      "assert k.fqn.endswith('weight1234') and tuple(k.offset) == (1234, 70000, 1 << 40) and k.index == 1234 % 7\n"
      "assert v.relative_path == '__2_0.distcp' and v.offset == -1234 and v.length == 617.0, vars(v)\n"
      "assert obj['long'] == 'x' * 300 and obj['flags'] == [True, None, 255, 65535, -2], obj['flags']\n"
      "print('ok', len(frames), 'frames')\n";
  std::ofstream(dir.path() / "check.py") << script;
  const auto r = mt::run_command("/usr/bin/python3 " + (dir.path() / "check.py").string() + " " +
                                 (mt::source_dir() / "tests/reference").string() + " " + file.string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ok"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron
