// Hugging Face export of checkpoints trained across ranks (TP2 x PP2 at np 4, TP2 at np 2): the
// tiny GPT-2 and Llama-style models (GQA, SwiGLU, RMSNorm, rotary, untied) are trained a few
// iterations by pretrain_gpt under that layout, and each parallel checkpoint is exported as it is
// by `megatron checkpoint convert --save-format hf`, in fp32 and with --target-params-dtype bf16
// and fp16. The independent PyTorch reader (tests/interop/hf_reference.py, written from
// transformers' modelling code) gives the fp32 folders' log-probs of prompt + greedy continuation
// equal to those of `megatron generate` on the same parallel checkpoint within 1e-4; the bf16 and
// fp16 folders hold exactly the fp32 weights rounded to their type (checked tensor by tensor by
// the reader) and their log-probs stay within what that rounding moves them: 5e-3 for bf16 (8
// significant bits) and 6e-4 for fp16 (11 bits, 8x finer); measured 1.1e-3 and 1.0e-4
// (MG_PRINT_PARAM_DIFF=1 prints them), against 2e-7 for fp32.
// Exports of one-rank checkpoints resharded to TP2 x PP2, round trips and errors are in
// tests/interop/hf_checkpoint_test.cpp.
#include <gtest/gtest.h>

#include "interop/hf_reference_util.h"
#include "model/model_test_util.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;
namespace mt = megatron::testing;

TEST(MpiHfExport, ModelsTrainedUnderTp2Pp2ExportToTheReference) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int tp = 2, pp = world()->size() / 2;
  const std::vector<std::string> types = {"gpt2", "llama"};
  for (const std::string& type : types) {
    TrainingArgs a = f.args(4);
    if (type == "llama") model::testing::make_llama_style(a.model);
    a.eval_interval = 1000;
    a.parallel.tensor_model_parallel_size = tp;
    a.parallel.pipeline_model_parallel_size = pp;
    a.save = f.dir / type;
    a.save_interval = 1000;
    const TrainingSummary s = pretrain(a);
    ASSERT_EQ(s.losses.size(), 4u);
  }
  if (world()->rank() == 0) {
    std::map<std::string, std::vector<json>> gen;
    std::vector<fs::path> folders;
    std::vector<std::pair<fs::path, fs::path>> rounding;
    for (const std::string& type : types) {
      const fs::path ckpt = f.dir / type;
      // The checkpoint is the parallel one: one folder per TP x PP rank.
      const std::string last = pp > 1 ? "mp_rank_01_001" : "mp_rank_01";
      ASSERT_TRUE(fs::exists(ckpt / "iter_0000004" / last / "model.safetensors")) << ckpt;
      for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
        const fs::path hf = f.dir / (type + "_hf_" + dtype);
        const auto r = mt::run_cli("checkpoint convert --load " + ckpt.string() + " --save " + hf.string() +
                                   " --save-format hf --target-params-dtype " + dtype);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const json config = json::parse(mt::read_file(hf / "config.json"));
        EXPECT_EQ(config["model_type"], type);
        EXPECT_EQ(config["torch_dtype"], dtype == "fp32" ? "float32" : dtype == "bf16" ? "bfloat16" : "float16");
        folders.push_back(hf);
        if (dtype != "fp32") rounding.emplace_back(f.dir / (type + "_hf_fp32"), hf);
      }
      gen[type] = hf_test::generate(ckpt);
      ASSERT_EQ(gen[type].size(), hf_test::kPrompts.size());
    }
    // One reference process scores every model's sequences in every folder; each folder is
    // compared on its own model's sequences.
    std::vector<json> all = gen["gpt2"];
    all.insert(all.end(), gen["llama"].begin(), gen["llama"].end());
    const hf_test::Reference ref = hf_test::reference(folders, all, f.dir.path(), rounding);
    const size_t n = hf_test::kPrompts.size();
    for (size_t m = 0; m < types.size(); ++m) {
      const std::string& type = types[m];
      const size_t tensors = type == "gpt2" ? 2 + 12 * 2 + 2 : 1 + 9 * 4 + 2;
      for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
        const std::string hf = (f.dir.path() / (type + "_hf_" + dtype)).string();
        ASSERT_TRUE(ref.logprobs.count(hf)) << hf;
        const auto& lp = ref.logprobs.at(hf);
        const std::vector<std::vector<double>> own(lp.begin() + long(m * n), lp.begin() + long((m + 1) * n));
        const double tol = dtype == "fp32" ? 1e-4 : dtype == "bf16" ? 5e-3 : 6e-4;
        hf_test::expect_logprobs(gen[type], own, tol, type + " " + dtype);
        if (std::getenv("MG_PRINT_PARAM_DIFF"))  // the numbers behind the tolerances
          std::printf("%s %s: worst log-prob difference %.3g\n", type.c_str(), dtype.c_str(),
                      hf_test::worst_logprob_difference(gen[type], own));
        if (dtype != "fp32") {
          EXPECT_EQ(ref.rounded.count(hf) ? ref.rounded.at(hf) : -1, int64_t(tensors)) << hf;
        }
      }
    }
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
