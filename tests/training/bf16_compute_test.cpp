// --bf16 computes in bf16 on the CPU (as Megatron does on GPUs): the linear layers and the output
// layer multiply their bf16 weights with activations rounded to bf16, accumulating in fp32; norms'
// statistics, softmax, the loss and the gradients stay fp32, and the optimizer keeps fp32 main
// weights. Trained on one rank for 20 iterations (the Llama model of llama_test_util.h and the
// GPT of parallel_test_util.h), the bf16 run follows the fp32 curve within bf16 tolerance, and the
// bf16 model holds no fp32 copies of the weights it reads as stored. The training log names the
// CPU kernels, and says when --fp16 computes in fp32.
#include <gtest/gtest.h>

#include <cmath>

#include "data/indexed_dataset.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "llama_test_util.h"
#include "model/gpt_model.h"
#include "test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// Relative difference of the bf16 curve from the fp32 one (losses and validation losses), and of
// the grad norms, allowed: a few times the largest measured over both models on x86-64 (loss
// 6.7e-5 Llama, 8.6e-5 GPT; grad norm 1.5e-3, 2.5e-3). The half-precision parity tests compare
// layouts at one precision; here the products themselves differ (bf16-rounded inputs).
constexpr double kLossTolerance = 5e-4, kGradNormTolerance = 2e-2;

void expect_follows(const TrainingSummary& bf16, const TrainingSummary& fp32, const char* what) {
  ASSERT_EQ(bf16.losses.size(), fp32.losses.size()) << what;
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    worst = std::max(worst, std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
    worst_norm = std::max(worst_norm, std::abs(bf16.grad_norms[i] - fp32.grad_norms[i]) /
                                          fp32.grad_norms[i]);
  }
  ASSERT_EQ(bf16.valid_losses.size(), fp32.valid_losses.size()) << what;
  for (size_t i = 0; i < fp32.valid_losses.size(); ++i)
    worst = std::max(worst, std::abs(bf16.valid_losses[i] - fp32.valid_losses[i]) /
                                fp32.valid_losses[i]);
  std::printf("%s: bf16 against fp32: loss %.3g, grad norm %.3g (relative, worst iteration)\n",
              what, worst, worst_norm);
  EXPECT_LE(worst, kLossTolerance) << what;
  EXPECT_LE(worst_norm, kGradNormTolerance) << what;
  EXPECT_GT(worst, 0.0) << what << ": bf16 products cannot give the fp32 curve exactly";
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.3) << what << ": it learns";
}

TEST(Bf16Training, FollowsTheFp32Curve) {
  Fixture f;
  for (const bool llama : {true, false}) {
    const char* what = llama ? "llama" : "gpt";
    TrainingArgs a = llama ? llama_args(f) : f.args();
    const TrainingSummary fp32 = run_single(a);
    a.bf16 = true;
    const TrainingSummary bf16 = run_single(a);
    expect_follows(bf16, fp32, what);
  }
}

TEST(Bf16Training, LinearWeightsHaveNoFp32Copies) {
  ASSERT_TRUE(ops::gemm_computes_in(DType::BF16, Device::cpu()));
  model::TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.padded_vocab_size = 64;
  c.max_position_embeddings = 16;
  c.seq_length = 16;
  c.params_dtype = DType::BF16;
  model::GPTModel m(c, 7);
  // The bf16 values, plus fp32 working copies of all but the linear layers' weights (QKV,
  // projection, fc1 and fc2 of both layers) and the word table (looked up and, tied, multiplied
  // as stored): the position table, norms and biases keep theirs.
  size_t want = 0;
  int linear = 0;
  for (model::Parameter* p : m.parameters()) {
    ASSERT_EQ(p->value.dtype(), DType::BF16) << p->name;
    want += p->value.nbytes();
    const bool linear_weight = p->name.find(".linear_") != std::string::npos &&
                               p->name.ends_with(".weight");
    linear += linear_weight;
    if (!linear_weight && p->name != "embedding.word_embeddings.weight")
      want += size_t(p->value.numel()) * sizeof(float);
  }
  EXPECT_EQ(linear, 2 * 4);
  EXPECT_EQ(m.weight_bytes(), want);
}

// The training log names the CPU kernels picked at start-up, and --fp16 on a CPU without fp16
// products says in one line that it computes in fp32 (--bf16 and fp32 say nothing of it).
TEST(Bf16Training, StartUpLogNamesTheKernelsAndTheFp16Note) {
  const megatron::testing::TempDir dir;
  const std::string prefix = (dir / "corpus").string();
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < 20; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 30; ++i) doc.push_back((d + i * 3) % 63);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
  const std::string note = "note: --fp16 computes in fp32 on this CPU";
  const bool fp16_products = ops::gemm_computes_in(DType::F16, Device::cpu());
  for (const char* precision : {"", "--bf16", "--fp16"}) {
    const megatron::testing::CommandResult r = megatron::testing::run_cli(
        std::string("pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
                    "--seq-length 16 --max-position-embeddings 16 --tokenizer-type NullTokenizer "
                    "--vocab-size 64 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 "
                    "--train-iters 1 --split 1 --eval-iters 0 --data-path ") +
        prefix + " " + precision);
    ASSERT_EQ(r.exit_code, 0) << precision << "\n" << r.output;
    EXPECT_NE(r.output.find(ops::cpu::cpu_kernel_summary()), std::string::npos)
        << precision << "\n" << r.output;
    const bool want_note = std::string(precision) == "--fp16" && !fp16_products;
    EXPECT_EQ(r.output.find(note) != std::string::npos, want_note) << precision << "\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron::training
