// `megatron plan`'s Megatron-LM theoretical memory report against an independent Python
// transcription of megatron/training/theoretical_memory_usage.py and the argument processing that
// feeds it (tests/reference/theoretical_memory_usage.py): for a grid of command lines (GPT-2,
// Llama with GQA and SwiGLU, MQA, TP/PP/VPP/CP/DP, sequence parallelism, selective and full
// recomputation, with and without the distributed optimizer; mixture of experts with top-1 and
// top-2 routing, a shared expert, --moe-layer-freq as an integer and as a list pattern, SwiGLU
// experts) the byte counts are the same doubles and the printed lines the same text.
#include "plan/megatron_memory.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace megatron::testing {
namespace {

struct PlanRun {
  std::string flags;  // model and layout flags (Megatron's names)
  int world;
  int64_t vocab;
};

// The rest of a valid pretrain-gpt command line.
const char* kCommon = " --train-iters 10 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer";

const std::vector<PlanRun>& grid() {
  static const std::vector<PlanRun> runs = {
      // GPT-2 small on one rank, and the 345M walkthrough's shape.
      {"--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
       "--micro-batch-size 4 --global-batch-size 32",
       1, 50257},
      {"--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--micro-batch-size 8 --global-batch-size 64 --tensor-model-parallel-size 2 "
       "--pipeline-model-parallel-size 2 --use-distributed-optimizer",
       8, 50257},
      // Sequence parallelism with selective recomputation: the SP formula.
      {"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
       "--micro-batch-size 1 --global-batch-size 16 --tensor-model-parallel-size 4 "
       "--sequence-parallel --recompute-activations",
       8, 50257},
      {"--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 512 "
       "--micro-batch-size 2 --global-batch-size 48 --tensor-model-parallel-size 2 "
       "--pipeline-model-parallel-size 2 --sequence-parallel --recompute-granularity selective "
       "--use-distributed-optimizer",
       12, 50257},
      // Llama-style: RMSNorm, SwiGLU, GQA, untied, rotary, no biases, bf16.
      {"--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
       "--num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm "
       "--untie-embeddings-and-output-weights --position-embedding-type rope "
       "--disable-bias-linear --bf16 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 "
       "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel "
       "--recompute-activations --use-distributed-optimizer",
       64, 128256},
      // SwiGLU without --ffn-hidden-size: Megatron's own width int(8h/3 / 64) * 64.
      {"--num-layers 8 --hidden-size 1000 --num-attention-heads 8 --swiglu --normalization RMSNorm "
       "--untie-embeddings-and-output-weights --seq-length 256 --micro-batch-size 2 "
       "--tensor-model-parallel-size 2",
       2, 32000},
      // Multi-query attention; an explicit head width (query projection != hidden size).
      {"--num-layers 6 --hidden-size 512 --num-attention-heads 8 --kv-channels 96 "
       "--group-query-attention --num-query-groups 1 --seq-length 512 --micro-batch-size 3 "
       "--global-batch-size 9",
       3, 50257},
      // Interleaved pipeline (VP 2), and VP 1 (Megatron still applies its penalty).
      {"--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--micro-batch-size 2 --global-batch-size 64 --pipeline-model-parallel-size 4 "
       "--num-layers-per-virtual-pipeline-stage 2",
       8, 50257},
      {"--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 512 "
       "--micro-batch-size 1 --global-batch-size 8 --pipeline-model-parallel-size 4 "
       "--num-layers-per-virtual-pipeline-stage 2",
       4, 50257},
      // 1F1B with fewer micro-batches than stages.
      {"--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 512 "
       "--micro-batch-size 2 --global-batch-size 4 --pipeline-model-parallel-size 4",
       4, 50257},
      // Full recomputation (the formula without SP), with and without SP.
      {"--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
       "--micro-batch-size 4 --global-batch-size 16 --recompute-granularity full "
       "--recompute-method uniform --recompute-num-layers 1 --tensor-model-parallel-size 2 "
       "--sequence-parallel",
       4, 50257},
      {"--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
       "--micro-batch-size 4 --global-batch-size 16 --recompute-granularity full "
       "--recompute-method block --recompute-num-layers 2",
       1, 50257},
      // Context parallelism (DP = world / (TP x PP x CP)); DP 7: 12 / 7 is inexact.
      {"--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 2048 "
       "--micro-batch-size 1 --global-batch-size 8 --context-parallel-size 2 "
       "--use-distributed-optimizer",
       8, 50257},
      {"--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 "
       "--micro-batch-size 1 --global-batch-size 14 --use-distributed-optimizer",
       7, 50257},
      // Untied output layer on one pipeline stage over TP, LayerNorm with biases.
      {"--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 128 "
       "--micro-batch-size 2 --global-batch-size 8 --untie-embeddings-and-output-weights "
       "--tensor-model-parallel-size 4",
       4, 50257},
      // Mixture of experts. Top-1 over 8 experts of their own width, TP 2 x DP 2, distributed
      // optimizer.
      {"--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512 "
       "--micro-batch-size 2 --global-batch-size 8 --disable-bias-linear --num-experts 8 "
       "--moe-router-topk 1 --moe-ffn-hidden-size 1024 --tensor-model-parallel-size 2 "
       "--use-distributed-optimizer",
       4, 50257},
      // Top-2 SwiGLU experts with a shared expert, a dense first layer in every three
      // (--moe-layer-freq as a list pattern), GQA, selective recomputation, TP 4.
      {"--num-layers 6 --hidden-size 1024 --num-attention-heads 16 --group-query-attention "
       "--num-query-groups 4 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights "
       "--position-embedding-type rope --disable-bias-linear --bf16 --num-experts 16 "
       "--moe-router-topk 2 --moe-ffn-hidden-size 704 --moe-shared-expert-intermediate-size 1408 "
       "--moe-layer-freq '([0]+[1]*2)*2' --seq-length 1024 --micro-batch-size 1 "
       "--global-batch-size 8 --tensor-model-parallel-size 4 --recompute-activations",
       8, 32000},
      // SwiGLU experts of the default width (Megatron's FFN width, int(8h/3 / 64) * 64), every
      // other layer MoE (--moe-layer-freq 2), DP 2.
      {"--num-layers 8 --hidden-size 1000 --num-attention-heads 8 --swiglu --normalization RMSNorm "
       "--disable-bias-linear --num-experts 4 --moe-layer-freq 2 --seq-length 256 "
       "--micro-batch-size 2",
       2, 32000},
      // Mixtral 8x7B's shape: top-2 of 8 SwiGLU experts, TP 8 x DP 8, full recomputation.
      {"--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
       "--num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm "
       "--untie-embeddings-and-output-weights --position-embedding-type rope --disable-bias-linear "
       "--bf16 --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.02 --seq-length 4096 "
       "--micro-batch-size 1 --global-batch-size 64 --tensor-model-parallel-size 8 "
       "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
       "--use-distributed-optimizer",
       64, 32000},
  };
  return runs;
}

// "--a-b 3 --c" -> {"a_b": 3, "c": true}: the Python side's flags.
nlohmann::json python_flags(const std::string& flags) {
  nlohmann::json j = nlohmann::json::object();
  std::istringstream in(flags);
  std::vector<std::string> toks;
  for (std::string t; in >> t;) toks.push_back(t);
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string key = toks[i].substr(2);
    for (char& c : key)
      if (c == '-') c = '_';
    if (i + 1 < toks.size() && toks[i + 1].rfind("--", 0) != 0) {
      std::string v = toks[++i];
      if (v.size() >= 2 && v.front() == '\'' && v.back() == '\'') v = v.substr(1, v.size() - 2);
      const bool number = v.find_first_not_of("0123456789") == std::string::npos;
      j[key] = number ? nlohmann::json(std::stoll(v)) : nlohmann::json(v);
    } else {
      j[key] = true;
    }
  }
  return j;
}

