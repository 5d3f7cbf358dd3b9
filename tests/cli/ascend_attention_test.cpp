// The Ascend scripts' attention flags (--use-flash-attn --pre-tockens P --next-tockens N
// --shape-order SBH) with Megatron-NPU's meaning: the attention mask (causal or bidirectional)
// still applies and each query i sees only keys in [i - P, i + N]. Checked against a float64
// reference written from that definition for causal and bidirectional masks (a band beyond the
// diagonal, narrower than the mask, wider than the sequence), then in training (the seeds' full
// band trains exactly as causal attention; --pre-tockens 2 --next-tockens 0 is the sliding window
// and differs from causal) and in generation.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>

#include "cli/cli_fixture.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "model/ascend_band.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

struct Band {
  bool causal;
  int64_t pre, next;
};

// Megatron-NPU's fused attention, in double: the mask, then the band [i - pre, i + next].
std::vector<double> npu_reference(const Band& b, const std::vector<double>& qkv, int64_t s, int d) {
  std::vector<double> out(size_t(s * d), 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  for (int64_t i = 0; i < s; ++i) {
    std::vector<double> sc(size_t(s), -INFINITY);
    double mx = -INFINITY;
    for (int64_t j = 0; j < s; ++j) {
      const bool masked = b.causal && j > i;
      const bool in_band = j >= i - b.pre && j <= i + b.next;
      if (masked || !in_band) continue;
      double v = 0;
      for (int e = 0; e < d; ++e) v += qkv[size_t(i * 3 * d + e)] * qkv[size_t(j * 3 * d + d + e)];
      sc[size_t(j)] = v * scale;
      mx = std::max(mx, sc[size_t(j)]);
    }
    double se = 0;
    for (int64_t j = 0; j < s; ++j)
      if (sc[size_t(j)] > -INFINITY) se += std::exp(sc[size_t(j)] - mx);
    for (int64_t j = 0; j < s; ++j)
      if (sc[size_t(j)] > -INFINITY)
        for (int e = 0; e < d; ++e)
          out[size_t(i * d + e)] += std::exp(sc[size_t(j)] - mx) / se * qkv[size_t(j * 3 * d + 2 * d + e)];
  }
  return out;
}

TEST(AscendAttention, TheBandInsideTheMaskMatchesAFloat64Reference) {
  const int64_t S = 12;
  const int D = 8;
  const std::vector<Band> bands = {
      {true, 65536, 65536}, {true, 2, 0}, {true, 3, 5}, {true, 0, 0}, {true, 10, 0},
      {false, 2, 3}, {false, 65536, 65536}, {false, 0, 4}, {false, 11, 0}, {false, 1, 1}};
  std::vector<double> qkv(size_t(S * 3 * D));
  Philox rng(17, 0);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 2.0 * rng.uniform(i) - 1.0;
  std::vector<float> qkv_f(qkv.begin(), qkv.end());
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = double(qkv_f[i]);  // the fp32 inputs exactly
  for (const Band& b : bands) {
    model::TransformerConfig c;
    c.seq_length = int(S);
    c.max_position_embeddings = int(S);
    c.attention_mask_type = b.causal ? "causal" : "bidirectional";
    model::apply_ascend_band(c, b.pre, b.next);
    const ops::AttentionShape sh{1, S, 1, 1, D, 1.0f / std::sqrt(float(D))};
    ops::AttentionMask mask;
    mask.causal = c.causal();
    mask.window_left = c.window_left;
    mask.window_right = c.window_right;
    ops::AttentionInputs in;
    in.q = in.k = in.v = Tensor::from_vector(qkv_f, {S, 3 * D});
    in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, 1, 1, D, S);
    in.k_layout = ops::HeadLayout::qkv(ops::QkvPart::Key, 1, 1, D, S);
    in.v_layout = ops::HeadLayout::qkv(ops::QkvPart::Value, 1, 1, D, S);
    Tensor ctx = Tensor::empty({S, D}, DType::F32), lse = Tensor::empty({1, 1, S}, DType::F32);
    ops::attention_fwd(ctx, lse, Tensor(), in, mask, sh, ops::DropoutSpec{});
    const std::vector<double> ref = npu_reference(b, qkv, S, D);
    for (int64_t i = 0; i < S * D; ++i)
      EXPECT_NEAR(double(ctx.data<float>()[i]), ref[size_t(i)], 1e-5 + 1e-5 * std::abs(ref[size_t(i)]))
          << (b.causal ? "causal" : "bidirectional") << " pre " << b.pre << " next " << b.next
          << " element " << i;
  }
  model::TransformerConfig c;
  EXPECT_NE(error_of([&] { model::apply_ascend_band(c, 4, 0); }).find("need --seq-length"), std::string::npos);
  c.seq_length = 16;
  EXPECT_NE(error_of([&] { model::apply_ascend_band(c, -1, 0); }).find("must be >= 0"), std::string::npos);
}

