// Context parallelism of the GPT model by parity with the single-rank model. Tests named Mpi* run
// as plain processes (world of one: CP = 1) and under mpirun -np 2 / -np 4 (label mpi): the
// context-parallel group is the whole world (CP = 2, 4) and, at -np 4, also CP = 2 x TP = 2
// groups of a ParallelState (with and without sequence parallelism). Every rank builds the
// single-rank model with the same weights and runs the whole batch; the CP model gets this rank's
// zig-zag slice, with either key/value exchange (the ring of --cp-comm-type p2p and the
// all-gather). Loss sums and token counts summed over the CP group, and every parameter
// gradient summed over the CP group (and gathered from the TP shards) agree with the single-rank
// ones within 1e-5 of the tensor's scale: plain causal and with document resets
// (--reset-attention-mask / --reset-position-ids), an uneven loss mask, recomputation, dropout
// (masks are indexed by position in the unsplit tensors, so they equal the single-rank model's),
// sliding windows, ALiBi, and bidirectional attention with a key padding mask.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/parallel_state.h"
#include "core/error.h"
#include "model/bert_model.h"
#include "model/context_parallel.h"
#include "model/gpt_model.h"
#include "model/tensor_parallel.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

std::shared_ptr<Communicator> world() { return world_communicator(); }

struct Groups {
  std::shared_ptr<Communicator> tp, cp;
  std::string name;
};

// The layouts to test on this world: CP over the whole world and, at 4 ranks, TP 2 x CP 2.
std::vector<Groups> cp_layouts() {
  auto w = world();
  std::vector<Groups> out = {{TensorParallel::none().group, w, "CP" + std::to_string(w->size())}};
  if (w->size() == 4) {
    ParallelConfig pc;
    pc.tensor_model_parallel_size = 2;
    pc.context_parallel_size = 2;
    static ParallelState ps = ParallelState::create(w, pc);
    out.push_back({ps.group_ptr(GroupKind::TP), ps.group_ptr(GroupKind::CP), "TP2xCP2"});
  }
  return out;
}

double rel_diff(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  if (got.shape() != ref.shape()) return 1e30;
  const std::vector<float> a = got.to_float_vector(), b = ref.to_float_vector();
  double scale = 1e-30, worst = 0;
  for (float v : b) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst / scale;
}

double sum_over(Communicator& g, double v) {
  Tensor t = Tensor::full({1}, v, DType::F64);
  g.all_reduce(t);
  return t.item_as_double(0);
}

struct Result {
  LossResult loss, eval;
  std::vector<Tensor> grads;  // whole gradients: summed over CP, gathered over TP
};

Result run(GPTModel& m, const Groups& g, const Batch& whole, uint64_t offset) {
  const Batch in = slice_for_context_parallel(whole, g.cp->rank(), g.cp->size());
  testing::zero_grads(m);
  Result r;
  const LossResult l = m.forward_backward(in, 0.5f, offset);
  m.all_reduce_sequence_parallel_grads();
  r.loss = {sum_over(*g.cp, l.loss_sum), sum_over(*g.cp, l.num_tokens)};
  for (Parameter* p : m.parameters()) {
    Tensor grad = p->grad.clone();
    g.cp->all_reduce(grad);
    r.grads.push_back(gather_along(*g.tp, grad, p->partition_dim));
  }
  const LossResult e = m.forward_loss(in);
  r.eval = {sum_over(*g.cp, e.loss_sum), sum_over(*g.cp, e.num_tokens)};
  return r;
}

