// Megatron's theoretical memory formula (megatron_memory.h). Python's arithmetic is kept: integer
// sub-expressions are exact (int64 here), `/` is a true division in double, and every sum and
// product is taken in Python's order, so the doubles match bit for bit.
#include "plan/megatron_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace megatron::plan {

namespace {

constexpr double kBytesPerMegabyte = 1024.0 * 1024.0;

std::string format(const char* fmt, double v) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// compute_weight_and_optimizer_memory(args, verbose=True).
double weight_and_optimizer_memory(const MegatronMemoryArgs& a, MegatronMemoryReport& r) {
  const int64_t query_projection_size = a.kv_channels * a.num_attention_heads;
  const double query_projection_to_hidden_size_ratio =
      double(query_projection_size) / double(a.hidden_size);
  const int64_t num_query_groups =
      a.group_query_attention ? a.num_query_groups : a.num_attention_heads;
  // MoE layers: Megatron's moe_layer_pattern (none without experts).
  int64_t num_moe_layers = 0;
  if (a.num_experts) {
    MG_CHECK(int64_t(a.moe_layer_pattern.size()) == a.num_layers,
             "megatron_theoretical_memory: the MoE layer pattern has ", a.moe_layer_pattern.size(),
             " entries for ", a.num_layers, " layers");
    for (int v : a.moe_layer_pattern) num_moe_layers += v;
  }
  const int64_t num_dense_layers = a.num_layers - num_moe_layers;
  const int64_t num_experts = a.num_experts.value_or(1);
  const int64_t moe_ffn = a.num_experts ? a.moe_ffn_hidden_size : 0;
  const int64_t shared_ffn = a.moe_shared_expert_intermediate_size.value_or(0);
  const int64_t norm_size = a.normalization == "RMSNorm" ? 1 : 2;
  const double self_attn_term =
      double(2 * a.hidden_size * a.hidden_size) *
      ((1.0 + (double(num_query_groups) / double(a.num_attention_heads))) *
       query_projection_to_hidden_size_ratio);
  // 2 * h * (ffn * gated_linear_multiplier + norm_size): an exact integer without SwiGLU (the
  // multiplier is the int 1), a float sum in Python's order with it (3 / 2).
  const double mlp_and_norms = a.swiglu ? double(a.ffn_hidden_size) * 1.5 + double(norm_size)
                                        : double(a.ffn_hidden_size + norm_size);
  const double moe_and_norms =
      a.swiglu ? double(moe_ffn * num_experts) * 1.5 + double(shared_ffn) * 1.5 + double(norm_size)
               : double(moe_ffn * num_experts + shared_ffn + norm_size);
  const double layer_dense = double(2 * a.hidden_size) * mlp_and_norms + self_attn_term;
  const double layer_moe = double(2 * a.hidden_size) * moe_and_norms + self_attn_term;
  const int64_t embedding_size = a.hidden_size * a.padded_vocab_size;
  const int64_t final_layernorm = norm_size * a.hidden_size;
  const int64_t embedding_layers =
      a.untie_embeddings_and_output_weights ? 2 * embedding_size : embedding_size;
  const double block = layer_dense * double(num_dense_layers) +
                       layer_moe * double(num_moe_layers) + double(final_layernorm);
  const double mtp_block = layer_dense * 0.0 + layer_moe * 0.0;
  const double total = block + mtp_block + double(embedding_layers);
  r.transformer_block_parameters = block;
  r.embedding_parameters = double(embedding_layers);
  r.total_parameters = total;
  r.lines.push_back(
      format("Number of parameters in transformer block in billions: % .2f", block / 1e9));
  r.lines.push_back(format("Number of parameters in embedding layers in billions: %.2f",
                           double(embedding_layers) / 1e9));
  r.lines.push_back(format("Total number of parameters in billions: %.2f", total / 1e9));
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;
  double most_loaded = ((block / double(pp)) + mtp_block + double(embedding_size)) / double(tp);
  if (a.untie_embeddings_and_output_weights && pp == 1)
    most_loaded += double(embedding_size) / double(tp);
  r.most_loaded_shard_parameters = most_loaded;
  r.lines.push_back(
      format("Number of parameters in most loaded shard in billions: %.4f", most_loaded / 1e9));
  if (pp > 1) {
    const double other = block / double(pp * tp);
    r.other_shard_parameters = other;
    r.lines.push_back(
        format("Number of parameters in other shards in billions: %.4f", other / 1e9));
  }
  r.bytes_per_parameter =
      a.use_distributed_optimizer ? 6.0 + (12.0 / double(a.data_parallel_size)) : 18.0;
  return most_loaded * r.bytes_per_parameter;
}

// The pipeline terms both activation formulas share: the interleaved schedule's penalty, or the
// 1F1B discount when fewer micro-batches than stages are in flight.
double pipeline_factor(const MegatronMemoryArgs& a, std::optional<int64_t> num_microbatches,
                       double activation, MegatronMemoryReport& r) {
  const int64_t pp = a.pipeline_model_parallel_size;
  if (a.virtual_pipeline_model_parallel_size) {
    const double penalty =
        1.0 + (double(pp - 1) / double(pp * *a.virtual_pipeline_model_parallel_size));
    const int64_t in_flight = int64_t(std::ceil(penalty * double(pp)));
    r.lines.push_back(format("Memory penalty from interleaved schedule: %.2f", penalty));
    r.lines.push_back("Number of in-flight microbatches: " + std::to_string(in_flight));
    r.in_flight_microbatches = in_flight;
    activation *= penalty;
  }
  if (!a.virtual_pipeline_model_parallel_size && pp > 1) {
    int64_t in_flight = pp;
    if (num_microbatches) {
      // Python's min(1, M / PP): the int 1 unless the quotient is smaller.
      const double q = double(*num_microbatches) / double(pp);
      activation *= q < 1.0 ? q : 1.0;
      in_flight = std::min(*num_microbatches, pp);
    }
    r.lines.push_back("Number of in-flight microbatches: " + std::to_string(in_flight));
    r.in_flight_microbatches = in_flight;
  }
  return activation;
}

// compute_activation_memory (sequence parallelism with selective recomputation).
double activation_memory_sp(const MegatronMemoryArgs& a, std::optional<int64_t> num_microbatches,
                            MegatronMemoryReport& r) {
  const int64_t sbh = a.seq_length * a.micro_batch_size * a.hidden_size;
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;
  double act = double(sbh) * (18.0 + (4.0 * (double(a.ffn_hidden_size) / double(a.hidden_size))));
  r.lines.push_back(format("Activation memory footprint per transformer layer: %.1f MB",
                           act / kBytesPerMegabyte / double(tp)));
  act *= double(a.num_layers);
  act += double(8 * a.seq_length * a.micro_batch_size * pp);
  act += double(sbh * pp);
  act = pipeline_factor(a, num_microbatches, act, r);
  if (pp == 1)
    act += double(sbh * 4) * (1.0 + (double(a.padded_vocab_size) / double(a.hidden_size)));
  return act / double(tp);
}

// compute_activation_memory_without_sp (every other combination).
double activation_memory_without_sp(const MegatronMemoryArgs& a,
                                    std::optional<int64_t> num_microbatches,
                                    MegatronMemoryReport& r) {
  const int64_t sbh = a.seq_length * a.micro_batch_size * a.hidden_size;
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;
  const double per_layer = double(sbh) * (10.0 + (24.0 / double(tp)));
  r.lines.push_back(
      format("Activation memory footprint per transformer layer (precise, without SP): %.1f MB",
             per_layer / kBytesPerMegabyte));
  double act = per_layer * double(a.num_layers);
  act += double(8 * a.seq_length * a.micro_batch_size * pp);
  act += double(sbh * pp);
  act = pipeline_factor(a, num_microbatches, act, r);
  if (pp == 1) {
    const double logits =
        double(a.seq_length * a.micro_batch_size * a.padded_vocab_size) / double(tp);
    const int64_t final_ln_output = sbh;
    act += (logits + double(final_ln_output)) * 2.0;
  }
  return act * 1.05;
}

}  // namespace

