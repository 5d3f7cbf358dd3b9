// The index cache is readable by NumPy and its name is the MD5 Python computes over
// json.dumps(description, indent=4); NumPy-written .npy files load here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::run_command;
using megatron::testing::TempDir;

TEST(NpyInterop, CacheFilesLoadInNumpyAndHashMatchesPython) {
  TempDir dir;
  auto prefix = (dir / "d").string();
  {
    IndexedDatasetBuilder b(prefix, IndexDType::U16);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> t(size_t(3 + d % 11), d + 1);
      b.add_item(t);
      b.end_document();
    }
    b.finalize();
  }
  auto data = std::make_shared<const IndexedDataset>(prefix);
  GPTDatasetOptions o;
  o.seq_length = 8;
  o.split = "949,50,1";
  o.split_matrix = split_matrix(parse_split(o.split));
  o.data_cache_path = (dir / "cache").string();
  o.tokenizer = "GPT2BPETokenizer";
  GPTDataset ds(data, Split::Train, {0, 38}, 30, o);
  std::string script =
      "import json, hashlib, numpy, sys\n"
      "d = json.loads(open(sys.argv[1]).read())\n"
      "print(hashlib.md5(json.dumps(d, indent=4).encode('utf-8')).hexdigest())\n"
      "for s in ['document_index', 'sample_index', 'shuffle_index']:\n"
      "    a = numpy.load(sys.argv[2] + s + '.npy', mmap_mode='r')\n"
      "    print(json.dumps({'dtype': str(a.dtype), 'shape': list(a.shape), 'v': a.reshape(-1).tolist()}))\n";
  megatron::testing::write_file(dir / "check.py", script);
  auto base = ds.cache_file("");
  auto r = run_command("/usr/bin/python3 '" + (dir / "check.py").string() + "' '" + ds.cache_file("description.txt") +
                       "' '" + base + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream is(r.output);
  std::string line;
  std::getline(is, line);
  EXPECT_EQ(line, ds.description_hash());
  const auto& I = ds.indices();
  std::vector<std::vector<int64_t>> expect = {
      std::vector<int64_t>(I.document_index.begin(), I.document_index.end()), I.sample_index, I.shuffle_index};
  const char* dtypes[3] = {"int32", "int32", "uint32"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(std::getline(is, line));
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["dtype"], dtypes[i]);
    EXPECT_EQ(j["v"].get<std::vector<int64_t>>(), expect[size_t(i)]);
  }
}

TEST(NpyInterop, ReadsNumpyWrittenArrays) {
  TempDir dir;
  auto r = run_command("/usr/bin/python3 -c \"import numpy; numpy.save('" + (dir / "a.npy").string() +
                       "', numpy.arange(-3, 9, dtype=numpy.int64).reshape(4, 3)); numpy.save('" +
                       (dir / "b.npy").string() + "', numpy.arange(5, dtype=numpy.float32))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = read_npy((dir / "a.npy").string());
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(a.values.front(), -3);
  EXPECT_EQ(a.values.back(), 8);
  EXPECT_THROW(read_npy((dir / "b.npy").string()), megatron::Error);
  EXPECT_THROW(read_npy((dir / "missing.npy").string()), megatron::Error);
}
