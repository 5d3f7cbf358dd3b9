// Tensor and sequence parallelism of the GPT model by parity with the single-rank model. Tests
// named Mpi* run as plain processes (world of one: TP = 1) and under mpirun -np 2 / -np 4 (label
// mpi): the tensor-parallel group is the whole world (T = 2, 4) and, at -np 4, also the TP = 2
// groups of a ParallelState (TP 2 x DP 2). Every rank also builds the single-rank model locally
// and runs the same batch: initial weights are equal bitwise, and the loss, the logits and every
// parameter gradient (gathered from the shards) agree within 1e-5 of the tensor's scale, with and
// without sequence parallelism, with every recompute option, with dropout on, and the global
// grad norm computed with Megatron's TP-duplicate rule equals the single-rank norm.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/parallel_state.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "model/tensor_parallel.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

std::shared_ptr<Communicator> world() { return world_communicator(); }

// The groups to test on this world: the world itself and, where it splits, TP = 2 groups.
std::vector<std::shared_ptr<Communicator>> tp_groups() {
  auto w = world();
  std::vector<std::shared_ptr<Communicator>> out = {w};
  if (w->size() == 4) {
    ParallelConfig pc;
    pc.tensor_model_parallel_size = 2;
    static ParallelState ps = ParallelState::create(w, pc);
    out.push_back(ps.group_ptr(GroupKind::TP));
  }
  return out;
}

TransformerConfig tp_config() {
  TransformerConfig c = testing::tiny_config();  // h 32, 4 heads, seq 16, vocab 96, 2 layers
  c.num_layers = 3;
  return c;
}

// Largest |a - b| over the tensor, relative to the largest |ref| (the tensor's scale).
double rel_diff(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  if (got.shape() != ref.shape()) return 1e30;
  const std::vector<float> a = got.to_float_vector(), b = ref.to_float_vector();
  double scale = 1e-30, worst = 0;
  for (float v : b) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst / scale;
}

// Copies the single-rank model's weights into the tensor-parallel model (this rank's slices).
void load_shards(GPTModel& tp, GPTModel& ref) {
  ParameterList a = tp.parameters(), b = ref.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i]->value.copy_(shard_along(b[i]->value, a[i]->partition_dim, tp.tensor_parallel_rank(),
                                  tp.tensor_parallel_size()));
}

struct StepResult {
  LossResult loss;
  std::vector<Tensor> grads;  // full (gathered) gradients
  double grad_norm = 0;
  size_t activation_bytes = 0;
};

StepResult train_step(GPTModel& m, Communicator& tp, const Batch& in, uint64_t offset) {
  testing::zero_grads(m);
  StepResult r;
  r.loss = m.forward_backward(in, 0.5f, offset);
  m.all_reduce_sequence_parallel_grads();
  for (Parameter* p : m.parameters())
    r.grads.push_back(gather_along(tp, p->grad, p->partition_dim));
  Tensor ss = Tensor::full({1}, local_grad_sum_of_squares(m.parameters(), tp.rank()), DType::F64);
  tp.all_reduce(ss);
  r.grad_norm = std::sqrt(ss.item_as_double(0));
  r.activation_bytes = m.activation_bytes();
  return r;
}

// Replicated parameters must get bitwise-identical gradients on every TP rank (after the SP
// reduction), or the replicas would drift apart under the optimizer.
void expect_replicas_identical(GPTModel& m, Communicator& tp) {
  for (Parameter* p : m.parameters()) {
    if (is_tensor_model_parallel(*p)) continue;
    Tensor root = p->grad.clone();
    tp.broadcast(root, 0);
    EXPECT_EQ(root.to_float_vector(), p->grad.to_float_vector()) << p->name;
  }
}

void expect_same(const StepResult& got, const StepResult& ref, const ParameterList& names,
                 double tol) {
  EXPECT_NEAR(got.loss.loss_sum, ref.loss.loss_sum, tol * std::abs(ref.loss.loss_sum));
  EXPECT_EQ(got.loss.num_tokens, ref.loss.num_tokens);
  EXPECT_NEAR(got.grad_norm, ref.grad_norm, tol * ref.grad_norm);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i)
    EXPECT_LE(rel_diff(got.grads[i], ref.grads[i]), tol) << names[i]->name;
}

