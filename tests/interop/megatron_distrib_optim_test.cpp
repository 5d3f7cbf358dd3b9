// Megatron-LM's distributed optimizer in --ckpt-format torch checkpoints
// (training/torch_distrib_optim.h) against files written by Debian's torch from Megatron's
// definitions (tests/reference/megatron_distrib_optim.py: DistributedOptimizer.state_dict in
// model_optim_rng.pt, get_parameter_state_dp_zero's distrib_optim.pt laid out as
// param_and_grad_buffer.py lays out the gradient buffer): the local and Transformer Engine layer
// specs, one bucket and several (--overlap-grad-reduce with a small --ddp-bucket-size), the tied
// embedding's own bucket under PP2, fp32 / bf16 / fp16, and the per-bucket form of releases before
// Megatron-Core 0.8 (NaN past each bucket's unpadded elements). Every Adam moment, fp32 main weight and the
// step read back bit for bit; `checkpoint convert --save-format torch --use-distributed-optimizer`
// writes files the reference loads (keys, dtype key, bucket sizes, every parameter's values, zeros
// in the gaps) under another TP x PP too, and reads back bit for bit; missing, mismatched and
// truncated files are errors naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/safetensors.h"
#include "interop/checkpoint_test_util.h"
#include "json_lines.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

using interop_testing::everything;
using interop_testing::expect_bit_equal;

std::string script() { return (mt::source_dir() / "tests/reference/megatron_distrib_optim.py").string(); }

const fs::path& variants() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    const auto r = mt::run_command("/usr/bin/python3 " + script() + " make " + dir.path().string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    made = true;
  }
  return dir.path();
}

struct Variant {
  std::string name, impl, dtype;
  int tp, pp;
};
const std::vector<Variant> kVariants = {
    {"dense_dp2_bf16", "local", "bf16", 1, 1},
    {"dense_tp2pp2_dp2_fp32", "local", "fp32", 2, 2},
    {"dense_te_pp2_dp2_fp16", "transformer_engine", "fp16", 1, 2},
    {"dense_per_bucket_tp2_dp2_bf16", "local", "bf16", 2, 1},  // the form before buckets_coalesced
};

std::map<std::string, Tensor> reference(const std::string& name) {
  return read_safetensors(variants() / name / "reference.safetensors").tensors;
}

CheckpointOnDisk open(const fs::path& dir) {
  auto c = find_checkpoint(dir, std::nullopt);
  EXPECT_TRUE(c.has_value()) << dir;
  return *c;
}

TEST(MegatronDistribOptim, EveryVariantReadsBitForBit) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const CheckpointOnDisk c = open(variants() / v.name / "megatron");
    EXPECT_EQ(c.state.optimizer_type, "adam");
    EXPECT_EQ(c.parallel.tensor_model_parallel_size, v.tp);
    EXPECT_EQ(c.parallel.pipeline_model_parallel_size, v.pp);
    if (v.dtype == "fp16") {
      EXPECT_EQ(c.state.grad_scaler.scale, 512.0);
    }
    const MergedCheckpoint m = merge_checkpoint(c, true);
    EXPECT_EQ(m.optimizer_step, 7);
    expect_bit_equal(everything(m), reference(v.name), v.name);
  }
}

