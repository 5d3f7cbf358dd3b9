// The ops:: functions: each finds its tensors' device and calls that device's backend
// (backend.h). The kernels themselves live in cpu/, cuda/ and checked/.
#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/op_profile.h"

#define MG_DISPATCH(op, ...)                                  \
  profile::Scope mg_profile_scope_(#op);                      \
  return detail::dispatch<&OpTable::op>(#op, __VA_ARGS__)

namespace megatron::ops {

namespace detail {

const OpTable* g_backends[kDeviceTypeCount] = {&cpu::kOps, nullptr, nullptr};

void throw_mixed_devices(const char* op, Device a, Device b) {
  MG_THROW(op, ": tensors on ", a.to_string(), " and ", b.to_string(),
           "; all tensors of an op must be on one device (move them with Tensor::to)");
}

void throw_no_kernel(const char* op, Device device) {
  if (g_backends[size_t(device.type)] == nullptr)
    MG_THROW(op, ": no backend for ", device.to_string(), " is registered (",
             device.is_cuda() ? "this build has no CUDA backend or cuda::init was not called"
                              : "register the device first", ")");
  MG_THROW(op, " has no kernel on ", device.to_string(),
           "; run it on another device (Tensor::to) or add the kernel to that backend");
}

namespace {
template <class Row>
[[noreturn]] void throw_no_kind_kernel(const char* op, const char* what, const Row* row, int id,
                                       Device device) {
  if (row == nullptr)
    MG_THROW(op, ": ", what, " kind ", id, " is not a kind of kernels/op_kinds.h (an "
             "uninitialised or corrupt id)");
  MG_THROW(op, ": the ", what, " ", row->name, " has no kernel on ", device.to_string(),
           " (not implemented on ", device.is_cuda() ? "CUDA" : device.to_string(),
           "); run it on another device (Tensor::to) or add the kind's kernel to that backend");
}
}  // namespace

void throw_no_kind_kernel(const char* op, NormId kind, Device device) {
  throw_no_kind_kernel(op, "norm", find_norm_op(kind), int(kind), device);
}
void throw_no_kind_kernel(const char* op, ActivationId kind, Device device) {
  throw_no_kind_kernel(op, "activation", find_activation_op(kind), int(kind), device);
}

}  // namespace detail

void register_backend(DeviceType type, const OpTable* table) {
  MG_CHECK(size_t(type) < kDeviceTypeCount, "register_backend: bad device type ", int(type));
  MG_CHECK(type != DeviceType::CPU || table != nullptr, "the CPU backend cannot be removed");
  detail::g_backends[size_t(type)] = table;
}

const OpTable* backend_for(DeviceType type) {
  MG_CHECK(size_t(type) < kDeviceTypeCount, "backend_for: bad device type ", int(type));
  return detail::g_backends[size_t(type)];
}

namespace {
// The profile row of a product: its shape (M x K x N), operand dtype and transposes.
std::string gemm_label(const char* op, const Tensor& a, bool ta, const Tensor& b, bool tb) {
  if (a.dim() < 2 || b.dim() < 2) return op;
  const int64_t M = ta ? a.size(-1) : a.size(-2), K = ta ? a.size(-2) : a.size(-1);
  const int64_t N = tb ? b.size(-2) : b.size(-1);
  return str(op, " ", M, "x", K, "x", N, " ", dtype_name(a.dtype()), ta ? " T" : " N",
             tb ? "T" : "N");
}
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  if (profile::enabled()) {
    profile::Scope scope(gemm_label("gemm", a, trans_a, b, trans_b));
    return detail::dispatch<&OpTable::gemm>("gemm", a, trans_a, b, trans_b, c, alpha, beta);
  }
  return detail::dispatch<&OpTable::gemm>("gemm", a, trans_a, b, trans_b, c, alpha, beta);
}
void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha, float beta) {
  MG_DISPATCH(gemm_batched, a, trans_a, b, trans_b, c, alpha, beta);
}

bool gemm_computes_in(DType dtype, Device device) {
  if (dtype == DType::F32) return true;
  // cuBLASLt multiplies bf16 and fp16 operands on the tensor cores, accumulating in fp32.
  if (device.is_cuda()) return dtype == DType::BF16 || dtype == DType::F16;
  return device.is_host_memory() && cpu::computes_in(dtype);
}

void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight) {
  MG_DISPATCH(embedding_fwd, out, ids, weight);
}
void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout) {
  MG_DISPATCH(embedding_bwd, dweight, ids, dout);
}
void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start) {
  MG_DISPATCH(vocab_parallel_embedding_fwd, out, ids, weight, vocab_start);
}
void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start) {
  MG_DISPATCH(vocab_parallel_embedding_bwd, dweight, ids, dout, vocab_start);
}