TEST(PlanMegatronMemory, EqualsPythonTranscriptionToTheByte) {
  nlohmann::json runs = nlohmann::json::array();
  std::vector<nlohmann::json> ours;
  for (const PlanRun& r : grid()) {
    const std::string cmd = "plan " + r.flags + kCommon + " --vocab-size " +
                            std::to_string(r.vocab) + " --world-size " + std::to_string(r.world) +
                            " --json 2>&1";
    CommandResult c = run_cli(cmd);
    ASSERT_EQ(c.exit_code, 0) << cmd << "\n" << c.output;
    ours.push_back(nlohmann::json::parse(c.output.substr(c.output.find('{'))));
    runs.push_back(
        {{"flags", python_flags(r.flags)}, {"world_size", r.world}, {"vocab_size", r.vocab}});
  }
  TempDir dir;
  write_file(dir / "runs.json", runs.dump());
  CommandResult py =
      run_command("/usr/bin/python3 " +
                  (source_dir() / "tests/reference/theoretical_memory_usage.py").string() + " < " +
                  (dir / "runs.json").string());
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const nlohmann::json ref = nlohmann::json::parse(py.output);
  ASSERT_EQ(ref.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    SCOPED_TRACE(grid()[i].flags);
    const nlohmann::json& m = ours[i]["megatron"];
    EXPECT_EQ(ours[i]["padded_vocab_size"].get<int64_t>(),
              ref[i]["padded_vocab_size"].get<int64_t>());
    // Bit-identical doubles (both sides print round-trip representations).
    for (const char* k : {"weight_and_optimizer_bytes", "activation_bytes",
                          "weight_and_optimizer_mb", "activation_mb", "total_mb"})
      EXPECT_EQ(m[k].get<double>(), ref[i][k].get<double>()) << k;
    EXPECT_EQ(m["lines"], ref[i]["lines"]);
  }
}

