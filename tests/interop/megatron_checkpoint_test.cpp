// Megatron-LM's torch checkpoints (training/torch_checkpoint.h) against checkpoints written by
// Debian's torch in Megatron's exact structure (tests/reference/megatron_checkpoint.py: legacy
// names with checkpoint_version 0, 1.0, 2.0 and 3.0 QKV orders, Megatron-Core names with the local
// and Transformer Engine specs, TP2 x PP2 shards, virtual stages, fp32/fp16/bf16, Megatron's
// optimizer wrappers, a distributed optimizer, an untied output layer): every tensor and every
// optimizer moment, main weight and step reads back bit for bit; the trainer's readers load a
// rank's weights and optimizer state; `megatron generate` gives the same log-probs as the same
// weights in our format; what we write torch.load reads into Megatron's module trees and
// optimizer and maps back bit for bit; a converted checkpoint resumes on the same loss curve;
// missing, truncated and malicious files are errors naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/tensor_parallel.h"
#include "optim/optimizer.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/parallel_test_util.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

using interop_testing::bit_equal;
using interop_testing::everything;
using interop_testing::expect_bit_equal;

std::string python(const std::string& args) { return interop_testing::megatron_reference(args); }

// Every variant of the reference script, written once per test process.
const fs::path& variants() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    python("make " + dir.path().string());
    made = true;
  }
  return dir.path();
}

CheckpointOnDisk open(const fs::path& dir) {
  auto c = find_checkpoint(dir, std::nullopt);
  EXPECT_TRUE(c.has_value()) << dir;
  return *c;
}

TEST(MegatronCheckpoint, EveryVariantReadsBitForBit) {
  const std::vector<std::string> names = {
      "legacy_v0_tp2_fp16", "legacy_v1_pp2_fp32", "legacy_v2_tp2pp2_bf16", "legacy_v3_tp2pp2_fp16",
      "core_tp2pp2_bf16",   "core_te_tp2pp2_fp32", "core_pp2_vp2_fp16"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const fs::path dir = variants() / name;
    const json ref = json::parse(mt::read_file(dir / "reference.json"));
    const CheckpointOnDisk c = open(dir / "megatron");
    EXPECT_EQ(c.format, "torch");
    EXPECT_EQ(c.parallel.tensor_model_parallel_size, ref["tp"].get<int>());
    EXPECT_EQ(c.parallel.pipeline_model_parallel_size, ref["pp"].get<int>());
    EXPECT_EQ(c.parallel.virtual_pipeline_model_parallel_size, ref["vp"].get<int>());
    EXPECT_EQ(c.state.iteration, ref["iteration"].get<int64_t>());
    EXPECT_EQ(c.state.consumed_train_samples, ref["consumed_train_samples"].get<int64_t>());
    EXPECT_EQ(c.state.consumed_valid_samples, ref["consumed_valid_samples"].get<int64_t>());
    EXPECT_EQ(c.state.scheduler.max_lr, ref["max_lr"].get<double>());
    EXPECT_EQ(c.state.scheduler.lr_warmup_steps, ref["lr_warmup_steps"].get<int64_t>());
    EXPECT_EQ(c.state.scheduler_num_steps, ref["num_steps"].get<int64_t>());
    EXPECT_EQ(c.state.scheduler.decay_style, optim::LRDecayStyle::Cosine);
    if (!ref["grad_scale"].is_null()) {
      EXPECT_EQ(c.state.grad_scaler.scale, ref["grad_scale"].get<double>());
    }
    EXPECT_EQ(c.state.optimizer_type, "adam");
    const TrainingArgs a = training_args_from_json(c.state.args);
    EXPECT_EQ(a.model.num_layers, 4);
    EXPECT_EQ(a.model.hidden_size, 32);
    EXPECT_EQ(a.model.padded_vocab_size, 64);
    EXPECT_EQ(a.tokenizer.type, "NullTokenizer");
    const MergedCheckpoint m = merge_checkpoint(c, true);
    expect_bit_equal(everything(m), read_safetensors(dir / "reference.safetensors").tensors, name);
  }
}

TEST(MegatronCheckpoint, UnmappableOptimizerStateLoadsTheWeightsAndSaysSo) {
  {  // a distributed optimizer: its state is in distrib_optim.pt
    const fs::path dir = variants() / "core_distributed_tp2";
    const CheckpointOnDisk c = open(dir / "megatron");
    EXPECT_TRUE(c.state.optimizer_type.empty());
    ASSERT_FALSE(c.notes.empty());
    EXPECT_NE(c.notes[0].find("distrib_optim.pt"), std::string::npos) << c.notes[0];
    const MergedCheckpoint m = merge_checkpoint(c, true);
    EXPECT_TRUE(m.optimizer.empty());
    std::map<std::string, Tensor> ref;
    for (auto& [n, t] : read_safetensors(dir / "reference.safetensors").tensors)
      if (n.starts_with("model/")) ref[n] = t;
    expect_bit_equal(everything(m), ref, "distributed");
  }
  {  // no optimizer at all, untied output layer
    const fs::path dir = variants() / "core_no_optimizer_untied";
    const MergedCheckpoint m = merge_checkpoint(open(dir / "megatron"), true);
    EXPECT_TRUE(m.optimizer_type.empty());
    ASSERT_TRUE(m.model.count("output_layer.weight"));
    expect_bit_equal(everything(m), read_safetensors(dir / "reference.safetensors").tensors, "untied");
  }
}

