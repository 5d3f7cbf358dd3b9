// The CUDA backend's op table (cuda_backend.h), registered for DeviceType::CUDA by cuda::init.
// tests/cuda/cuda_op_table_test.cpp fails while an op of MG_FOR_EACH_OP has no entry here; the
// kind-taking ops have a kernel for every kind (norm.cu, activation.cu do not compile otherwise).
// Built only with the CUDA backend (MEGATRON_HAVE_CUDA).
#ifdef MEGATRON_HAVE_CUDA

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace megatron::cuda {

namespace {

// Designated initializers follow MG_FOR_EACH_OP's order.
constinit const ops::OpTable kOps = {
    .gemm = &cuda::gemm,
    .gemm_batched = &cuda::gemm_batched,
    .embedding_fwd = &cuda::embedding_fwd,
    .embedding_bwd = &cuda::embedding_bwd,
    .vocab_parallel_embedding_fwd = &cuda::vocab_parallel_embedding_fwd,
    .vocab_parallel_embedding_bwd = &cuda::vocab_parallel_embedding_bwd,
    .norm_fwd = &cuda::norm_fwd,
    .norm_bwd = &cuda::norm_bwd,
    .activation_fwd = &cuda::activation_fwd,
    .activation_bwd = &cuda::activation_bwd,
    .bias_add = &cuda::bias_add,
    .bias_grad = &cuda::bias_grad,
    .add = &cuda::add,
    .scale = &cuda::scale,
    .tanh_fwd = &cuda::tanh_fwd,
    .tanh_bwd = &cuda::tanh_bwd,
    .index_select_rows = &cuda::index_select_rows,
    .index_copy_rows = &cuda::index_copy_rows,
    .copy_to_flat = &cuda::copy_to_flat,
    .copy_from_flat = &cuda::copy_from_flat,
    .dropout_fwd = &cuda::dropout_fwd,
    .dropout_bwd = &cuda::dropout_bwd,
    .bias_dropout_add_fwd = &cuda::bias_dropout_add_fwd,
    .bias_dropout_add_bwd = &cuda::bias_dropout_add_bwd,
    .attention_fwd = &cuda::attention_fwd,
    .attention_bwd = &cuda::attention_bwd,
    .attention_merge = &cuda::attention_merge,
    .rope_fwd = &cuda::rope_fwd,
    .rope_bwd = &cuda::rope_bwd,
    .kv_cache_append = &cuda::kv_cache_append,
    .softmax_xent_fwd_bwd = &cuda::softmax_xent_fwd_bwd,
    .vocab_parallel_xent_max = &cuda::vocab_parallel_xent_max,
    .vocab_parallel_xent_partials = &cuda::vocab_parallel_xent_partials,
    .vocab_parallel_xent_loss = &cuda::vocab_parallel_xent_loss,
    .vocab_parallel_xent_bwd = &cuda::vocab_parallel_xent_bwd,
    .adamw_step = &cuda::adamw_step,
    .sgd_step = &cuda::sgd_step,
    .l2_norm_squared = &cuda::l2_norm_squared,
    .l2_norm_squared_each = &cuda::l2_norm_squared_each,
    .sum = &cuda::sum,
    .dot = &cuda::dot,
    .all_finite = &cuda::all_finite,
    .int_range = &cuda::int_range,
    .cast = &cuda::cast,
};

}  // namespace

const ops::OpTable& op_table() { return kOps; }

}  // namespace megatron::cuda

#endif  // MEGATRON_HAVE_CUDA