// Our files through the reference: one JSON line per rank, or the assertion that failed.
std::vector<json> check(const fs::path& dir, const Variant& v, int tp, int pp) {
  const auto r = mt::run_command("/usr/bin/python3 " + script() + " check " + dir.string() + " 7 " +
                                 std::to_string(tp) + " " + std::to_string(pp) + " " + v.dtype + " " +
                                 (variants() / v.name / "reference.safetensors").string() + " " + v.impl + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out = mt::json_lines(r.output);
  return out;
}

TEST(MegatronDistribOptim, ConvertWritesWhatMegatronLoadsUnderAnyLayout) {
  mt::TempDir tmp;
  struct Target {
    size_t variant;
    int tp, pp;
  };
  // The saving layouts, and others (TP2 x PP2 from one rank, one rank from TP2 x PP2).
  for (const Target& tg : std::vector<Target>{{0, 1, 1}, {1, 2, 2}, {2, 1, 2}, {0, 2, 2}, {1, 1, 1}}) {
    const Variant& v = kVariants[tg.variant];
    SCOPED_TRACE(v.name + " -> TP" + std::to_string(tg.tp) + " x PP" + std::to_string(tg.pp));
    const fs::path out = tmp.path() / (v.name + std::to_string(tg.tp) + std::to_string(tg.pp));
    const auto r = mt::run_cli("checkpoint convert --load " + (variants() / v.name / "megatron").string() +
                               " --save " + out.string() + " --save-format torch --use-distributed-optimizer"
                               " --transformer-impl " + v.impl + " --target-tensor-parallel-size " +
                               std::to_string(tg.tp) + " --target-pipeline-parallel-size " + std::to_string(tg.pp));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("distrib_optim.pt"), std::string::npos) << r.output;
    const std::vector<json> ranks = check(out, v, tg.tp, tg.pp);
    ASSERT_EQ(ranks.size(), size_t(tg.tp * tg.pp));
    for (const json& j : ranks) {
      EXPECT_EQ(j["steps"], json::array({7})) << j.dump();
      // --overlap-grad-reduce with --ddp-bucket-size 3000 splits the first stage into buckets.
      if (v.name == "dense_tp2pp2_dp2_fp32" && tg.pp == 2 && j["rank"].get<std::string>().ends_with("_000")) {
        EXPECT_EQ(j["buckets"], json::array({4224, 4544, 3840, 1728, 1024})) << j.dump();
      }
    }
    const MergedCheckpoint back = merge_checkpoint(open(out), true);
    expect_bit_equal(everything(back), reference(v.name), v.name + " read back");
  }
}

void copy_tree(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

std::string merge_error(const fs::path& dir) {
  try {
    merge_checkpoint(open(dir), true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MegatronDistribOptim, MissingMismatchedAndTruncatedFilesAreErrors) {
  mt::TempDir tmp;
  const fs::path src = variants() / "dense_tp2pp2_dp2_fp32" / "megatron";
  const std::string it = "iter_0000007";
  {  // a rank's distrib_optim.pt missing
    const fs::path d = tmp.path() / "missing";
    copy_tree(src, d);
    fs::remove(d / it / "mp_rank_01_001" / "distrib_optim.pt");
    const std::string e = merge_error(d);
    EXPECT_NE(e.find("mp_rank_01_001/distrib_optim.pt is missing"), std::string::npos) << e;
    EXPECT_NE(e.find("--no-load-optim"), std::string::npos) << e;
    // Without the optimizer the weights load.
    EXPECT_NO_THROW(merge_checkpoint(open(d), false));
  }
  {  // another stage's buffer
    const fs::path d = tmp.path() / "swapped";
    copy_tree(src, d);
    fs::copy_file(d / it / "mp_rank_00_000" / "distrib_optim.pt", d / it / "mp_rank_00_001" / "distrib_optim.pt",
                  fs::copy_options::overwrite_existing);
    const std::string e = merge_error(d);
    EXPECT_NE(e.find("mp_rank_00_001/distrib_optim.pt"), std::string::npos) << e;
    EXPECT_NE(e.find("14432 elements"), std::string::npos) << e;
  }
  {  // truncated
    const fs::path d = tmp.path() / "truncated";
    copy_tree(src, d);
    const fs::path f = d / it / "mp_rank_00_000" / "distrib_optim.pt";
    fs::resize_file(f, fs::file_size(f) / 2);
    const std::string e = merge_error(d);
    EXPECT_NE(e.find("mp_rank_00_000/distrib_optim.pt"), std::string::npos) << e;
  }
  {  // --use-distributed-optimizer names Megatron's .pt files only
    const auto r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " +
                               (tmp.path() / "x").string() + " --use-distributed-optimizer");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("--save-format torch"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace megatron::training