void check_parity_with(const TransformerConfig& cfg, const Groups& g, bool resets,
                       const std::string& what, double tol, bool padding) {
  SCOPED_TRACE(what + " " + g.name + (resets ? " with document resets" : "") + " --cp-comm-type " +
               cfg.cp_comm_type);
  TransformerConfig ref_cfg = cfg;
  ref_cfg.recompute_granularity.clear();
  ref_cfg.recompute_method.clear();
  ref_cfg.recompute_num_layers = 0;
  GPTModel ref(ref_cfg, 42);
  testing::randomise(ref, 3);
  GPTModel cpm(cfg, 42, g.tp, g.cp);
  EXPECT_EQ(cpm.context_parallel_size(), g.cp->size());
  ParameterList a = cpm.parameters(), b = ref.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i]->value.copy_(shard_along(b[i]->value, a[i]->partition_dim, g.tp->rank(), g.tp->size()));
  // Uneven content: random tokens, ~20% of the loss mask off, one document boundary per sequence
  // (with resets), and the last quarter of sequence 1 masked out entirely.
  Batch in = testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 11, resets);
  float* mask = in.loss_mask.data<float>();
  for (int64_t i = cfg.seq_length * 7 / 4; i < 2 * cfg.seq_length; ++i) mask[i] = 0.0f;
  if (padding) {  // keys 1 and 2 of sequence 0 and the last 3 of sequence 1 are padding
    std::vector<int32_t> pad(size_t(2 * cfg.seq_length), 1);
    pad[1] = pad[2] = 0;
    for (int64_t i = 2 * cfg.seq_length - 3; i < 2 * cfg.seq_length; ++i) pad[size_t(i)] = 0;
    in.padding_mask = Tensor::from_vector(pad, {2, cfg.seq_length});
  }
  Groups single{TensorParallel::none().group, ContextParallel::none().group, "single"};
  const Result r = run(ref, single, in, 7);
  const Result c = run(cpm, g, in, 7);
  EXPECT_NEAR(c.loss.loss_sum, r.loss.loss_sum, tol * std::abs(r.loss.loss_sum));
  EXPECT_EQ(c.loss.num_tokens, r.loss.num_tokens);
  EXPECT_NEAR(c.eval.loss_sum, r.eval.loss_sum, tol * std::abs(r.eval.loss_sum));
  EXPECT_EQ(c.eval.num_tokens, r.eval.num_tokens);
  ASSERT_EQ(c.grads.size(), r.grads.size());
  for (size_t i = 0; i < r.grads.size(); ++i)
    EXPECT_LE(rel_diff(c.grads[i], r.grads[i]), tol) << b[i]->name;
}

// Both exchanges (--cp-comm-type p2p, the ring, and allgather) against the single-rank model.
void check_parity(TransformerConfig cfg, const Groups& g, bool resets, const std::string& what,
                  double tol = 1e-5, bool padding = false) {
  for (const char* type : {"p2p", "allgather"}) {
    cfg.cp_comm_type = type;
    check_parity_with(cfg, g, resets, what, tol, padding);
  }
}

TransformerConfig cp_config() {
  TransformerConfig c = testing::tiny_config();  // h 32, 4 heads, seq 16, vocab 96, 2 layers
  return c;
}

TEST(MpiContextParallelGPT, LossAndGradientsMatchSingleRank) {
  for (const Groups& g : cp_layouts())
    for (bool resets : {false, true}) {
      check_parity(cp_config(), g, resets, "plain");
      if (g.tp->size() > 1) {
        TransformerConfig c = cp_config();
        c.sequence_parallel = true;
        check_parity(c, g, resets, "sequence parallel");
      }
    }
}

TEST(MpiContextParallelGPT, GroupedQueryAttentionRecomputeAndDropout) {
  for (const Groups& g : cp_layouts()) {
    TransformerConfig c = cp_config();
    c.num_attention_heads = 8;
    c.num_query_groups = 2;
    c.recompute_granularity = "selective";
    check_parity(c, g, true, "GQA selective recompute");
    c = cp_config();
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 1;
    check_parity(c, g, false, "full recompute");
    // Dropout masks are indexed by position in the unsplit tensors (global query and key
    // position for attention): the same as the single-rank model's.
    c = cp_config();
    c.attention_dropout = 0.2f;
    c.hidden_dropout = 0.1f;
    check_parity(c, g, true, "dropout");
    if (g.tp->size() > 1) {
      c.sequence_parallel = true;
      check_parity(c, g, false, "dropout sequence parallel");
    }
  }
}

