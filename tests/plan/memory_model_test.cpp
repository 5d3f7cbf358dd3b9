// This build's memory prediction (plan/memory_model.h) held to the real model, in process: one
// rank of each layout is built over a simulated world (plan/simulated_communicator.h), so TP, PP,
// CP and DP ranks run here with their real shapes.
//  - every chunk's parameter shapes are the model's (model::LanguageModule::parameters());
//  - one micro-batch's saved activations are exactly what the layers' SavedTensor declarations
//    hold after a real forward (model::LanguageModule::activation_bytes), for LayerNorm/GeLU and
//    RMSNorm/SwiGLU/GQA models, q/k norms, TP with and without sequence parallelism, CP over the
//    ring and the all-gather, selective and full (uniform and block) recomputation, and
//    mixture-of-experts layers (top-1 and top-2, a shared expert, a layer pattern, a capacity
//    padded to, under TP, PP (1F1B and interleaved), CP, DP with the distributed optimizer and
//    full recomputation);
//  - the micro-batches in flight are what the pipeline schedules keep (1F1B, interleaved);
//  - the predicted peak of the host allocator is within 10% of the measured one over a few
//    training steps of single-rank and 4-rank layouts (every pipeline stage).
#include "plan/memory_model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <random>
#include <set>

#include "comm/parallel_state.h"
#include "model/language_module.h"
#include "model/stage_model.h"
#include "pipeline/forward_backward.h"
#include "plan/measure.h"
#include "plan/simulated_communicator.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

// A small run: 4 layers, h 64, 4 heads, sequence 32, vocabulary 4100 (Megatron's mock data).
training::TrainingArgs small_run() {
  training::TrainingArgs a;
  model::TransformerConfig& m = a.model;
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.seq_length = 32;
  m.max_position_embeddings = 32;
  m.recompute_num_layers = 1;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.train_iters = 2;
  a.lr = 1e-4;
  a.mock_data = true;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 4100;
  a.eval_iters = 0;
  return a;
}

training::TrainingArgs llama(training::TrainingArgs a) {
  a.model.normalization = "RMSNorm";
  a.model.activation = "swiglu";
  a.model.position_embedding_type = "rope";
  a.model.num_query_groups = 2;
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.ffn_hidden_size = 96;
  return a;
}

