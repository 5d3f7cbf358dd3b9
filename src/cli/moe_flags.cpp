// The mixture-of-experts flags (see moe_flags.h). Names, defaults and help follow Megatron's
// _add_moe_args.
#include "cli/moe_flags.h"

#include "core/error.h"
#include "core/log.h"
#include "model/moe/token_dispatcher.h"

namespace megatron::cli {

void MoeFlags::add(CLI::App& s, model::TransformerConfig* c) {
  s.add_option("--num-experts", c->num_moe_experts, "Number of experts in the MoE layers");
  s.add_option("--moe-layer-freq", c->moe_layer_freq,
               "MoE layer frequency: k (every k-th layer) or a list pattern such as "
               "\"([1]*3+[0]*1)*2\"")->capture_default_str();
  s.add_option("--moe-ffn-hidden-size", c->moe_ffn_hidden_size,
               "Expert MLP width (default --ffn-hidden-size)");
  s.add_option("--moe-shared-expert-intermediate-size", c->moe_shared_expert_intermediate_size,
               "Width of the shared expert (0: none)");
  s.add_flag("--moe-shared-expert-gate", c->moe_shared_expert_gate,
             "Scale the shared expert's output per token by a sigmoid gate");
  s.add_flag("--moe-shared-expert-overlap", shared_expert_overlap,
             "Overlap the shared expert with dispatch (no effect here)");
  s.add_option("--moe-router-topk", c->moe_router_topk, "Experts per token")->capture_default_str();
  s.add_option("--moe-router-score-function", c->moe_router_score_function, "softmax | sigmoid")
      ->capture_default_str();
  s.add_flag("--moe-router-pre-softmax", c->moe_router_pre_softmax,
             "Softmax over all experts before the top-k");
  s.add_option("--moe-router-topk-scaling-factor", c->moe_router_topk_scaling_factor,
               "Scale of the top-k routing probabilities");
  s.add_option("--moe-router-num-groups", c->moe_router_num_groups,
               "Expert groups of group-limited routing");
  s.add_option("--moe-router-group-topk", c->moe_router_group_topk,
               "Groups each token may use in group-limited routing");
  s.add_flag("--moe-router-enable-expert-bias", c->moe_router_enable_expert_bias,
             "Aux-loss-free balancing: a per-expert bias on the routing scores");
  s.add_option("--moe-router-bias-update-rate", c->moe_router_bias_update_rate,
               "Expert-bias step per iteration")->capture_default_str();
  s.add_flag("--moe-router-force-load-balancing", c->moe_router_force_load_balancing,
             "Route by random logits (benchmarks)");
  s.add_option("--moe-router-load-balancing-type", load_balancing_type,
               "aux_loss | seq_aux_loss | global_aux_loss | sinkhorn | none (default aux_loss)");
  s.add_option("--moe-aux-loss-coeff", aux_loss_coeff, "Load-balancing loss coefficient (0)");
  s.add_option("--moe-z-loss-coeff", c->moe_z_loss_coeff, "Router z-loss coefficient (none)");
  s.add_option("--moe-expert-capacity-factor", c->moe_expert_capacity_factor,
               "Expert capacity factor (none: no token dropping)");
  s.add_option("--moe-token-drop-policy", c->moe_token_drop_policy, "probs | position")
      ->capture_default_str();
  s.add_flag("--moe-pad-expert-input-to-capacity", c->moe_pad_expert_input_to_capacity,
             "Pad every expert's tokens to its capacity");
  s.add_option("--moe-router-dtype", router_dtype, "fp32 | fp64 (routing precision)");
  s.add_flag("--moe-grouped-gemm", grouped_gemm, "Grouped GEMM over the local experts");
  s.add_flag("--moe-per-layer-logging", per_layer_logging, "Log the MoE losses per layer");
  s.add_option("--moe-token-dispatcher-type", token_dispatcher_type,
               "allgather | alltoall | flex")->capture_default_str();
  s.add_option("--expert-model-parallel-size", expert_model_parallel_size,
               "Expert-parallel size")->capture_default_str();
  s.add_option("--expert-tensor-parallel-size", expert_tensor_parallel_size,
               "Expert tensor-parallel size (default: the tensor-parallel size)");
}

void MoeFlags::apply(training::TrainingArgs& a) const {
  model::TransformerConfig& c = a.model;
  auto one = [](const std::vector<std::string>& v, const char* flag) {
    MG_REQUIRE(v.size() <= 1, flag, " got ", v.size(), " values: Megatron-Core can combine "
               "several load-balancing losses, each with its coefficient, but this build takes "
               "one type (aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none) with one "
               "coefficient; give one");
    return v.empty() ? std::string() : v[0];
  };
  if (const std::string t = one(load_balancing_type, "--moe-router-load-balancing-type"); !t.empty())
    c.moe_router_load_balancing_type = t;
  if (const std::string k = one(aux_loss_coeff, "--moe-aux-loss-coeff"); !k.empty()) {
    char* end = nullptr;
    c.moe_aux_loss_coeff = std::strtof(k.c_str(), &end);
    MG_REQUIRE(end != nullptr && *end == '\0', "--moe-aux-loss-coeff '", k, "' is not a number");
  }
  MG_REQUIRE(expert_model_parallel_size >= 1, "--expert-model-parallel-size must be >= 1");
  // Megatron-Core's TransformerConfig: expert and tensor parallelism together need sequence
  // parallelism.
  MG_REQUIRE(expert_model_parallel_size == 1 || a.parallel.tensor_model_parallel_size == 1 ||
                 a.model.sequence_parallel,
             "--expert-model-parallel-size ", expert_model_parallel_size,
             " with --tensor-model-parallel-size ", a.parallel.tensor_model_parallel_size,
             ": when using expert parallelism and tensor parallelism, sequence parallelism must "
             "be used (as in Megatron-Core); add --sequence-parallel");
  const int tp = a.parallel.tensor_model_parallel_size;
  MG_REQUIRE(expert_tensor_parallel_size >= 0, "--expert-tensor-parallel-size must be >= 1");
  // Parallel folding: experts sharded otherwise than the dense layers take tokens from other
  // tensor-parallel ranks, so those must hold different tokens.
  MG_REQUIRE(expert_tensor_parallel_size == 0 || expert_tensor_parallel_size == tp || tp == 1 ||
                 a.model.sequence_parallel,
             "--expert-tensor-parallel-size ", expert_tensor_parallel_size, " differs from "
             "--tensor-model-parallel-size ", tp, ": the experts then take tokens from other "
             "tensor-parallel ranks, which needs --sequence-parallel; add it");
  c.moe_token_dispatcher_type = token_dispatcher_type;
  model::parse_dispatcher_kind(token_dispatcher_type);  // refuses flex and unknown names
  a.parallel.expert_model_parallel_size = expert_model_parallel_size;
  a.parallel.expert_tensor_parallel_size = expert_tensor_parallel_size;
  if (expert_model_parallel_size > 1) {
    MG_REQUIRE(c.num_moe_experts > 0, "--expert-model-parallel-size ", expert_model_parallel_size,
               " without --num-experts: the model has no experts to spread");
    MG_REQUIRE(c.num_moe_experts % expert_model_parallel_size == 0, "--num-experts ",
               c.num_moe_experts, " is not divisible by --expert-model-parallel-size ",
               expert_model_parallel_size, ": every expert-parallel rank holds the same number "
               "of experts");
  }
  c.moe_grouped_gemm = grouped_gemm;
  a.moe_per_layer_logging = per_layer_logging;
  MG_REQUIRE(router_dtype.empty() || router_dtype == "fp32" || router_dtype == "fp64",
             "--moe-router-dtype '", router_dtype, "' is not one of: fp32, fp64");
  MG_REQUIRE(router_dtype != "fp64", "--moe-router-dtype fp64: the gate's logits are computed in "
             "fp32 (and routed in double precision); use fp32 or leave the flag out");
  if (c.num_moe_experts == 0) {
    MG_REQUIRE(!shared_expert_overlap && !grouped_gemm,
               "MoE flags without --num-experts: the model has no MoE layers");
    return;
  }
  if (shared_expert_overlap)
    log_info("note: --moe-shared-expert-overlap has no effect here: the shared expert runs "
             "after the routed experts (the same numbers)");
  if (token_dispatcher_type == "alltoall" && expert_model_parallel_size == 1)
    log_info("note: --moe-token-dispatcher-type alltoall at expert-parallel size 1 dispatches "
             "locally, as allgather does (the same numbers)");
}

}  // namespace megatron::cli