void norm_fwd(NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  MG_DISPATCH(norm_fwd, kind, out, mean, rstd, x, weight, bias, eps);
}
void norm_bwd(NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx) {
  MG_DISPATCH(norm_bwd, kind, dx, dweight, dbias, dout, x, weight, mean, rstd, accumulate_dx);
}
void activation_fwd(ActivationId kind, const Tensor& out, const Tensor& x) {
  MG_DISPATCH(activation_fwd, kind, out, x);
}
void activation_bwd(ActivationId kind, const Tensor& dx, const Tensor& dout,
                    const Tensor& x) {
  MG_DISPATCH(activation_bwd, kind, dx, dout, x);
}

void bias_add(const Tensor& x, const Tensor& bias) { MG_DISPATCH(bias_add, x, bias); }
void bias_grad(const Tensor& dbias, const Tensor& dout) { MG_DISPATCH(bias_grad, dbias, dout); }
void add(const Tensor& out, const Tensor& a, const Tensor& b) { MG_DISPATCH(add, out, a, b); }
void scale(const Tensor& x, float s) { MG_DISPATCH(scale, x, s); }
void tanh_fwd(const Tensor& out, const Tensor& x) { MG_DISPATCH(tanh_fwd, out, x); }
void tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out) {
  MG_DISPATCH(tanh_bwd, dx, dout, out);
}

void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index) {
  MG_DISPATCH(index_select_rows, out, in, index);
}
void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index, bool accumulate) {
  MG_DISPATCH(index_copy_rows, out, in, index, accumulate);
}
void copy_to_flat(const Tensor& flat, const std::vector<Tensor>& parts) {
  MG_DISPATCH(copy_to_flat, flat, parts);
}
void copy_from_flat(const std::vector<Tensor>& parts, const Tensor& flat) {
  MG_DISPATCH(copy_from_flat, parts, flat);
}

void dropout_fwd(const Tensor& out, const Tensor& x, const DropoutSpec& d) {
  MG_DISPATCH(dropout_fwd, out, x, d);
}
void dropout_bwd(const Tensor& dx, const Tensor& dout, const DropoutSpec& d) {
  MG_DISPATCH(dropout_bwd, dx, dout, d);
}
void bias_dropout_add_fwd(const Tensor& out, const Tensor& x, const Tensor& bias,
                          const Tensor& residual, const DropoutSpec& d) {
  MG_DISPATCH(bias_dropout_add_fwd, out, x, bias, residual, d);
}
void bias_dropout_add_bwd(const Tensor& dx, const Tensor& dbias, const Tensor& dout,
                          const DropoutSpec& d) {
  MG_DISPATCH(bias_dropout_add_bwd, dx, dbias, dout, d);
}

HeadLayout HeadLayout::qkv(QkvPart part, int heads, int groups, int64_t head_dim, int64_t seq) {
  MG_CHECK(heads > 0 && groups > 0 && heads % groups == 0, "HeadLayout::qkv: heads ", heads,
           " not a multiple of groups ", groups);
  const int hpg = heads / groups;
  const int64_t group_width = int64_t(hpg + 2) * head_dim, width = groups * group_width;
  const int64_t offset = part == QkvPart::Query ? 0 : (hpg + (part == QkvPart::Value)) * head_dim;
  return {offset, seq * width, width, group_width, part == QkvPart::Query ? hpg : 1};
}
HeadLayout HeadLayout::kv(QkvPart part, int groups, int64_t head_dim, int64_t seq) {
  MG_CHECK(part != QkvPart::Query, "HeadLayout::kv holds keys and values only");
  const int64_t width = int64_t(groups) * 2 * head_dim;
  return {part == QkvPart::Value ? head_dim : 0, seq * width, width, 2 * head_dim, 1};
}
HeadLayout HeadLayout::heads(int heads, int64_t head_dim, int64_t seq) {
  const int64_t width = int64_t(heads) * head_dim;
  return {0, seq * width, width, width, heads};
}
HeadLayout HeadLayout::cache(int groups, int64_t max_len, int64_t head_dim) {
  return {0, int64_t(groups) * max_len * head_dim, head_dim, max_len * head_dim, 1};
}