// Every mask of the core attention op splits: the ranks' queries at their positions in the whole
// sequence see the keys the single-rank model's would (sliding windows, ALiBi, bidirectional
// attention with a key padding mask gathered over the group), dropout included.
TEST(MpiContextParallelGPT, WindowsAlibiAndBidirectionalPaddingMatchSingleRank) {
  for (const Groups& g : cp_layouts()) {
    TransformerConfig c = cp_config();
    c.position_embedding_type = "alibi";
    c.window_left = 5;
    check_parity(c, g, true, "causal ALiBi window 5");
    c = cp_config();
    c.attention_mask_type = "bidirectional";
    c.window_left = 6;
    c.window_right = 3;
    c.attention_dropout = 0.2f;
    check_parity(c, g, false, "bidirectional window (6, 3) padding dropout", 1e-5, true);
    c.window_left = c.window_right = -1;
    c.num_attention_heads = 8;
    c.num_query_groups = 2;
    c.recompute_granularity = "selective";
    check_parity(c, g, false, "bidirectional GQA padding selective recompute", 1e-5, true);
  }
}

TEST(MpiContextParallelGPT, SequenceNotDivisibleByTwiceCpIsAnError) {
  const int C = world()->size();
  if (C == 1) GTEST_SKIP() << "needs context parallelism (mpirun -np 2 or 4)";
  const Batch in = testing::random_inputs(1, 2 * C + 2, 96, 1, false);
  try {
    slice_for_context_parallel(in, 0, C);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by 2 x --context-parallel-size"),
              std::string::npos)
        << e.what();
  }
}

// The attention splits in both directions, but BERT's heads do not: a BERT model over a
// context-parallel group is refused by name when it is built.
TEST(MpiContextParallelGPT, BertIsRefusedByName) {
  const int C = world()->size();
  if (C == 1) GTEST_SKIP() << "needs context parallelism (mpirun -np 2 or 4)";
  TransformerConfig c = cp_config();
  c.model_family = "bert";
  c.attention_mask_type = "bidirectional";
  c.normalization = "LayerNorm";
  try {
    BertModel m(c, 42, TensorParallel::none(), ContextParallel{world()});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BERT is not implemented with context parallelism"),
              std::string::npos)
        << e.what();
  }
}

// Megatron's load-balanced layout, with known answers: 2C chunks, rank r holds r and 2C-1-r.
TEST(ContextParallelLayout, ZigZagChunks) {
  Batch in = testing::random_inputs(2, 16, 96, 3, true);
  std::vector<int32_t> pos(32);
  for (int i = 0; i < 32; ++i) pos[size_t(i)] = i % 16 + 100 * (i / 16);
  in.position_ids = Tensor::from_vector(pos, {2, 16});
  auto positions = [](const Batch& x) {
    const std::vector<float> v = x.position_ids.to_float_vector();
    return std::vector<int>(v.begin(), v.end());
  };
  EXPECT_EQ(positions(slice_for_context_parallel(in, 0, 2)),
            (std::vector<int>{0, 1, 2, 3, 12, 13, 14, 15, 100, 101, 102, 103, 112, 113, 114, 115}));
  EXPECT_EQ(positions(slice_for_context_parallel(in, 1, 2)),
            (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11, 104, 105, 106, 107, 108, 109, 110, 111}));
  EXPECT_EQ(positions(slice_for_context_parallel(in, 3, 4)),
            (std::vector<int>{6, 7, 8, 9, 106, 107, 108, 109}));
  const Batch s = slice_for_context_parallel(in, 1, 4);
  for (const Tensor* t : {&s.tokens, &s.labels, &s.loss_mask, &s.attention_start})
    EXPECT_EQ(t->shape(), (Shape{2, 4}));
  EXPECT_EQ(s.tokens.to_float_vector()[2], in.tokens.to_float_vector()[12]);  // chunk 6 of 8
  EXPECT_EQ(s.loss_mask.to_float_vector()[5], in.loss_mask.to_float_vector()[16 + 3]);
  EXPECT_EQ(context_parallel_positions(4, 1, 4).to_float_vector(),
            (std::vector<float>{2, 3, 12, 13}));
}

}  // namespace
}  // namespace megatron::model
