// The CUDA backend's host interface (plain C++: callers need no CUDA headers). Built only when a
// CUDA compiler is found at configure time (MEGATRON_HAVE_CUDA); elsewhere the functions do not
// exist and code asks cuda_compiled() first.
//
// Runtime: init(device) selects a GPU, registers the caching allocator for DeviceType::CUDA, the
// host<->device copy used by Tensor::to / copy_, and the op table (op_table()) through which
// ops:: calls on CUDA tensors reach these kernels. All kernels run on the backend's stream
// (one per process); nothing here synchronises the host except synchronize(), copies to the
// host and the scalar results (l2_norm_squared, all_finite).
//
// Kernels mirror src/kernels/ops.h one for one (same arguments, same meaning, fp32 compute), so
// the ops layer dispatches to them (cuda_ops.cpp); tests/kernels/backend_ops_test.cpp compares
// each against the CPU op on a GPU, and tests/cuda/cuda_op_table_test.cpp checks (without one)
// that every op of MG_FOR_EACH_OP has its kernel here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace megatron::ops {
struct OpTable;
}

namespace megatron::cuda {

// The ops with a CUDA kernel, for the dispatcher (kernels/backend.h); registered by init().
const ops::OpTable& op_table();

// ---- runtime ------------------------------------------------------------------------------------
int device_count();             // 0 when there is no driver or no device (never throws)
bool available();               // device_count() > 0
std::string device_name(int device);
void init(int device = 0);      // idempotent per device; throws Error if the device is unusable
void synchronize();             // waits for the backend stream; throws on an asynchronous error
// The backend's stream as an opaque handle (a cudaStream_t), for code that orders its own device
// work with the kernels' (the NCCL communicator).
void* stream_handle();

// The caching allocator's counters, as PyTorch's torch.cuda.memory_allocated / max_memory_allocated
// / memory_reserved / max_memory_reserved that Megatron's report_memory line prints (bytes of
// blocks as handed out, rounded to the allocator's sizes).
struct AllocatorStats {
  size_t allocated_bytes = 0;   // in live tensors
  size_t reserved_bytes = 0;    // obtained from cudaMalloc (live + cached)
  size_t peak_allocated_bytes = 0;
  size_t peak_reserved_bytes = 0;
  int64_t live_allocations = 0;  // blocks handed out and not yet freed
  int64_t device_mallocs = 0;   // cudaMalloc calls so far (a training step should add none)
};
AllocatorStats allocator_stats();
void reset_peak_stats();        // the peaks restart from the current values
void empty_cache();             // returns cached, unused blocks to the driver

// ---- matrix products (cuBLASLt) -------------------------------------------------------------
// As ops::gemm / ops::gemm_batched: row-major operands with unit inner stride, fp32 in and out,
// fp32 accumulation (no TF32 unless allow_tf32(true)).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);
void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha = 1.0f, float beta = 0.0f);
void allow_tf32(bool on);

// ---- the ops' kernels: each as its namesake in ops.h (same arguments, same meaning and errors) --
void embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight);
void embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout);
void vocab_parallel_embedding_fwd(const Tensor& out, const Tensor& ids, const Tensor& weight,
                                  int64_t vocab_start);
void vocab_parallel_embedding_bwd(const Tensor& dweight, const Tensor& ids, const Tensor& dout,
                                  int64_t vocab_start);