MegatronMemoryReport megatron_theoretical_memory(const MegatronMemoryArgs& a,
                                                 std::optional<int64_t> num_microbatches) {
  MG_CHECK(a.num_layers > 0 && a.hidden_size > 0 && a.num_attention_heads > 0 &&
               a.tensor_model_parallel_size > 0 && a.pipeline_model_parallel_size > 0 &&
               a.data_parallel_size > 0,
           "megatron_theoretical_memory: unresolved arguments");
  MegatronMemoryReport r;
  r.weight_and_optimizer_bytes = weight_and_optimizer_memory(a, r);
  r.weight_and_optimizer_mb = r.weight_and_optimizer_bytes / kBytesPerMegabyte;
  r.sequence_parallel_formula = a.sequence_parallel && a.recompute_granularity == model::RecomputeGranularityId::selective;
  if (r.sequence_parallel_formula) {
    r.lines.push_back("compute_activation_memory with SP");
    r.activation_bytes = activation_memory_sp(a, num_microbatches, r);
  } else {
    r.lines.push_back("compute_activation_memory_without_sp");
    r.activation_bytes = activation_memory_without_sp(a, num_microbatches, r);
  }
  r.activation_mb = r.activation_bytes / kBytesPerMegabyte;
  r.total_mb = r.weight_and_optimizer_mb + r.activation_mb;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, "
                "total=%.2f MB",
                r.weight_and_optimizer_mb, r.activation_mb, r.total_mb);
  r.lines.push_back(buf);
  return r;
}

}  // namespace megatron::plan