struct Case {
  std::string name;
  training::TrainingArgs args;
  int world = 1;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const std::string& name, training::TrainingArgs a, int world,
                 const std::function<void(training::TrainingArgs&)>& f) {
    f(a);
    out.push_back({name, a, world});
  };
  const training::TrainingArgs gpt = small_run(), ll = llama(small_run());
  add("gpt", gpt, 1, [](auto&) {});
  add("llama", ll, 1, [](auto&) {});
  add("qk_layernorm", gpt, 1, [](auto& a) { a.model.qk_layernorm = true; });
  add("selective", ll, 1, [](auto& a) { a.model.recompute_granularity = "selective"; });
  add("full_uniform_2", gpt, 1, [](auto& a) {
    a.model.recompute_granularity = "full";
    a.model.recompute_method = "uniform";
    a.model.recompute_num_layers = 2;
  });
  add("full_block_3", ll, 1, [](auto& a) {
    a.model.recompute_granularity = "full";
    a.model.recompute_method = "block";
    a.model.recompute_num_layers = 3;
  });
  add("tp2", gpt, 2, [](auto& a) { a.parallel.tensor_model_parallel_size = 2; });
  add("tp2_sp", ll, 2, [](auto& a) {
    a.parallel.tensor_model_parallel_size = 2;
    a.model.sequence_parallel = true;
  });
  add("cp2_ring", ll, 2, [](auto& a) { a.parallel.context_parallel_size = 2; });
  add("cp2_allgather", gpt, 2, [](auto& a) {
    a.parallel.context_parallel_size = 2;
    a.model.cp_comm_type = "allgather";
  });
  add("pp2", gpt, 2, [](auto& a) { a.parallel.pipeline_model_parallel_size = 2; });
  add("pp2_vp2_tp2_sp", ll, 4, [](auto& a) {
    a.parallel.pipeline_model_parallel_size = 2;
    a.parallel.num_layers_per_virtual_pipeline_stage = 1;
    a.parallel.tensor_model_parallel_size = 2;
    a.model.sequence_parallel = true;
  });
  add("dp2_distopt_bf16", ll, 2, [](auto& a) {
    a.parallel.use_distributed_optimizer = true;
    a.bf16 = true;
  });
  // Mixture of experts (the experts have no biases).
  add("moe_top2", gpt, 1, [](auto& a) {
    a.model.add_bias_linear = false;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 2;
  });
  add("moe_shared_pattern_tp2", ll, 2, [](auto& a) {
    a.parallel.tensor_model_parallel_size = 2;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 2;
    a.model.moe_ffn_hidden_size = 64;
    a.model.moe_shared_expert_intermediate_size = 32;
    a.model.moe_layer_freq = "[1,0,1,1]";
  });
  add("moe_capacity_padded_dp2_distopt_bf16", gpt, 2, [](auto& a) {
    a.model.add_bias_linear = false;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 1;
    a.model.moe_expert_capacity_factor = 0.5f;
    a.model.moe_pad_expert_input_to_capacity = true;
    a.parallel.use_distributed_optimizer = true;
    a.bf16 = true;
  });
  add("moe_full_recompute", ll, 1, [](auto& a) {
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 2;
    a.model.moe_layer_freq = "2";
    a.model.recompute_granularity = "full";
    a.model.recompute_method = "uniform";
    a.model.recompute_num_layers = 2;
  });
  // Mixture of experts under pipeline parallelism (a dense layer on the first stage only) and
  // under context parallelism (each rank routes its slice of the sequence).
  add("moe_pp2_pattern", ll, 2, [](auto& a) {
    a.parallel.pipeline_model_parallel_size = 2;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 2;
    a.model.moe_layer_freq = "[0,1,1,1]";
  });
  add("moe_pp2_vp2_dp2", gpt, 4, [](auto& a) {
    a.parallel.pipeline_model_parallel_size = 2;
    a.parallel.num_layers_per_virtual_pipeline_stage = 1;
    a.model.add_bias_linear = false;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 1;
    a.model.moe_layer_freq = "2";
  });
  add("moe_cp2_shared", ll, 2, [](auto& a) {
    a.parallel.context_parallel_size = 2;
    a.model.num_moe_experts = 4;
    a.model.moe_router_topk = 2;
    a.model.moe_shared_expert_intermediate_size = 32;
  });
  add("tp2_pp2_distopt_dp", gpt, 8, [](auto& a) {
    a.parallel.tensor_model_parallel_size = 2;
    a.parallel.pipeline_model_parallel_size = 2;
    a.parallel.use_distributed_optimizer = true;
    a.parallel.overlap_grad_reduce = true;
  });
  return out;
}

plan::PlanInput input_of(const Case& c) { return plan::make_plan_input(c.args, c.world, 4100); }

// The micro-batches of one iteration with random tokens (this rank's CP slice).
std::vector<model::Batch> batches(const plan::PlanInput& in, const ParallelState& ps) {
  std::mt19937 rng(7);
  const int64_t b = in.args.micro_batch_size, s = in.args.model.seq_length;
  std::vector<model::Batch> out;
  for (int64_t m = 0; m < in.num_microbatches; ++m) {
    std::vector<int32_t> tok(size_t(b * s)), pos(size_t(b * s));
    for (int64_t i = 0; i < b * s; ++i) {
      tok[size_t(i)] = int32_t(rng() % 4000);
      pos[size_t(i)] = int32_t(i % s);
    }
    model::Batch g;
    g.tokens = Tensor::from_vector(tok, {b, s});
    g.position_ids = Tensor::from_vector(pos, {b, s});
    g.labels = Tensor::from_vector(tok, {b, s});
    g.loss_mask = Tensor::full({b, s}, 1.0, DType::F32);
    out.push_back(model::slice_for_context_parallel(g, ps.cp_rank(), ps.cp_size()));
  }
  return out;
}

