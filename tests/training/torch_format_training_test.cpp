// pretrain-gpt --ckpt-format torch: the trainer saves Megatron-LM's files
// (iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt and latest_checkpointed_iteration.txt, no staging
// folder left behind), Debian's torch.load reads them into Megatron's modules and optimizer
// (tests/reference/megatron_checkpoint.py check), --load of the folder resumes on the curve of the
// uninterrupted run bit for bit, and `megatron generate` reads the single-rank folder as it reads
// our format's checkpoint of the same iteration. Mpi*: the same save/resume under PP2 (np 2) and
// PP2 x DP2 with the distributed optimizer (np 4).
#include <gtest/gtest.h>

#include <sstream>

#include "parallel_test_util.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// torch.load of every rank file through the reference script: one JSON object per file.
std::vector<json> torch_check(const std::string& folder, int64_t iteration, int tp, int pp) {
  const auto r = testing::run_command(
      "/usr/bin/python3 " + (testing::source_dir() / "tests/reference/megatron_checkpoint.py").string() +
      " check " + folder + " " + std::to_string(iteration) + " " + std::to_string(tp) + " " +
      std::to_string(pp) + " 1 transformer_engine fp32 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

// Trains 4 iterations uninterrupted (our format, saved at 2 and 4), then 2 with --ckpt-format
// torch and a resume from that folder for the last 2 (save_in_format_and_resume); the files are
// Megatron's alone and the resumed run's final .pt weights are the uninterrupted run's. Returns the
// torch folder.
std::string save_and_resume(const Fixture& f, TrainingArgs a, const std::string& name) {
  const int tp = a.parallel.tensor_model_parallel_size, pp = a.parallel.pipeline_model_parallel_size;
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch", "torch", [&](const fs::path& it) {
    const fs::path save = it.parent_path();
    EXPECT_EQ(testing::read_file(save / "latest_checkpointed_iteration.txt"), "2");
    EXPECT_FALSE(fs::exists(save / ".torch_staging"));
    EXPECT_FALSE(fs::exists(it / "metadata.json"));  // Megatron's files only
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) {
        char rank[32];
        if (pp > 1)
          std::snprintf(rank, sizeof rank, "mp_rank_%02d_%03d", t, p);
        else
          std::snprintf(rank, sizeof rank, "mp_rank_%02d", t);
        EXPECT_TRUE(fs::exists(it / rank / kTorchCheckpointFile)) << rank;
      }
  });
  if (world()->rank() == 0) {  // the resumed run's final .pt weights are the uninterrupted run's
    const auto torch_ckpt = find_checkpoint(r.saved.save, std::nullopt);
    EXPECT_TRUE(torch_ckpt.has_value() && torch_ckpt->format == "torch");
    expect_same_merged_model(r.saved.save, f.dir / (name + "_full"), 4);
  }
  world()->barrier();
  return r.saved.save;
}

TEST(TorchFormatTraining, SavesMegatronFilesThatTorchLoadsAndResumesOnTheSameCurve) {
  Fixture f;
  const std::string torch_dir = save_and_resume(f, f.args(4), "single");
  const std::vector<json> ranks = torch_check(torch_dir, 2, 1, 1);
  ASSERT_EQ(ranks.size(), 1u);
  const json& r = ranks[0];
  EXPECT_EQ(r["rank"], "mp_rank_00");
  EXPECT_EQ(r["iteration"], 2);
  EXPECT_EQ(r["args"]["iteration"], 2);
  EXPECT_EQ(r["args"]["consumed_train_samples"], 16);
  EXPECT_EQ(r["args"]["num_layers"], 2);
  EXPECT_EQ(r["steps"], json::array({2.0}));  // Adam's step count in every parameter's state
  EXPECT_EQ(r["rng_equal"], json::array({true, true, true}));
  for (const char* key : {"args", "checkpoint_version", "iteration", "model", "optimizer",
                          "opt_param_scheduler", "rng_state"})
    EXPECT_NE(std::find(r["keys"].begin(), r["keys"].end(), key), r["keys"].end()) << key;

  // `generate` reads the single-rank .pt folder: the same log-probs as our format's iteration 2
  // of the uninterrupted run.
  const std::string flags =
      " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 16"
      " --tokenizer-type NullTokenizer --vocab-size 64 --make-vocab-size-divisible-by 16"
      " --prompt '1 2 3 4 5' --num-tokens-to-generate 3 --top_k 1 --return-log-probs"
      " --output-format jsonl 2>&1";
  const auto ours = testing::run_cli("generate --load " + (f.dir / "single_full") + " --ckpt-step 2" + flags);
  const auto theirs = testing::run_cli("generate --load " + torch_dir + " --ckpt-step 2" + flags);
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  auto results = [](const std::string& out) {
    std::string r, line;
    std::istringstream in(out);
    while (std::getline(in, line))
      if (line.starts_with("{")) r += line + "\n";
    return r;
  };
  EXPECT_NE(results(ours.output).find("logprobs"), std::string::npos) << ours.output;
  EXPECT_EQ(results(theirs.output), results(ours.output));
}

TEST(MpiTorchFormatTraining, PipelineParallelSaveAndResume) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (PP2) and 4 (PP2 x DP2, distributed optimizer)";
  Fixture f;
  TrainingArgs a = f.args(4);
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.use_distributed_optimizer = W == 4;
  const std::string torch_dir = save_and_resume(f, a, "pp2");
  if (world()->rank() == 0) {
    const std::vector<json> ranks = torch_check(torch_dir, 2, 1, 2);
    ASSERT_EQ(ranks.size(), 2u);
    for (const json& r : ranks) {
      EXPECT_EQ(r["iteration"], 2) << r.dump();
      EXPECT_EQ(r["args"]["pipeline_model_parallel_size"], 2) << r.dump();
    }
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