void norm_fwd(ops::NormId kind, const Tensor& out, const Tensor& mean, const Tensor& rstd,
              const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
void norm_bwd(ops::NormId kind, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
              const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
              const Tensor& rstd, bool accumulate_dx);
void activation_fwd(ops::ActivationId kind, const Tensor& out, const Tensor& x);
void activation_bwd(ops::ActivationId kind, const Tensor& dx, const Tensor& dout,
                    const Tensor& x);
void bias_add(const Tensor& x, const Tensor& bias);
void bias_grad(const Tensor& dbias, const Tensor& dout);
void add(const Tensor& out, const Tensor& a, const Tensor& b);
void scale(const Tensor& x, float s);
void tanh_fwd(const Tensor& out, const Tensor& x);
void tanh_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out);
void index_select_rows(const Tensor& out, const Tensor& in, const Tensor& index);
void index_copy_rows(const Tensor& out, const Tensor& in, const Tensor& index, bool accumulate);
void copy_to_flat(const Tensor& flat, const std::vector<Tensor>& parts);
void copy_from_flat(const std::vector<Tensor>& parts, const Tensor& flat);
void dropout_fwd(const Tensor& out, const Tensor& x, const ops::DropoutSpec& d);
void dropout_bwd(const Tensor& dx, const Tensor& dout, const ops::DropoutSpec& d);
void bias_dropout_add_fwd(const Tensor& out, const Tensor& x, const Tensor& bias,
                          const Tensor& residual, const ops::DropoutSpec& d);
void bias_dropout_add_bwd(const Tensor& dx, const Tensor& dbias, const Tensor& dout,
                          const ops::DropoutSpec& d);
void rope_fwd(const Tensor& qkv, const Tensor& positions, const ops::AttentionShape& shape,
              const ops::RotaryConfig& rope);
void rope_bwd(const Tensor& dqkv, const Tensor& positions, const ops::AttentionShape& shape,
              const ops::RotaryConfig& rope);
void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& probs,
                   const ops::AttentionInputs& in, const ops::AttentionMask& mask,
                   const ops::AttentionShape& shape, const ops::DropoutSpec& dropout);
void attention_bwd(const ops::AttentionGrads& grads, const Tensor& dout, const Tensor& out,
                   const Tensor& lse, const Tensor& probs, const ops::AttentionInputs& in,
                   const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                   const ops::DropoutSpec& dropout, bool accumulate);
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                     const Tensor& lse_b, const ops::AttentionShape& shape);
void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const ops::AttentionShape& shape);
void softmax_xent_fwd_bwd(const Tensor& logits, const Tensor& loss, const Tensor& labels,
                          const Tensor& loss_mask, float grad_scale, bool write_grad);
void vocab_parallel_xent_max(const Tensor& logits_max, const Tensor& logits, const Tensor& targets,
                             int64_t vocab_size);
void vocab_parallel_xent_partials(const Tensor& stats, const Tensor& local_target,
                                  const Tensor& logits, const Tensor& logits_max,
                                  const Tensor& targets, int64_t vocab_start);
void vocab_parallel_xent_loss(const Tensor& loss, const Tensor& exp_logits, const Tensor& stats,
                              int64_t vocab_size, float label_smoothing);
void vocab_parallel_xent_bwd(const Tensor& dlogits, const Tensor& softmax,
                             const Tensor& local_target, const Tensor& dloss, int64_t vocab_size,
                             float label_smoothing);
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& model_copy, const ops::AdamWConfig& cfg);
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
              float weight_decay, float momentum, bool first_step);
double l2_norm_squared(const Tensor& x);
std::vector<double> l2_norm_squared_each(const std::vector<Tensor>& xs);
double sum(const Tensor& x);
double dot(const Tensor& a, const Tensor& b);
bool all_finite(const Tensor& x);
ops::IntRange int_range(const Tensor& ids);
void cast(const Tensor& dst, const Tensor& src);

// ---- several tensors per launch (the optimizer's step over every parameter) --------------------
// One launch over every parameter: AdamW as ops::adamw_step on each entry (cfg shared).
struct AdamWTensors {
  Tensor master, grad, exp_avg, exp_avg_sq, model_copy;  // model_copy may be undefined
};
void adamw_multi_tensor(const std::vector<AdamWTensors>& params, const ops::AdamWConfig& cfg);
double l2_norm_squared(const std::vector<Tensor>& tensors);  // fp32 tensors, deterministic
bool all_finite(const std::vector<Tensor>& tensors);          // fp32 tensors
void scale_all(const std::vector<Tensor>& tensors, float s);  // fp32 tensors, x *= s

}  // namespace megatron::cuda