// Parity of one configuration on one TP group.
void check_parity(const TransformerConfig& cfg, const std::shared_ptr<Communicator>& group,
                  const std::string& what, double tol = 1e-5) {
  SCOPED_TRACE(what + " T=" + std::to_string(group->size()));
  TransformerConfig ref_cfg = cfg;
  ref_cfg.recompute_granularity.clear();  // the reference stores everything
  ref_cfg.recompute_method.clear();
  ref_cfg.recompute_num_layers = 0;
  GPTModel ref(ref_cfg, 42);
  testing::randomise(ref, 3);
  GPTModel tpm(cfg, 42, group);
  load_shards(tpm, ref);
  const Batch in = testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 11, true);
  const StepResult r = train_step(ref, *make_self_communicator(), in, 7);
  const StepResult t = train_step(tpm, *group, in, 7);
  expect_same(t, r, ref.parameters(), tol);
  expect_replicas_identical(tpm, *group);
  // Eval loss and the logits (gathered over the vocabulary shards).
  const LossResult el = tpm.forward_loss(in), er = ref.forward_loss(in);
  EXPECT_NEAR(el.loss_sum, er.loss_sum, tol * std::abs(er.loss_sum));
  EXPECT_LE(rel_diff(tpm.forward_logits(in.tokens, in.position_ids, in.attention_start),
                     ref.forward_logits(in.tokens, in.position_ids, in.attention_start)),
            tol);
}

TEST(MpiTensorParallelGPT, InitialWeightsEqualSingleRankSlices) {
  for (const auto& g : tp_groups()) {
    for (bool sp : {false, true}) {
      TransformerConfig cfg = tp_config();
      cfg.num_query_groups = g->size() <= 2 ? 2 : 0;  // 4 heads in 2 groups where T allows
      cfg.sequence_parallel = sp;
      GPTModel ref(cfg, 5), tpm(cfg, 5, g);
      const int T = g->size();
      EXPECT_EQ(tpm.tensor_parallel_size(), T);
      EXPECT_EQ(tpm.sequence_parallel(), sp && T > 1);
      ParameterList a = tpm.parameters(), b = ref.parameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const Parameter& p = *a[i];
        SCOPED_TRACE(p.name);
        EXPECT_EQ(p.name, b[i]->name);
        EXPECT_EQ(p.partition_dim, b[i]->partition_dim);
        EXPECT_EQ(full_shape(p, T), b[i]->value.shape());
        // Replicated parameters that see a sequence shard under SP: norms, row-parallel biases,
        // the position embedding.
        const bool replicated_sp = p.partition_dim < 0;
        EXPECT_EQ(p.sequence_parallel, sp && T > 1 && replicated_sp);
        EXPECT_EQ(is_tensor_model_parallel(p), p.partition_dim >= 0);
        EXPECT_EQ(gather_along(*g, p.value, p.partition_dim).to_float_vector(),
                  b[i]->value.to_float_vector());
      }
    }
  }
}

TEST(MpiTensorParallelGPT, LossLogitsAndGradientsMatchSingleRank) {
  for (const auto& g : tp_groups())
    for (bool sp : {false, true}) {
      TransformerConfig cfg = tp_config();
      cfg.sequence_parallel = sp;
      check_parity(cfg, g, sp ? "sequence parallel" : "tensor parallel");
    }
}

TEST(MpiTensorParallelGPT, GroupedQueryAttentionAndExactGelu) {
  for (const auto& g : tp_groups())
    for (bool sp : {false, true}) {
      TransformerConfig cfg = tp_config();
      cfg.num_attention_heads = 8;
      cfg.num_query_groups = 4;
      cfg.ffn_hidden_size = 48;
      cfg.activation = "gelu";
      cfg.sequence_parallel = sp;
      check_parity(cfg, g, sp ? "GQA sequence parallel" : "GQA");
    }
}

