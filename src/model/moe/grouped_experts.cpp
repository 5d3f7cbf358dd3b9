// The grouped experts (see grouped_experts.h).
#include "model/moe/grouped_experts.h"

#include "comm/tp_mappings.h"
#include "kernels/op_profile.h"
#include "kernels/ops.h"
#include "model/parallel_layers.h"

namespace megatron::model {

void grouped_gemm(const Tensor& a, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& b,
                  bool trans_b, const Tensor& c) {
  MG_CHECK(rows.size() == b.size(), "grouped_gemm: ", rows.size(), " row counts for ", b.size(),
           " matrices");
  int64_t off = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t n = rows[g];
    if (n == 0) continue;
    ops::gemm(a.narrow(0, off, n), false, *b[g], trans_b, c.narrow(0, off, n));
    off += n;
  }
  MG_CHECK(off == a.size(0) && off == c.size(0), "grouped_gemm: the row counts sum to ", off,
           " but a has ", a.size(0), " rows");
}

void grouped_gemm_wgrad(const Tensor& d, const Tensor& a, const std::vector<int64_t>& rows,
                        const std::vector<Tensor*>& dw) {
  int64_t off = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t n = rows[g];
    if (n == 0) continue;
    if (dw[g] != nullptr && dw[g]->defined())
      ops::gemm(d.narrow(0, off, n), true, a.narrow(0, off, n), false, *dw[g], 1.0f, 1.0f);
    off += n;
  }
}

GroupedExperts::GroupedExperts(const std::string& prefix, const TransformerConfig& cfg,
                               const MlpSpec& spec, const TensorParallel& tp, bool grad)
    : activation_(*spec.activation), tp_(tp) {
  const int ep = tp.ep_size(), T = tp.size(), parts = activation_.gated ? 2 : 1;
  MG_REQUIRE(cfg.num_moe_experts % ep == 0, "--num-experts ", cfg.num_moe_experts,
             " is not divisible by --expert-model-parallel-size ", ep);
  const int64_t h = cfg.hidden_size, F = cfg.moe_ffn();
  MG_REQUIRE(F % T == 0, "--moe-ffn-hidden-size ", F, " is not divisible by the experts' "
             "tensor-parallel size ", T);
  const int64_t Fl = F / T, F1l = parts * Fl;  // this rank's shard of F and of fc1's rows
  const int local = cfg.num_moe_experts / ep;
  first_ = tp.ep_rank() * local;
  for (int e = first_; e < first_ + local; ++e) {
    WeightSpec w1;
    w1.name = prefix + ".linear_fc1.weight" + std::to_string(e);
    w1.init = InitMethod::normal;
    w1.partition_dim = 0;
    w1.partition_parts = parts;
    w1.expert = e;
    WeightSpec w2;
    w2.name = prefix + ".linear_fc2.weight" + std::to_string(e);
    w2.init = InitMethod::scaled_normal;
    w2.partition_dim = 1;
    w2.expert = e;
    fc1_.push_back(std::make_unique<Weight>());
    fc2_.push_back(std::make_unique<Weight>());
    fc1_.back()->init(w1, {F1l, h}, cfg.params_dtype, grad);
    fc2_.back()->init(w2, {h, Fl}, cfg.params_dtype, grad);
    fc1_.back()->param.expert = fc2_.back()->param.expert = e;
    for (Weight* w : {fc1_.back().get(), fc2_.back().get()}) {
      w->read_as_stored = true;  // only multiplied, as the linear layers' weights
      w->refresh();
    }
  }
  for (size_t e = 0; e < fc1_.size(); ++e) {  // expert by expert, as the sequential layout
    register_weight(*fc1_[e]);
    register_weight(*fc2_[e]);
  }
}

namespace {

std::vector<const Tensor*> operands(const std::vector<std::unique_ptr<Weight>>& ws) {
  std::vector<const Tensor*> out;
  for (const auto& w : ws) out.push_back(&w->operand());
  return out;
}
std::vector<Tensor*> grads(const std::vector<std::unique_ptr<Weight>>& ws) {
  std::vector<Tensor*> out;
  for (const auto& w : ws) out.push_back(&w->param.grad);
  return out;
}
// The dtype the experts' products read their weights in (every expert's is the same).
DType operand_dtype(const std::vector<std::unique_ptr<Weight>>& ws) {
  return ws.empty() ? DType::F32 : ws[0]->operand().dtype();
}

}  // namespace

Tensor GroupedExperts::forward(const LayerContext& ctx, const Tensor& xp,
                               const std::vector<int64_t>& counts) {
  const ops::profile::Scope profile("moe experts (grouped)");
  const int64_t M = xp.size(0);
  const int64_t F1 = fc1_.empty() ? 0 : fc1_[0]->param.value.size(0);
  const int64_t F = activation_.gated ? F1 / 2 : F1;
  const bool comm = !tp_.explicit_expert_comm && tp_.size() > 1;  // else the dispatcher's
  const DType dt = operand_dtype(fc1_);
  Tensor h1 = Tensor::empty({M, F1}, DType::F32, xp.device());
  // The activation is written in fc2's operand dtype (bf16 products: no fp32 copy and cast).
  Tensor a1 = Tensor::empty({M, F}, dt == DType::BF16 ? dt : DType::F32, xp.device());
  Tensor y = Tensor::empty({M, xp.size(1)}, DType::F32, xp.device());
  if (M > 0) {
    grouped_gemm(product_operand(xp, dt), counts, operands(fc1_), true, h1);
    ops::activation_fwd(activation_.id, a1, h1);
    grouped_gemm(product_operand(a1, dt), counts, operands(fc2_), true, y);
  }
  if (comm) y = tp::ReduceFromTensorParallelRegion::forward(tp_.comm(), y);
  if (ctx.save) {
    x_ = xp;
    h1_ = h1;
    a1_ = a1;
  }
  return y;
}

Tensor GroupedExperts::backward(const LayerContext& ctx, const Tensor& dyp,
                                const std::vector<int64_t>& counts) {
  const ops::profile::Scope profile("moe experts (grouped), bwd");
  (void)ctx;
  MG_CHECK(x_.defined(), "GroupedExperts::backward without a saved forward");
  const Tensor x = x_, h1 = h1_, a1 = a1_;
  const int64_t M = x.size(0);
  const bool comm = !tp_.explicit_expert_comm && tp_.size() > 1;
  const DType dt = operand_dtype(fc1_);
  Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device());
  if (M > 0) {
    // The row-parallel fc2's input gradient needs no exchange (ReduceFromTensorParallelRegion's
    // backward is the identity); the column-parallel fc1's is summed over the group below.
    const Tensor dyc = product_operand(dyp, dt);
    Tensor da = Tensor::empty(a1.shape(), DType::F32, x.device());
    grouped_gemm(dyc, counts, operands(fc2_), false, da);
    grouped_gemm_wgrad(dyc, product_operand(a1, dt), counts, grads(fc2_));
    Tensor dh = activation_.gated ? Tensor::empty(h1.shape(), DType::F32, x.device()) : da;
    ops::activation_bwd(activation_.id, dh, da, h1);
    const Tensor dhc = product_operand(dh, dt);
    grouped_gemm(dhc, counts, operands(fc1_), false, dx);
    grouped_gemm_wgrad(dhc, product_operand(x, dt), counts, grads(fc1_));
  }
  if (comm) dx = tp::CopyToTensorParallelRegion::backward(tp_.comm(), dx);
  x_.reset();
  h1_.reset();
  a1_.reset();
  return dx;
}

}  // namespace megatron::model