// The trainer's readers (load_model_weights, load_optimizer_state) on one TP x PP rank's file,
// with the parameters a stage of this rank would have (the last stage's tied copy of the embedding
// as the optimizer's shared output_layer.weight).
TEST(MegatronCheckpoint, TheTrainersReadersLoadARanksWeightsAndOptimizer) {
  const fs::path dir = variants() / "legacy_v3_tp2pp2_fp16";
  const CheckpointOnDisk c = open(dir / "megatron");
  const auto ref = read_safetensors(dir / "reference.safetensors").tensors;
  const std::map<std::string, model::WeightSpec> specs = checkpoint_weight_specs(c, nullptr);
  for (int p = 0; p < 2; ++p) {
    for (int t = 0; t < 2; ++t) {
      SCOPED_TRACE(str("tp ", t, " pp ", p));
      CheckpointRank rank;
      rank.tp_size = 2, rank.tp_rank = t, rank.pp_size = 2, rank.pp_rank = p;
      std::vector<model::Parameter> storage;
      std::vector<std::string> names;
      for (const auto& [key, full] : ref) {
        if (!key.starts_with("model/")) continue;
        const std::string n = key.substr(6);
        const bool first = n.starts_with("embedding.") || n.starts_with("decoder.layers.0.") ||
                           n.starts_with("decoder.layers.1.");
        if (first != (p == 0)) continue;
        names.push_back(n);
      }
      if (p == 1) names.push_back("output_layer.weight");  // the tied copy
      storage.resize(names.size());
      model::ParameterList params;
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string src = names[i] == "output_layer.weight" ? "embedding.word_embeddings.weight" : names[i];
        const ShardRule rule = shard_rule(specs.at(src));
        const Tensor shard = split_shard(ref.at("model/" + src), rule, t, 2);
        storage[i].name = names[i];
        storage[i].value = Tensor::zeros(shard.shape(), shard.dtype());
        storage[i].grad = Tensor::zeros(shard.shape(), DType::F32);
        storage[i].partition_dim = rule.dim;
        storage[i].shared = names[i] == "output_layer.weight";
        params.push_back(&storage[i]);
      }
      load_model_weights(c, params, false, rank);
      for (const model::Parameter& prm : storage) {
        if (prm.shared) continue;
        EXPECT_TRUE(bit_equal(prm.value, split_shard(ref.at("model/" + prm.name),
                                                     shard_rule(specs.at(prm.name)), t, 2)))
            << prm.name;
      }
      optim::Optimizer opt(params, optim::OptimizerConfig{});
      load_optimizer_state(c, opt, rank);
      EXPECT_EQ(opt.step_count(), 7);
      for (size_t i = 0; i < storage.size(); ++i) {
        const std::string src = storage[i].shared ? "embedding.word_embeddings.weight" : storage[i].name;
        const ShardRule rule = shard_rule(specs.at(src));
        EXPECT_TRUE(bit_equal(opt.state()[i].exp_avg, split_shard(ref.at("exp_avg/" + src), rule, t, 2))) << src;
        EXPECT_TRUE(bit_equal(opt.state()[i].exp_avg_sq, split_shard(ref.at("exp_avg_sq/" + src), rule, t, 2))) << src;
        EXPECT_TRUE(bit_equal(opt.state()[i].main, split_shard(ref.at("fp32_param/" + src), rule, t, 2))) << src;
      }
    }
  }
  // A run whose layout differs is told how to convert, as for our checkpoints.
  CheckpointRank one;
  const std::string msg = mt::error_of([&] { load_model_weights(c, {}, false, one); });
  EXPECT_NE(msg.find("checkpoint convert"), std::string::npos) << msg;
}