TEST(MpiTensorParallelGPT, RecomputeOptionsUnderTensorParallelism) {
  struct Case {
    const char* granularity;
    const char* method;
    int k;
  };
  for (const auto& g : tp_groups())
    for (bool sp : {false, true})
      for (const Case& c : {Case{"selective", "", 0}, Case{"full", "uniform", 1},
                            Case{"full", "uniform", 2}, Case{"full", "block", 2}}) {
        TransformerConfig cfg = tp_config();
        cfg.sequence_parallel = sp;
        cfg.recompute_granularity = c.granularity;
        cfg.recompute_method = c.method;
        cfg.recompute_num_layers = c.k;
        check_parity(cfg, g, std::string(sp ? "SP " : "") + c.granularity + " " + c.method);
      }
}

// Dropout masks are indexed by position in the unsharded tensors (global head for attention), so
// the tensor-parallel model reproduces the single-rank model's dropout too.
TEST(MpiTensorParallelGPT, DropoutMasksDoNotDependOnTensorParallelism) {
  for (const auto& g : tp_groups())
    for (bool sp : {false, true}) {
      TransformerConfig cfg = tp_config();
      cfg.hidden_dropout = 0.1f;
      cfg.attention_dropout = 0.1f;
      cfg.sequence_parallel = sp;
      GPTModel ref(cfg, 42);
      testing::randomise(ref, 3);
      GPTModel tpm(cfg, 42, g);
      load_shards(tpm, ref);
      const Batch in =
          testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 5, true);
      const StepResult r = train_step(ref, *make_self_communicator(), in, 9);
      const StepResult t = train_step(tpm, *g, in, 9);
      SCOPED_TRACE(std::string(sp ? "SP" : "TP") + " T=" + std::to_string(g->size()));
      expect_same(t, r, ref.parameters(), 1e-5);
    }
}

// Sequence parallelism keeps LayerNorm / residual activations for 1/T of the tokens.
TEST(MpiTensorParallelGPT, SequenceParallelSavesActivationMemory) {
  auto g = world();
  if (g->size() == 1) GTEST_SKIP() << "needs tensor parallelism (mpirun -np 2 or 4)";
  const Batch in = testing::random_inputs(2, 16, 96, 5, false);
  size_t bytes[2];
  for (bool sp : {false, true}) {
    TransformerConfig cfg = tp_config();
    cfg.sequence_parallel = sp;
    GPTModel m(cfg, 1, g);
    m.forward_backward(in, 1.0f, 0);
    bytes[sp] = m.activation_bytes();
  }
  EXPECT_LT(bytes[1], bytes[0]);
}

