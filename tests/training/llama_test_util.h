// Helpers of the Llama pretraining parity tests (llama_training_test.cpp,
// llama_half_precision_test.cpp): the tiny GPT of parallel_test_util.h built as a Llama (RMSNorm,
// rotary embeddings, SwiGLU, grouped-query attention with 2 query groups for 4 heads, no biases,
// untied output layer; 4 layers) and the parallel layouts it trains in.
#pragma once

#include <string>
#include <utility>

#include "model/model_test_util.h"
#include "parallel_test_util.h"

namespace megatron::training::parallel_test {

inline TrainingArgs llama_args(const Fixture& f, int64_t iters = 20) {
  TrainingArgs a = f.args(iters);
  model::testing::make_llama_style(a.model);
  return a;
}

struct Layout {
  Layout(std::string name_, int tp_, int pp_ = 1, int vstage = 0, int cp_ = 1, bool sp_ = false,
         bool dist_opt_ = false, bool overlap_ = false, bool param_gather_ = false,
         std::string cp_comm_ = "p2p", std::string recompute_ = "")
      : name(std::move(name_)), tp(tp_), pp(pp_), layers_per_virtual_stage(vstage), cp(cp_),
        sp(sp_), dist_opt(dist_opt_), overlap(overlap_), param_gather(param_gather_),
        cp_comm(std::move(cp_comm_)), recompute(std::move(recompute_)) {}
  std::string name;
  int tp, pp, layers_per_virtual_stage, cp;
  bool sp, dist_opt, overlap, param_gather;
  std::string cp_comm;
  std::string recompute;  // "", "full", "selective"
};

inline TrainingArgs with_layout(TrainingArgs a, const Layout& l) {
  a.parallel.tensor_model_parallel_size = l.tp;
  a.parallel.pipeline_model_parallel_size = l.pp;
  a.parallel.num_layers_per_virtual_pipeline_stage = l.layers_per_virtual_stage;
  a.parallel.context_parallel_size = l.cp;
  a.model.sequence_parallel = l.sp;
  a.model.cp_comm_type = l.cp_comm;
  a.parallel.use_distributed_optimizer = l.dist_opt;
  a.parallel.overlap_grad_reduce = l.overlap;
  a.parallel.overlap_param_gather = l.param_gather;
  if (l.overlap) a.parallel.ddp_bucket_size = 3000;
  if (l.recompute == "full") {
    a.model.recompute_granularity = "full";
    a.model.recompute_method = "uniform";
    a.model.recompute_num_layers = 1;
  } else if (l.recompute == "selective") {
    a.model.recompute_granularity = "selective";
  }
  return a;
}

}  // namespace megatron::training::parallel_test