// The text output carries Megatron's own closing line, and the formula's branches show in it.
TEST(PlanMegatronMemory, PrintsMegatronsLines) {
  const PlanRun& r = grid()[2];  // SP + selective
  CommandResult c =
      run_cli("plan " + r.flags + kCommon + " --vocab-size 50257 --world-size 8 2>&1");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("compute_activation_memory with SP\n"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("Theoretical memory footprints: weight and optimizer="),
            std::string::npos);
  EXPECT_NE(c.output.find("Number of parameters in transformer block in billions:  1.21"),
            std::string::npos)
      << c.output;  // Python's "{: .2f}" keeps a space for the sign
}

// GPT-2 small (h 768, 12 layers, V 50304) on one rank, sequence 1024, micro-batch 4.
plan::MegatronMemoryArgs gpt2_small() {
  plan::MegatronMemoryArgs a;
  a.num_layers = 12;
  a.hidden_size = 768;
  a.num_attention_heads = 12;
  a.kv_channels = 64;
  a.ffn_hidden_size = 3072;
  a.padded_vocab_size = 50304;
  a.seq_length = 1024;
  a.micro_batch_size = 4;
  return a;
}

// A worked example by hand: GPT-2 small, one rank.
TEST(PlanMegatronMemory, WorkedExample) {
  plan::MegatronMemoryArgs a = gpt2_small();
  const plan::MegatronMemoryReport r = plan::megatron_theoretical_memory(a, 8);
  // Per layer 2h(F + 2) + 2h^2 (1 + 1) = 7,080,960; block 12 x that + 2h = 84,973,056;
  // embedding 38,633,472; 18 bytes each.
  EXPECT_EQ(r.transformer_block_parameters, 84973056.0);
  EXPECT_EQ(r.most_loaded_shard_parameters, 84973056.0 + 38633472.0);
  EXPECT_EQ(r.weight_and_optimizer_bytes, (84973056.0 + 38633472.0) * 18);
  // Without SP: s b h (10 + 24) per layer, x 12, + 8 s b + s b h, + (s b V + s b h) x 2, x 1.05.
  const double sbh = 1024.0 * 4 * 768;
  const double expected =
      ((sbh * 34 * 12 + 8 * 1024 * 4 + sbh) + (1024.0 * 4 * 50304 + sbh) * 2) * 1.05;
  EXPECT_DOUBLE_EQ(r.activation_bytes, expected);
  EXPECT_FALSE(r.in_flight_microbatches.has_value());
}

// A worked example with experts by hand: the same model with every other layer an MoE layer of
// 8 experts of width 1024 and a shared expert of 512, on TP 2 with the distributed optimizer
// over DP 4. The activations do not change (Megatron's formulas leave the experts out).
TEST(PlanMegatronMemory, WorkedExampleWithExperts) {
  plan::MegatronMemoryArgs a = gpt2_small();
  const double dense_activations = plan::megatron_theoretical_memory(a, 8).activation_bytes;
  a.num_experts = 8;
  a.moe_ffn_hidden_size = 1024;
  a.moe_shared_expert_intermediate_size = 512;
  a.moe_layer_pattern = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
  const plan::MegatronMemoryReport r = plan::megatron_theoretical_memory(a, 8);
  // Dense layer 7,080,960 as above; MoE layer 2h(8 x 1024 + 512 + 2) + 2h^2 (1 + 1) =
  // 2 x 768 x 8706 + 2,359,296 = 15,731,712; 6 of each plus the final norm (1536).
  const double block = 6 * 7080960.0 + 6 * 15731712.0 + 1536;
  EXPECT_EQ(r.transformer_block_parameters, block);
  EXPECT_EQ(r.most_loaded_shard_parameters, block + 38633472.0);
  a.tensor_model_parallel_size = 2;
  a.use_distributed_optimizer = true;
  a.data_parallel_size = 4;
  const plan::MegatronMemoryReport sharded = plan::megatron_theoretical_memory(a, 8);
  EXPECT_EQ(sharded.most_loaded_shard_parameters, (block + 38633472.0) / 2);
  EXPECT_EQ(sharded.bytes_per_parameter, 6 + 12.0 / 4);
  EXPECT_EQ(r.activation_bytes, dense_activations);
}

}  // namespace
}  // namespace megatron::testing