TEST(MpiTensorParallelGPT, BadConfigurationsGiveClearErrors) {
  auto g = world();
  const int T = g->size();
  if (T == 1) GTEST_SKIP() << "needs tensor parallelism (mpirun -np 2 or 4)";
  auto expect_error = [&](const TransformerConfig& cfg, const std::string& needle) {
    try {
      GPTModel m(cfg, 1, g);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TransformerConfig c = tp_config();
  c.num_attention_heads = 2 * T + 1;  // kv_channels set, so only T rejects the head count
  c.kv_channels = 8;
  expect_error(c, "--num-attention-heads");
  c = tp_config();
  c.hidden_size = 32 * T + 1;
  c.kv_channels = 8;
  expect_error(c, "--hidden-size");
  c = tp_config();
  c.num_attention_heads = 4 * T;
  c.kv_channels = 8;
  c.num_query_groups = 1;  // one key/value head cannot be split across T ranks
  expect_error(c, "--num-query-groups");
  c = tp_config();
  c.padded_vocab_size = 96 * T + 1;
  expect_error(c, "--make-vocab-size-divisible-by");
  c = tp_config();
  c.seq_length = 4 * T + 1;
  c.sequence_parallel = true;
  expect_error(c, "--seq-length");
  c.sequence_parallel = false;  // fine without sequence parallelism
  EXPECT_NO_THROW(GPTModel(c, 1, g));
  // A batch whose sequence does not split into T shards under sequence parallelism.
  c = tp_config();
  c.sequence_parallel = true;
  GPTModel m(c, 1, g);
  const Batch odd = testing::random_inputs(1, 4 * T + 1, 96, 1, false);
  EXPECT_THROW(m.forward_loss(odd), Error);
  // Megatron's padding (make_vocab_size_divisible_by * T) always gives a valid vocabulary.
  c = tp_config();
  c.padded_vocab_size = data::padded_vocab_size(90, 8, T);
  EXPECT_EQ(c.padded_vocab_size % (8 * T), 0);
  EXPECT_NO_THROW(GPTModel(c, 1, g));
}

// The size checks themselves need no communication: every T against one configuration.
TEST(TensorParallelConfig, ValidateNamesTheIndivisibleFlag) {
  auto message = [](const TransformerConfig& c, int T) -> std::string {
    try {
      c.validate_tensor_parallel(T);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TransformerConfig c = tp_config();  // h 32, 4 heads, ffn 128, vocab 96, seq 16
  EXPECT_EQ(message(c, 1), "");
  EXPECT_EQ(message(c, 2), "");
  EXPECT_EQ(message(c, 4), "");
  EXPECT_NE(message(c, 3).find("--hidden-size 32 is not divisible by "
                               "--tensor-model-parallel-size 3"), std::string::npos);
  c.hidden_size = 48;  // divisible by 8, but 4 heads are not
  c.kv_channels = 12;
  EXPECT_NE(message(c, 8).find("--num-attention-heads 4"), std::string::npos);
  c = tp_config();
  c.num_query_groups = 2;
  EXPECT_NE(message(c, 4).find("--num-query-groups 2"), std::string::npos);
  c = tp_config();
  c.ffn_hidden_size = 66;
  EXPECT_NE(message(c, 4).find("--ffn-hidden-size 66"), std::string::npos);
  c = tp_config();
  c.padded_vocab_size = 98;
  EXPECT_NE(message(c, 4).find("make-vocab-size-divisible-by"), std::string::npos);
  c = tp_config();
  c.seq_length = 18;
  EXPECT_EQ(message(c, 4), "");
  c.sequence_parallel = true;
  EXPECT_NE(message(c, 4).find("--sequence-parallel"), std::string::npos);
  EXPECT_EQ(message(c, 1), "");  // ignored at TP = 1, as in Megatron
}

// Layout helpers: shards are equal chunks along partition_dim; the SP gradient reduction sums
// only the marked parameters; the grad norm counts TP duplicates on TP rank 0 only.
TEST(MpiTensorParallelGPT, ShardGatherAndGradientRules) {
  auto g = world();
  const int T = g->size(), r = g->rank();
  Tensor full = Tensor::empty({4, 2 * T}, DType::F32);
  for (int64_t i = 0; i < full.numel(); ++i) full.data<float>()[i] = float(i);
  for (int dim : {0, 1}) {
    if (full.size(dim) % T != 0) continue;
    Tensor part = shard_along(full, dim, r, T);
    EXPECT_EQ(part.size(dim) * T, full.size(dim));
    EXPECT_EQ(part.to_float_vector(),
              full.narrow(dim, r * part.size(dim), part.size(dim)).contiguous().to_float_vector());
    EXPECT_EQ(gather_along(*g, part, dim).to_float_vector(), full.to_float_vector());
  }
  Parameter sp, plain, shard;
  sp.sequence_parallel = true;
  for (Parameter* p : {&sp, &plain, &shard}) p->grad = Tensor::full({3}, double(r + 1), DType::F32);
  shard.partition_dim = 0;
  all_reduce_sequence_parallel_grads({&sp, &plain, &shard}, *g);
  for (float v : sp.grad.to_float_vector()) EXPECT_EQ(v, float(T * (T + 1) / 2));
  for (float v : plain.grad.to_float_vector()) EXPECT_EQ(v, float(r + 1));
  const double sq = 3.0 * (r + 1) * (r + 1);  // sum of squares of one gradient
  EXPECT_NEAR(local_grad_sum_of_squares({&plain, &shard}, r), (r == 0 ? 2 * sq : sq), 1e-9);
  EXPECT_TRUE(param_is_not_tensor_parallel_duplicate(shard, 3));
  EXPECT_FALSE(param_is_not_tensor_parallel_duplicate(plain, 1));
  EXPECT_TRUE(param_is_not_tensor_parallel_duplicate(plain, 0));
}

}  // namespace
}  // namespace megatron::model