TEST(PlanMemoryModel, ParametersActivationsAndInFlightAreTheModels) {
  omp_set_num_threads(1);  // shapes only: one thread keeps it quick on a busy machine
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const plan::PlanInput in = input_of(c);
    const plan::MemoryPrediction pred = plan::predict_memory(in);
    const ParallelConfig pc = plan::parallel_config(in);
    // The first rank of every pipeline stage.
    for (int stage = 0; stage < in.layout.pp; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      const int rank = plan::first_rank_of_stage(in.layout, stage);
      const ParallelState ps = ParallelState::create(plan::make_simulated_world(pc, rank), pc);
      model::TransformerConfig cfg = in.args.model;
      model::StageModel model(cfg, 1234, ps,
                                 in.args.parallel.num_layers_per_virtual_pipeline_stage);
      ASSERT_EQ(model.num_chunks(), in.layout.vp);
      for (int ch = 0; ch < model.num_chunks(); ++ch) {
        std::vector<int64_t> real;
        for (const model::Parameter* p : model.chunk(ch).parameters())
          real.push_back(p->value.numel());
        EXPECT_EQ(plan::chunk_parameter_numels(in, stage, ch), real) << "chunk " << ch;
      }
      pipeline::ForwardBackwardOptions fb;
      const pipeline::ForwardBackwardResult res =
          pipeline::forward_backward(model, batches(in, ps), fb);
      const plan::StageMemory& st = pred.stages.at(size_t(stage));
      EXPECT_EQ(st.max_in_flight, res.max_in_flight);
      const std::vector<plan::ChunkActivations> act = plan::chunk_activations(in, stage);
      for (int ch = 0; ch < model.num_chunks(); ++ch) {
        // The last forward's micro-batch, or more while a recomputed block's backward runs.
        const double expected = std::max(
            act[size_t(ch)].total(), act[size_t(ch)].embedding + act[size_t(ch)].recompute_live);
        const auto& chunk = dynamic_cast<const model::LanguageModule&>(model.chunk(ch));
        EXPECT_EQ(double(chunk.activation_bytes()), expected) << "chunk " << ch;
      }
    }
  }
}

TEST(PlanMemoryModel, PeakOfTheHostAllocatorWithinTenPercentOfSteps) {
  omp_set_num_threads(1);
  // One case of each kind of layout and memory saving (the others differ only in shapes, which
  // the test above holds exactly).
  const std::set<std::string> kinds = {"llama",
                                       "selective",
                                       "full_uniform_2",
                                       "tp2_sp",
                                       "cp2_ring",
                                       "pp2_vp2_tp2_sp",
                                       "dp2_distopt_bf16",
                                       "tp2_pp2_distopt_dp",
                                       "moe_top2",
                                       "moe_shared_pattern_tp2",
                                       "moe_capacity_padded_dp2_distopt_bf16",
                                       "moe_pp2_pattern",
                                       "moe_cp2_shared"};
  for (const Case& c : cases()) {
    if (!kinds.count(c.name)) continue;
    SCOPED_TRACE(c.name);
    const plan::PlanInput in = input_of(c);
    const plan::MemoryPrediction pred = plan::predict_memory(in);
    for (int stage = 0; stage < in.layout.pp; ++stage) {
      const plan::Measurement m =
          plan::measure_rank(in, plan::first_rank_of_stage(in.layout, stage), 2);
      const double predicted = pred.stages.at(size_t(stage)).peak;
      EXPECT_NEAR(predicted / m.peak_allocated, 1.0, 0.10)
          << "stage " << stage << ": predicted " << predicted << " measured " << m.peak_allocated;
    }
  }
}

}  // namespace
}  // namespace megatron::testing