TEST(MegatronCheckpoint, NameSchemesMapBothWays) {
  bool tied = false, qkv = false;
  auto ours = [&](const std::string& n, int offset = 0, bool tied_model = true) {
    return torch_names::to_ours(n, offset, tied_model, &tied, &qkv);
  };
  EXPECT_EQ(ours("language_model.embedding.word_embeddings.weight"), "embedding.word_embeddings.weight");
  EXPECT_EQ(ours("language_model.encoder.layers.3.self_attention.query_key_value.weight", 4),
            "decoder.layers.7.self_attention.linear_qkv.weight");
  EXPECT_TRUE(qkv);
  EXPECT_EQ(ours("language_model.transformer.layers.0.attention.dense.bias"),
            "decoder.layers.0.self_attention.linear_proj.bias");
  EXPECT_EQ(ours("language_model.encoder.layers.1.post_attention_layernorm.weight"),
            "decoder.layers.1.pre_mlp_layernorm.weight");
  EXPECT_EQ(ours("language_model.encoder.layers.1.mlp.dense_h_to_4h.bias"), "decoder.layers.1.mlp.linear_fc1.bias");
  EXPECT_EQ(ours("language_model.encoder.layers.1.mlp.dense_4h_to_h.weight"), "decoder.layers.1.mlp.linear_fc2.weight");
  EXPECT_EQ(ours("language_model.encoder.final_layernorm.bias"), "decoder.final_layernorm.bias");
  EXPECT_EQ(ours("word_embeddings_for_head.weight"), "output_layer.weight");
  EXPECT_TRUE(tied);
  EXPECT_EQ(ours("decoder.layers.2.self_attention.linear_qkv.layer_norm_weight", 2),
            "decoder.layers.4.input_layernorm.weight");
  EXPECT_EQ(ours("decoder.layers.0.mlp.linear_fc1.layer_norm_bias"), "decoder.layers.0.pre_mlp_layernorm.bias");
  EXPECT_FALSE(qkv);
  EXPECT_EQ(ours("decoder.layers.0.self_attention.core_attention._extra_state"), "");
  EXPECT_EQ(ours("output_layer.weight", 0, /*tied_model=*/false), "output_layer.weight");
  EXPECT_FALSE(tied);
  EXPECT_EQ(torch_names::to_megatron("decoder.layers.5.input_layernorm.weight", 4, true),
            "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight");
  EXPECT_EQ(torch_names::to_megatron("decoder.layers.5.input_layernorm.weight", 4, false),
            "decoder.layers.1.input_layernorm.weight");
  for (const char* bert : {"language_model.pooler.dense.weight", "lm_head.dense.weight", "binary_head.weight"}) {
    const std::string msg = mt::error_of([&] { ours(bert); });
    EXPECT_NE(msg.find(bert), std::string::npos) << msg;
    EXPECT_NE(msg.find("GPT"), std::string::npos) << msg;
  }
}

std::string jsonl_results(const std::string& out) {
  std::string r, line;
  std::istringstream in(out);
  while (std::getline(in, line))
    if (line.starts_with("{")) r += line + "\n";
  return r;
}

TEST(MegatronCheckpoint, GenerateGivesTheLogProbsOfTheSameWeightsInOurFormat) {
  const std::string flags =
      " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 32"
      " --tokenizer-type NullTokenizer --vocab-size 60 --make-vocab-size-divisible-by 16"
      " --prompt '1 2 3 4 5' --prompt '9 8 7' --num-tokens-to-generate 4 --top_k 1"
      " --return-log-probs --output-format jsonl 2>&1";
  for (const char* name : {"legacy_v0_tp2_fp16", "legacy_v2_tp2pp2_bf16", "core_te_tp2pp2_fp32"}) {
    SCOPED_TRACE(name);
    const fs::path dir = variants() / name;
    const auto ours = mt::run_cli("generate --load " + (dir / "ours").string() + flags);
    const auto theirs = mt::run_cli("generate --load " + (dir / "megatron").string() + flags);
    ASSERT_EQ(ours.exit_code, 0) << ours.output;
    ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
    EXPECT_NE(jsonl_results(ours.output).find("\"logprobs\""), std::string::npos) << ours.output;
    EXPECT_EQ(jsonl_results(theirs.output), jsonl_results(ours.output));
  }
}

TEST(MegatronCheckpoint, MissingTruncatedAndMaliciousRankFilesNameTheFile) {
  mt::TempDir tmp;
  const fs::path src = variants() / "core_tp2pp2_bf16" / "megatron";
  fs::copy(src, tmp / "ckpt", fs::copy_options::recursive);
  const fs::path it = tmp / "ckpt" / "iter_0000007";
  const fs::path victim = it / "mp_rank_01_001" / kTorchCheckpointFile;
  const std::string good = mt::read_file(victim);
  mt::write_file(victim, good.substr(0, good.size() / 2));
  std::string msg = mt::error_of([&] { merge_checkpoint(open(tmp / "ckpt"), true); });
  EXPECT_NE(msg.find(victim.string()), std::string::npos) << msg;
  fs::remove(victim);
  msg = mt::error_of([&] { open(tmp / "ckpt"); });
  EXPECT_NE(msg.find("mp_rank_01_001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is missing"), std::string::npos) << msg;
  // A rank file that would run os.system under torch.load.
  const fs::path marker = tmp / "MARKER";
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/torch_files.py").string() +
                                 " forbidden " + (tmp / "evil").string() + " " + marker.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::copy_file(tmp / "evil" / "os_system.pt", victim);
  msg = mt::error_of([&] { merge_checkpoint(open(tmp / "ckpt"), true); });
  EXPECT_NE(msg.find("'posix.system'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(victim.string()), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(marker));
  // --load-format says what the folder holds.
  ConvertOptions o;
  o.load = variants() / "core_tp2pp2_bf16" / "megatron";
  o.save = tmp / "out";
  o.load_format = "safetensors";
  msg = mt::error_of([&] { convert_checkpoint(o); });
  EXPECT_NE(msg.find("holds a torch checkpoint"), std::string::npos) << msg;
}

}  // namespace
}  // namespace megatron::training
