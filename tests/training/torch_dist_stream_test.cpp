// Streaming reads of torch_dist checkpoints (training/torch_dist_stream.h): regions of a tensor at
// any offsets (across chunk boundaries, one layer of a stacked key, either half of SwiGLU's gate/up
// pair) equal the same part of the assembled tensor of Megatron's layout (tests/reference/
// write_torch_dist.py, saved under TP2 x PP2); a region reads only the chunks it intersects (a
// corrupted chunk elsewhere goes unnoticed, the corrupted one is refused by its CRC-32); and a run
// that loads a torch_dist checkpoint holds its weights about once (peak resident memory of
// `megatron generate --load` against the same command on a tiny model).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/zip_archive.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/torch_dist_checkpoint.h"
#include "training/torch_dist_stream.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using training::DistcpFolder;

const fs::path& fixtures() {
  static mt::TempDir dir;
  static const bool made = [] {
    const auto r = mt::run_command("/usr/bin/python3 " +
                                   (mt::source_dir() / "tests/reference/write_torch_dist.py").string() + " make " +
                                   dir.path().string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return true;
  }();
  (void)made;
  return dir.path();
}

fs::path iteration_dir(const std::string& name) { return fixtures() / name / "iter_0000007"; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), size_t(x.numel()) * dtype_size(x.dtype())) == 0;
}

// The part of `full` at offsets with sizes.
Tensor part_of(const Tensor& full, const Shape& offsets, const Shape& sizes) {
  Tensor t = full;
  for (size_t d = 0; d < sizes.size(); ++d) t = t.narrow(int(d), offsets[d], sizes[d]);
  return t;
}

TEST(TorchDistStream, RegionsEqualThePartsOfTheAssembledTensor) {
  std::mt19937 rng(7);
  int regions = 0, across = 0;
  for (const std::string name : {"gpt2", "llama", "llama_layers"}) {
    const DistcpFolder f = DistcpFolder::open(iteration_dir(name));
    for (const auto& [key, e] : f.entries()) {
      if (e.is_bytes) continue;
      const Tensor full = f.tensor(key);
      for (int k = 0; k < 6; ++k) {
        Shape offsets(e.size.size()), sizes(e.size.size());
        for (size_t d = 0; d < e.size.size(); ++d) {
          offsets[d] = std::uniform_int_distribution<int64_t>(0, e.size[d])(rng);
          sizes[d] = std::uniform_int_distribution<int64_t>(0, e.size[d] - offsets[d])(rng);
        }
        int met = 0;
        for (const training::DistcpChunk& c : e.chunks) {
          bool meets = true;
          for (size_t d = 0; d < e.size.size(); ++d)
            meets = meets && std::max(offsets[d], c.offsets[d]) < std::min(offsets[d] + sizes[d], c.offsets[d] + c.sizes[d]);
          met += meets ? 1 : 0;
        }
        across += met > 1 ? 1 : 0;
        Tensor got = Tensor::full(sizes, -7.0, e.dtype);
        training::read_distcp_region(f, key, offsets, got);
        EXPECT_TRUE(same_bytes(got, part_of(full, offsets, sizes))) << name << " " << key << " at "
                                                                     << shape_str(offsets) << " size " << shape_str(sizes);
        ++regions;
      }
      if (e.size.size() >= 2 && key.starts_with("decoder.layers.") && e.size[0] > 1) {  // one layer of a stacked key
        Shape offsets(e.size.size() - 1, 0), sizes(e.size.begin() + 1, e.size.end());
        offsets[0] = sizes[0] / 4;
        sizes[0] -= offsets[0];
        Tensor got = Tensor::empty(sizes, e.dtype);
        training::read_distcp_region(f, key, offsets, got, {e.size[0] - 1});
        EXPECT_TRUE(same_bytes(got, part_of(full.select(0, e.size[0] - 1), offsets, sizes))) << name << " " << key;
      }
    }
  }
  EXPECT_GT(regions, 100);
  EXPECT_GT(across, 20);  // regions that take parts of several chunks
}

