// Model chunks in one process (no communication): every virtual stage of a layout is built here,
// initial weights are checked bitwise against the single-rank model under the single-rank names,
// and micro-batches are chained through the chunks by hand in orders a pipeline produces (all
// forwards first, backwards in another order, interleaved), so the per-micro-batch stash,
// recomputation and dropout are checked against GPTModel::forward_backward without MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "pipeline/forward_backward.h"
#include "pipeline_test_util.h"

namespace megatron::model {
namespace {

using testing::rel_diff;

TransformerConfig config(int layers) {
  TransformerConfig c = testing::tiny_config();  // h 32, 4 heads, seq 16, vocab 96
  c.num_layers = layers;
  return c;
}

// Every chunk of every rank of `layout`, in virtual-stage order.
std::vector<std::unique_ptr<GPTModel>> all_chunks(const TransformerConfig& cfg, uint64_t seed,
                                                  const PipelineLayout& layout) {
  std::vector<std::unique_ptr<GPTModel>> out(size_t(layout.num_virtual_stages()));
  for (int r = 0; r < layout.pipeline_size; ++r)
    for (int c = 0; c < layout.num_chunks; ++c)
      out[size_t(layout.virtual_stage(r, c))] =
          std::make_unique<GPTModel>(cfg, seed, TensorParallel::none(), ContextParallel::none(), ChunkPlace{layout, r, c});
  return out;
}

TEST(ModelChunkTest, InitialWeightsAndNamesEqualTheSingleRankModel) {
  for (auto [L, P, lpvs] : {std::tuple{4, 2, 0}, std::tuple{4, 4, 0}, std::tuple{8, 2, 2},
                            std::tuple{8, 2, 1}, std::tuple{6, 3, 0}}) {
    SCOPED_TRACE("L=" + std::to_string(L) + " P=" + std::to_string(P) +
                 " layers/virtual stage=" + std::to_string(lpvs));
    const TransformerConfig cfg = config(L);
    GPTModel ref(cfg, 17);
    const PipelineLayout layout = PipelineLayout::make(L, P, lpvs);
    auto chunks = all_chunks(cfg, 17, layout);
    std::multiset<std::string> names;
    for (int vs = 0; vs < layout.num_virtual_stages(); ++vs) {
      GPTModel& ch = *chunks[size_t(vs)];
      EXPECT_EQ(ch.first_layer(), vs * layout.layers_per_chunk());
      EXPECT_EQ(ch.num_layers(), layout.layers_per_chunk());
      EXPECT_EQ(ch.pre_process(), vs == 0);
      EXPECT_EQ(ch.post_process(), vs == layout.num_virtual_stages() - 1);
      for (Parameter* p : ch.parameters()) {
        names.insert(p->name);
        Parameter* r = testing::find_param(ref, testing::reference_name(*p));
        ASSERT_NE(r, nullptr);
        EXPECT_EQ(p->value.to_float_vector(), r->value.to_float_vector()) << p->name;
        EXPECT_EQ(p->partition_dim, r->partition_dim) << p->name;
        EXPECT_EQ(p->weight_decay, r->weight_decay) << p->name;
        EXPECT_EQ(p->shared, p->name == "output_layer.weight");
      }
    }
    // Every single-rank parameter exactly once, plus the last stage's tied copy.
    std::multiset<std::string> want;
    for (Parameter* p : ref.parameters()) want.insert(p->name);
    want.insert("output_layer.weight");
    EXPECT_EQ(names, want);
  }
}

// One chunk holding everything (P = 1) has exactly GPTModel's parameter list.
TEST(ModelChunkTest, SingleStageHasNoTiedCopy) {
  const TransformerConfig cfg = config(2);
  GPTModel ref(cfg, 3);
  GPTModel ch(cfg, 3, TensorParallel::none(), ContextParallel::none(), ChunkPlace{PipelineLayout::make(2, 1), 0, 0});
  ParameterList a = ch.parameters(), b = ref.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_FALSE(a[i]->shared);
  }
}

// Chains micro-batches through all virtual stages: every forward first (micro-batch order), then
// the backwards in `backward_order`; the tied gradients are summed as the embedding group would.
void check_chained(const TransformerConfig& cfg, const PipelineLayout& layout,
                   const std::vector<int>& backward_order, const std::string& what) {
  SCOPED_TRACE(what);
  const int M = int(backward_order.size());
  GPTModel ref(cfg, 42);
  testing::randomise(ref, 5);
  const auto mbs = testing::microbatches(M, cfg, 100);
  const float scale = float(1.0 / testing::total_tokens(mbs));
  const testing::Reference want = testing::reference_step(ref, mbs, scale, 1000);

  auto chunks = all_chunks(cfg, 42, layout);
  ParameterList all;
  for (auto& c : chunks)
    for (Parameter* p : c->parameters()) all.push_back(p);
  testing::load_from(all, ref, 0, 1);
  testing::zero_grads(all);
  double loss_sum = 0, tokens = 0;
  const int V = layout.num_virtual_stages();
  for (int m = 0; m < M; ++m) {
    ChunkForward f;
    f.grad_scale = scale;
    f.dropout_offset = 1000 + uint64_t(m);
    Tensor x;
    for (int vs = 0; vs < V; ++vs) {
      LossResult l;
      x = chunks[size_t(vs)]->forward(m, mbs[size_t(m)], x, f, &l);
      if (vs == V - 1) {
        EXPECT_FALSE(x.defined());
        loss_sum += l.loss_sum;
        tokens += l.num_tokens;
      }
    }
  }
  for (auto& c : chunks) EXPECT_EQ(c->in_flight(), M);
  for (int m : backward_order) {
    Tensor dy;
    for (int vs = V; vs-- > 0;) dy = chunks[size_t(vs)]->backward(m, dy);
    EXPECT_FALSE(dy.defined());
  }
  for (auto& c : chunks) EXPECT_EQ(c->in_flight(), 0);
  EXPECT_NEAR(loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
  EXPECT_EQ(tokens, want.tokens);
  // Tied embedding: first and last stage gradients together are the single-rank gradient.
  Tensor tied = chunks.front()->word_embedding()->grad.clone();
  if (V > 1) ops::add(tied, tied, chunks.back()->word_embedding()->grad);
  EXPECT_LE(rel_diff(tied, want.grads.at("embedding.word_embeddings.weight")), 1e-5);
  for (Parameter* p : all) {
    if (p->name == "embedding.word_embeddings.weight" || p->shared) continue;
    EXPECT_LE(rel_diff(p->grad, want.grads.at(p->name)), 1e-5) << p->name;
  }
}

TEST(ModelChunkTest, ChainedChunksMatchSingleRankWithMicrobatchesInFlight) {
  check_chained(config(4), PipelineLayout::make(4, 2), {0, 1, 2}, "P2 in order");
  check_chained(config(4), PipelineLayout::make(4, 4), {2, 0, 1}, "P4 out of order");
  check_chained(config(8), PipelineLayout::make(8, 2, 2), {1, 3, 0, 2}, "P2 x 2 virtual");
  check_chained(config(3), PipelineLayout::make(3, 1), {1, 0}, "P1");
}

TEST(ModelChunkTest, ChainedChunksWithRecomputeAndDropout) {
  TransformerConfig c = config(4);
  c.hidden_dropout = 0.1f;
  c.attention_dropout = 0.1f;
  check_chained(c, PipelineLayout::make(4, 2), {1, 0, 2}, "dropout");
  c = config(8);
  c.recompute_granularity = "full";
  c.recompute_method = "uniform";
  c.recompute_num_layers = 2;
  check_chained(c, PipelineLayout::make(8, 2), {1, 0}, "full uniform 2");
  c.recompute_method = "block";
  c.recompute_num_layers = 1;
  check_chained(c, PipelineLayout::make(8, 2, 2), {0, 1}, "full block 1");
  c = config(4);
  c.recompute_granularity = "selective";
  check_chained(c, PipelineLayout::make(4, 4), {1, 0}, "selective");
}

// Evaluation: nothing stays in flight; the chained loss equals GPTModel::forward_loss.
TEST(ModelChunkTest, ForwardOnlyKeepsNothing) {
  const TransformerConfig cfg = config(4);
  GPTModel ref(cfg, 9);
  auto chunks = all_chunks(cfg, 9, PipelineLayout::make(4, 2, 1));
  const Batch in = testing::random_inputs(2, 16, 96, 3, true);
  ChunkForward f;
  f.training = false;
  Tensor x;
  LossResult l;
  for (auto& c : chunks) x = c->forward(0, in, x, f, &l);
  for (auto& c : chunks) EXPECT_EQ(c->in_flight(), 0);
  EXPECT_NEAR(l.loss_sum, ref.forward_loss(in).loss_sum, 1e-5 * l.loss_sum);
}

TEST(ModelChunkTest, MisuseIsCaught) {
  const TransformerConfig cfg = config(4);
  GPTModel mid(cfg, 1, TensorParallel::none(), ContextParallel::none(), ChunkPlace{PipelineLayout::make(4, 4), 1, 0});
  const Batch in = testing::random_inputs(2, 16, 96, 3, false);
  ChunkForward f;
  EXPECT_THROW(mid.forward(0, in, Tensor::zeros({31, 32}, DType::F32), f), InternalError);
  EXPECT_THROW(mid.backward(5, Tensor::zeros({32, 32}, DType::F32)), InternalError);
  mid.forward(0, in, Tensor::zeros({32, 32}, DType::F32), f);
  EXPECT_THROW(mid.forward(0, in, Tensor::zeros({32, 32}, DType::F32), f), InternalError);
  EXPECT_EQ(mid.in_flight(), 1);
}

// The last stage's tied copy is counted once in the grad norm (on its owner, the first stage).
TEST(ModelChunkTest, TiedCopyIsLeftOutOfTheGradNorm) {
  GPTModel last(config(4), 1, TensorParallel::none(), ContextParallel::none(), ChunkPlace{PipelineLayout::make(4, 2), 1, 0});
  Parameter* copy = last.word_embedding();
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(copy->shared);
  EXPECT_FALSE(param_counts_in_grad_norm(*copy, 0));
  for (Parameter* p : last.parameters()) p->grad.fill_(1.0);
  double want = 0;
  for (Parameter* p : last.parameters()) want += p->shared ? 0.0 : double(p->grad.numel());
  EXPECT_EQ(local_grad_sum_of_squares(last.parameters(), 0), want);
}

// P = 1: StageModel + forward_backward (no pipelining) equals GPTModel's loop.
TEST(StageModelTest, NoPipeliningEqualsSingleRankLoop) {
  const TransformerConfig cfg = config(3);
  GPTModel ref(cfg, 42);
  testing::randomise(ref, 5);
  const auto mbs = testing::microbatches(3, cfg, 40);
  const float scale = float(1.0 / testing::total_tokens(mbs));
  const testing::Reference want = testing::reference_step(ref, mbs, scale, 7);
  StageModel st(cfg, 42, PipelineLayout::make(3, 1), 0, make_self_communicator("tp"), nullptr,
                   nullptr);
  testing::load_from(st.parameters(), ref, 0, 1);
  testing::zero_grads(st.parameters());
  pipeline::ForwardBackwardOptions o;
  o.grad_scale = scale;
  o.dropout_offset = 7;
  const auto res = pipeline::forward_backward_no_pipelining(st, mbs, o);
  EXPECT_EQ(res.kind, pipeline::ScheduleKind::NoPipelining);
  EXPECT_EQ(res.max_in_flight, 1);
  EXPECT_NEAR(res.loss_sum, want.loss_sum, 1e-6 * want.loss_sum);
  EXPECT_EQ(res.num_tokens, want.tokens);
  for (Parameter* p : st.parameters())
    EXPECT_LE(rel_diff(p->grad, want.grads.at(p->name)), 1e-6) << p->name;
  // A schedule that does not fit the model is refused.
  EXPECT_THROW(pipeline::forward_backward_pipelining_with_interleaving(st, mbs, o), Error);
  // Micro-batches of different shapes cannot go through a pipeline.
  auto odd = mbs;
  odd[1] = testing::random_inputs(1, 16, 96, 3, false);
  EXPECT_THROW(pipeline::forward_backward(st, odd, o), Error);
}

}  // namespace
}  // namespace megatron::model