void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& probs,
                   const AttentionInputs& in, const AttentionMask& mask,
                   const AttentionShape& shape, const DropoutSpec& dropout) {
  MG_DISPATCH(attention_fwd, out, lse, probs, in, mask, shape, dropout);
}
void attention_bwd(const AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const AttentionInputs& in,
                   const AttentionMask& mask, const AttentionShape& shape,
                   const DropoutSpec& dropout, bool accumulate) {
  MG_DISPATCH(attention_bwd, grads, dout, out, lse, probs, in, mask, shape, dropout, accumulate);
}
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                     const Tensor& lse_b, const AttentionShape& shape) {
  MG_DISPATCH(attention_merge, out, lse, out_b, lse_b, shape);
}

void rope_fwd(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope) {
  MG_DISPATCH(rope_fwd, qkv, positions, shape, rope);
}
void rope_bwd(const Tensor& dqkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope) {
  MG_DISPATCH(rope_bwd, dqkv, positions, shape, rope);
}

void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const AttentionShape& shape) {
  MG_DISPATCH(kv_cache_append, k_cache, v_cache, qkv, row_slot, row_pos, shape);
}
void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad) {
  MG_DISPATCH(softmax_xent_fwd_bwd, logits, loss, labels, loss_mask, grad_scale, write_grad);
}

void vocab_parallel_xent_max(const Tensor& logits_max, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_size) {
  MG_DISPATCH(vocab_parallel_xent_max, logits_max, logits, targets, vocab_size);
}
void vocab_parallel_xent_partials(const Tensor& stats, const Tensor& local_target,
                                  const Tensor& logits, const Tensor& logits_max,
                                  const Tensor& targets, int64_t vocab_start) {
  MG_DISPATCH(vocab_parallel_xent_partials, stats, local_target, logits, logits_max, targets,
              vocab_start);
}
void vocab_parallel_xent_loss(const Tensor& loss, const Tensor& exp_logits, const Tensor& stats,
                              int64_t vocab_size, float label_smoothing) {
  MG_DISPATCH(vocab_parallel_xent_loss, loss, exp_logits, stats, vocab_size, label_smoothing);
}
void vocab_parallel_xent_bwd(const Tensor& dlogits, const Tensor& softmax,
                             const Tensor& local_target, const Tensor& dloss, int64_t vocab_size,
                             float label_smoothing) {
  MG_DISPATCH(vocab_parallel_xent_bwd, dlogits, softmax, local_target, dloss, vocab_size,
              label_smoothing);
}

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& model_copy, const AdamWConfig& cfg) {
  MG_DISPATCH(adamw_step, master, grad, exp_avg, exp_avg_sq, model_copy, cfg);
}
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
              float weight_decay, float momentum, bool first_step) {
  MG_DISPATCH(sgd_step, param, grad, momentum_buf, lr, weight_decay, momentum, first_step);
}

double l2_norm_squared(const Tensor& x) { MG_DISPATCH(l2_norm_squared, x); }
std::vector<double> l2_norm_squared_each(const std::vector<Tensor>& xs) {
  MG_DISPATCH(l2_norm_squared_each, xs);
}
double sum(const Tensor& x) { MG_DISPATCH(sum, x); }
double dot(const Tensor& a, const Tensor& b) { MG_DISPATCH(dot, a, b); }
bool all_finite(const Tensor& x) { MG_DISPATCH(all_finite, x); }
IntRange int_range(const Tensor& ids) { MG_DISPATCH(int_range, ids); }
void cast(const Tensor& dst, const Tensor& src) { MG_DISPATCH(cast, dst, src); }

}  // namespace megatron::ops