TEST(TorchDistStream, GatedPairsAndLayersReadAsOursEqualTheMergedRead) {
  // llama_layers saves fc1 as "_w" (gate) and "_v" (up) keys: every source read whole equals the
  // merged read of the same checkpoint, and a source's rows across the gate/up boundary are the
  // rows of [gate; up].
  const auto ckpt = training::find_checkpoint(fixtures() / "llama_layers", std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  const DistcpFolder f = DistcpFolder::open(ckpt->dir);
  const auto merged = training::read_torch_dist_model(*ckpt);
  int gated = 0;
  for (const auto& [ours, source] : training::torch_dist_sources(*ckpt, f)) {
    ASSERT_TRUE(merged.count(ours)) << ours;
    const Tensor whole = training::read_source(f, "", source);
    EXPECT_TRUE(same_bytes(whole, merged.at(ours))) << ours;
    if (f.has(source.key)) continue;
    ++gated;
    const int64_t rows = whole.size(0);
    training::CheckpointRank rank;
    std::map<std::string, Tensor> shards;
    for (int r = 0; r < 2; ++r) {  // TP2 shards of [gate; up]: rows r of each half
      rank.tp_rank = r;
      rank.tp_size = 2;
      training::stream_torch_dist_shards(*ckpt, {{ours, {}}}, rank, "", false,
                                         [&](const std::string&, const Tensor& t) { shards[std::to_string(r)] = t; });
      const Tensor want_gate = whole.narrow(0, r * rows / 4, rows / 4), want_up = whole.narrow(0, rows / 2 + r * rows / 4, rows / 4);
      ASSERT_TRUE(shards.count(std::to_string(r)));
      const Tensor& s = shards.at(std::to_string(r));
      EXPECT_TRUE(same_bytes(s.narrow(0, 0, rows / 4), want_gate)) << ours << " rank " << r;
      EXPECT_TRUE(same_bytes(s.narrow(0, rows / 4, rows / 4), want_up)) << ours << " rank " << r;
    }
  }
  EXPECT_GT(gated, 0);
}

// The byte offset of chunk `c`'s storage (its archive's data/<key> record) in its file.
uint64_t storage_offset(const fs::path& dir, const training::DistcpChunk& c) {
  const std::string bytes = mt::read_file(dir / c.item.file);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + c.item.offset;
  const ZipReader zip = ZipReader::from_memory(std::span<const uint8_t>(p, c.item.length), "item");
  for (const ZipEntry& z : zip.entries())
    if (z.name.find("/data/") != std::string::npos && z.size > 0) return c.item.offset + z.data_offset;
  ADD_FAILURE() << "no storage record";
  return 0;
}

TEST(TorchDistStream, ReadsOnlyTheChunksARegionMeets) {
  mt::TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  fs::copy(iteration_dir("gpt2"), dir);
  const std::string key = "embedding.word_embeddings.weight";  // TP chunks along the rows
  const DistcpFolder before = DistcpFolder::open(dir);
  const Tensor full = before.tensor(key);
  const training::DistcpEntry& e = before.entry(key);
  ASSERT_EQ(e.chunks.size(), 2u);
  const training::DistcpChunk& second = e.chunks[0].offsets[0] == 0 ? e.chunks[1] : e.chunks[0];
  {  // one byte of the second chunk's storage flipped
    std::fstream io(dir / second.item.file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(storage_offset(dir, second) + 5));
    char b = 0;
    io.read(&b, 1);
    b = char(b ^ 0x40);
    io.seekp(std::streamoff(storage_offset(dir, second) + 5));
    io.write(&b, 1);
  }
  const DistcpFolder f = DistcpFolder::open(dir);
  const int64_t first_rows = second.offsets[0], H = e.size[1];
  Tensor got = Tensor::empty({first_rows - 2, H}, e.dtype);
  training::read_distcp_region(f, key, {1, 0}, got);  // inside the first chunk: read
  EXPECT_TRUE(same_bytes(got, full.narrow(0, 1, first_rows - 2)));
  Tensor across = Tensor::empty({4, H}, e.dtype);
  const std::string err = mt::error_of([&] { training::read_distcp_region(f, key, {first_rows - 2, 0}, across); });
  EXPECT_NE(err.find("CRC-32"), std::string::npos) << err;
  EXPECT_NE(err.find(second.item.file), std::string::npos) << err;
  Tensor outside = Tensor::empty({2, H}, e.dtype);
  const std::string err2 = mt::error_of([&] { training::read_distcp_region(f, key, {e.size[0] - 1, 0}, outside); });
  EXPECT_NE(err2.find("lies outside"), std::string::npos) << err2;
}

// Peak resident memory (KB) of one run of the CLI.
long peak_kb(const std::vector<std::string>& args) {
  const std::string cli = mt::cli_path().string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(cli.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(cli.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  rusage ru{};
  EXPECT_EQ(::wait4(pid, &status, 0, &ru), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return ru.ru_maxrss;
}

TEST(TorchDistStream, ARunThatLoadsHoldsTheWeightsAboutOnce) {
  mt::TempDir tmp;
  // A model whose weights (about 95 MB, mostly the word embedding) dwarf everything else a
  // generation step allocates.
  auto train = [&](const std::string& out, int vocab, int hidden) {
    const auto r = mt::run_cli(str("pretrain-gpt --num-layers 1 --hidden-size ", hidden,
                                   " --num-attention-heads 8 --seq-length 16 --max-position-embeddings 16 "
                                   "--micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 --mock-data "
                                   "--tokenizer-type NullTokenizer --vocab-size ", vocab, " --save ",
                                   (tmp.path() / out).string(), " --save-interval 1 --eval-iters 0 --ckpt-format torch_dist"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  };
  train("big", 40000, 512);
  train("tiny", 4096, 64);
  const auto ckpt = training::find_checkpoint(tmp.path() / "big", std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  int64_t weights = 0;
  for (const auto& [name, shape] : training::torch_dist_model_shapes(*ckpt)) weights += shape_numel(shape) * 4;
  ASSERT_GT(weights, 80'000'000);
  auto gen = [&](const std::string& which, int vocab) {
    return peak_kb({"generate", "--load", (tmp.path() / which).string(), "--use-checkpoint-args", "--tokenizer-type",
                    "NullTokenizer", "--vocab-size", std::to_string(vocab), "--prompt", "1 2 3",
                    "--tokens-to-generate", "1"});
  };
  const long base = gen("tiny", 4096), big = gen("big", 40000);
  const double extra = double(big - base) * 1024;
  // Reading the whole model before copying it into the parameters costs about 2 x the weights.
  EXPECT_LT(extra, 1.5 * double(weights)) << "peak " << big << " KB, base " << base << " KB, weights " << weights;
  EXPECT_GT(extra, 0.9 * double(weights)) << "peak " << big << " KB, base " << base << " KB, weights " << weights;
}

}  // namespace
}  // namespace megatron