// The lm loss of every logged iteration.
std::vector<std::string> losses(const std::string& output) {
  std::vector<std::string> out;
  const std::regex loss(R"(lm loss: ([0-9.E+-]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), loss); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

TEST(AscendAttention, TheSeedsBandTrainsAsCausalAndANarrowBandAsTheSlidingWindow) {
  const auto& f = cli_fixture();
  const std::string base =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --train-iters 3"
      " --lr 1e-2 --data-path " + f.data_prefix + " --split 98,2,0 --vocab-file " + f.vocab_file +
      " --merge-file " + f.merge_file + " --eval-iters 0 --log-interval 1 --bf16";
  const auto causal = run_cli(base + " 2>&1");
  const auto full = run_cli(base + " --use-flash-attn --pre-tockens 65536 --next-tockens 65536"
                                   " --shape-order SBH 2>&1");
  const auto narrow = run_cli(base + " --use-flash-attn --pre-tockens 2 --next-tockens 0 2>&1");
  const auto window = run_cli(base + " --window-size 2 0 2>&1");
  for (const auto* r : {&causal, &full, &narrow, &window}) ASSERT_EQ(r->exit_code, 0) << r->output;
  ASSERT_EQ(losses(causal.output).size(), 3u) << causal.output;
  EXPECT_EQ(losses(full.output), losses(causal.output));
  EXPECT_EQ(losses(narrow.output), losses(window.output));
  EXPECT_NE(losses(narrow.output), losses(causal.output));
  EXPECT_NE(full.output.find("--next-tockens 65536: the causal mask hides every key"), std::string::npos)
      << full.output;
}

// The generated records (JSON lines) of a generate run's output.
std::string results(const std::string& output) {
  std::string out;
  std::istringstream in(output);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] == '{') out += l + "\n";
  return out;
}

// Generation: the seeds' full band on a causal checkpoint is causal attention; a checkpoint trained
// with a band generates with it (given as flags or taken from the checkpoint), and a band that
// differs from the checkpoint's is refused by name.
TEST(AscendAttention, GenerationTakesTheBand) {
  const auto& f = cli_fixture();
  const std::string prompt = " --prompt 'The cat sat on the' --num-tokens-to-generate 6 --top_k 1"
                             " --return-log-probs --output-format jsonl";
  const std::string gen = "generate --load " + f.checkpoint + kFixtureModelFlags + " " +
                          f.tokenizer_flags + prompt;
  const auto plain = run_cli(gen + " 2>/dev/null");
  const auto full = run_cli(gen + " --use-flash-attn --pre-tockens 65536 --next-tockens 65536"
                                  " --shape-order SBH 2>/dev/null");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_EQ(results(full.output), results(plain.output));

  TempDir dir;
  const std::string model = " --num-layers 1 --hidden-size 16 --num-attention-heads 2"
                            " --seq-length 16 --max-position-embeddings 16";
  const auto trained = run_cli(
      "pretrain-gpt" + model + " --micro-batch-size 2 --train-iters 2 --lr 1e-2 --data-path " +
      f.data_prefix + " --split 98,2,0 " + f.tokenizer_flags + " --eval-iters 0 --save " +
      (dir / "ckpt").string() + " --save-interval 2 --pre-tockens 2 --next-tockens 0 2>&1");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string banded = "generate --load " + (dir / "ckpt").string() + " " + f.tokenizer_flags + prompt;
  const auto flags = run_cli(banded + model + " --pre-tockens 2 --next-tockens 0 2>/dev/null");
  const auto recorded = run_cli(banded + " --use-checkpoint-args 2>/dev/null");
  const auto unbanded = run_cli(banded + model + " 2>&1");
  const auto wider = run_cli(banded + model + " --pre-tockens 4 --next-tockens 0 2>&1");
  ASSERT_EQ(flags.exit_code, 0) << flags.output;
  ASSERT_EQ(recorded.exit_code, 0) << recorded.output;
  EXPECT_EQ(results(flags.output), results(recorded.output));
  EXPECT_EQ(unbanded.exit_code, 1) << unbanded.output;
  EXPECT_NE(unbanded.output.find("window"), std::string::npos) << unbanded.output;
  EXPECT_EQ(wider.exit_code, 1) << wider.output;
  EXPECT_NE(wider.output.find("--pre-tockens 4 --next-tockens 0 (window 4 0) contradicts the checkpoint, "
                              "whose window_size is 2 0"), std::string::npos) << wider.output;
}

}  // namespace
}  // namespace megatron::testing
