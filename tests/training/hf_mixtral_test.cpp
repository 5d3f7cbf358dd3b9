// Hugging Face mixture-of-experts classes, MixtralForCausalLM and Qwen2MoeForCausalLM, through
// `checkpoint convert`, checked against an independent PyTorch Mixtral and Qwen2-MoE written from
// transformers' modeling_mixtral.py and modeling_qwen2_moe.py definitions
// (tests/reference/mixtral_reference.py: hand-written safetensors, float64 forward with the
// softmax / top-k (/ renormalise) router, SwiGLU experts, the shared expert and its sigmoid gate,
// dense layers between MoE layers, grouped-query rotary attention, q/k/v biases and the
// sliding-window mask):
//   - a Mixtral folder the reference writes (4 experts, top-2, GQA, sliding_window 4 over 11-token
//     sequences, rope_theta 500) imports; `generate` on the import gives the reference's
//     log-probs of prompt + greedy continuation within 1e-5, and on the import resharded to
//     TP2 x PP2 (Qwen2-MoE: TP2) the same tokens and log-probs (1e-5); the window matters:
//     without it the reference differs by more than 1e-3; `evaluate` runs on it; the export of
//     the import is the reference's folder bit for bit (every tensor, transformers' names) and
//     its config.json carries every key of the reference's. The same for a Qwen2-MoE folder (a dense middle
//     layer, shared experts with their gate, norm_topk_prob false, q/k/v biases);
//   - a Mixtral-shaped and a Qwen2-MoE-shaped model trained here export to MixtralForCausalLM and
//     Qwen2MoeForCausalLM, and the reference's log-probs equal `generate`'s on the checkpoint
//     within 1e-5; the Mixtral one trained with grouped experts (--moe-grouped-gemm) exports to
//     the same folder;
//   - settings the classes cannot express are refused by name; malformed folders are errors
//     naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf_reference_util.h"
#include "model/model_test_util.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/hf_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;
using namespace parallel_test;

// Runs tests/reference/mixtral_reference.py; its JSON output.
json mixtral_reference(const std::string& args) {
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/mixtral_reference.py").string() +
                                 " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find('{');
  return at == std::string::npos ? json() : json::parse(r.output.substr(at));
}

// The reference's log-probs of `gen`'s token sequences from `folder`, compared with `gen`'s; the
// router's margin (k-th against (k+1)-th probability) must be far above float32 rounding, or
// a routing flip could hide a wrong weight.
void expect_reference(const std::vector<json>& gen, const fs::path& folder, const fs::path& tmp,
                      const std::string& what) {
  json seqs = json::array();
  for (const json& g : gen) seqs.push_back(g["tokens"]);
  mt::write_file(tmp / "tokens.json", seqs.dump());
  const json ref = mixtral_reference("logprobs " + (tmp / "tokens.json").string() + " " + folder.string());
  ASSERT_TRUE(ref.contains("logprobs")) << ref.dump();
  EXPECT_GT(ref["routing"][folder.string()].get<double>(), 1e-5) << what;
  hf_test::expect_logprobs(gen, ref["logprobs"][folder.string()].get<std::vector<std::vector<double>>>(),
                           1e-5, what);
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const auto ta = hf_test::folder_tensors(a), tb = hf_test::folder_tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [n, t] : ta) {
    ASSERT_TRUE(tb.count(n)) << n;
    const Tensor& u = tb.at(n);
    ASSERT_EQ(t.shape(), u.shape()) << n;
    ASSERT_EQ(t.dtype(), u.dtype()) << n;
    EXPECT_EQ(std::memcmp(t.contiguous().raw_data(), u.contiguous().raw_data(), t.nbytes()), 0) << n;
  }
}

mt::CommandResult convert(const std::string& args) { return mt::run_cli("checkpoint convert " + args); }

// The reference's folder (fixture `args`) imported: generate against the reference, export of the
// import bit for bit with the reference's config.json keys; the import's folder.
// `pp`: the pipeline stages of the resharded import (they must divide the layers).
fs::path check_import(const fs::path& tmp, const std::string& args, const std::string& cls, int pp) {
  const fs::path hf = tmp / "hf", ours = tmp / "ours", again = tmp / "hf_again";
  mixtral_reference("fixture " + hf.string() + " " + args);
  // (A vocabulary of 64 rows, unpadded: padded rows would be logits of 0 in the softmax.)
  auto r = convert("--load " + hf.string() + " --load-format hf --make-vocab-size-divisible-by 16 --save " +
                   ours.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Prompts of 5 and 3 tokens + 6 generated.
  const std::vector<json> gen = hf_test::generate(ours);
  EXPECT_EQ(gen.size(), 2u);
  if (gen.size() != 2) return ours;
  EXPECT_EQ(gen[0]["tokens"].size(), 11u);
  expect_reference(gen, hf, tmp, cls + " import");

  // The import resharded to TP2 x PP`pp` (experts split over the tensor-parallel ranks) generates
  // the same.
  r = convert("--load " + hf.string() + " --load-format hf --make-vocab-size-divisible-by 16 --save " +
              (tmp / "ours_parallel").string() + " --target-tensor-parallel-size 2 --target-pipeline-parallel-size " +
              std::to_string(pp));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::vector<json> gen2 = hf_test::generate(tmp / "ours_parallel");
  EXPECT_EQ(gen2.size(), gen.size());
  for (size_t i = 0; i < gen.size() && i < gen2.size(); ++i) {
    EXPECT_EQ(gen2[i]["tokens"], gen[i]["tokens"]);
    hf_test::expect_logprobs({gen2[i]}, {gen[i]["logprobs"].get<std::vector<double>>()}, 1e-5, cls + " resharded");
  }

  // Export of the import: the reference's folder, bit for bit, and its config.json's keys.
  r = convert("--load " + ours.string() + " --save " + again.string() + " --save-format hf");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("as a Hugging Face " + cls + " folder"), std::string::npos) << r.output;
  expect_same_tensors(hf, again);
  const json want = json::parse(mt::read_file(hf / "config.json"));
  const json got = json::parse(mt::read_file(again / "config.json"));
  for (const auto& [k, v] : want.items()) {
    if (k == "bos_token_id" || k == "eos_token_id") continue;  // the NullTokenizer's here
    EXPECT_TRUE(got.contains(k)) << k;
    if (got.contains(k)) {
      EXPECT_EQ(got[k], v) << k;
    }
  }
  EXPECT_EQ(got["architectures"], json::array({cls}));
  EXPECT_FALSE(got.contains("attention_bias"));
  EXPECT_FALSE(got.contains("pretraining_tp"));
  return ours;
}

TEST(HfMixtral, ImportMatchesTheReferenceAndExportsBitForBit) {
  mt::TempDir tmp;
  // A sliding window of 4 over sequences of up to 11 tokens.
  const fs::path ours = check_import(tmp.path(), "--window 4", "MixtralForCausalLM", 2);
  const std::vector<json> gen = hf_test::generate(ours);
  ASSERT_EQ(gen.size(), 2u);

  // The sliding window matters: without it the reference differs.
  json config = json::parse(mt::read_file(tmp / "hf" / "config.json"));
  const fs::path no_window = tmp / "hf_no_window";
  fs::create_directories(no_window);
  fs::copy_file(tmp / "hf" / "model.safetensors", no_window / "model.safetensors");
  config["sliding_window"] = nullptr;
  mt::write_file(no_window / "config.json", config.dump());
  mt::write_file(tmp / "seq.json", json::array({gen[0]["tokens"]}).dump());
  const json other = mixtral_reference("logprobs " + (tmp / "seq.json").string() + " " + no_window.string());
  const auto lp = other["logprobs"][no_window.string()][0].get<std::vector<double>>();
  const auto ours_lp = gen[0]["logprobs"].get<std::vector<double>>();
  double diff = 0;
  for (size_t i = 0; i < lp.size() && i < ours_lp.size(); ++i) diff = std::max(diff, std::abs(lp[i] - ours_lp[i]));
  EXPECT_GT(diff, 1e-3);

  // evaluate on the import.
  std::string text;
  for (int i = 0; i < 60; ++i) text += std::to_string((i * 37 + 11) % 60) + " ";
  mt::write_file(tmp / "wiki.test.tokens", text + "\n");
  const auto r = mt::run_cli("evaluate --load " + ours.string() + " --use-checkpoint-args --tokenizer-type "
                             "NullTokenizer --vocab-size 64 --task WIKITEXT103 --valid-data " +
                             (tmp / "wiki.test.tokens").string() + " --overlapping-eval 16 --micro-batch-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(loss sum (\S+) nats)"))) << r.output;
  EXPECT_TRUE(std::isfinite(std::stod(m[1].str())) && std::stod(m[1].str()) > 0) << r.output;
}

// Qwen2-MoE: a dense middle layer (mlp_only_layers), shared experts with their sigmoid gate, the
// top-k weights not renormalised (norm_topk_prob false: --moe-router-pre-softmax), q/k/v biases.
TEST(HfMixtral, QwenMoeImportMatchesTheReferenceAndExportsBitForBit) {
  mt::TempDir tmp;
  check_import(tmp.path(), "--qwen", "Qwen2MoeForCausalLM", 1);  // (3 layers: TP2 alone)
  const json args = json::parse(mt::read_file(tmp / "ours" / "release" / "metadata.json"))["args"]["model"];
  EXPECT_EQ(args["moe_layer_freq"], "[1,0,1]") << args.dump();
  EXPECT_EQ(args["moe_router_pre_softmax"], true);
  EXPECT_EQ(args["moe_shared_expert_gate"], true);
  EXPECT_EQ(args["moe_shared_expert_intermediate_size"], 20);
  EXPECT_EQ(args["add_qkv_bias"], true);
}

// Every layer an MoE layer of 4 SwiGLU experts of width 24, top-2, on the Llama-style tiny GPT.
TrainingArgs mixtral_args(const fs::path& dir) {
  TrainingArgs a = tiny_gpt_args(dir, 4);
  model::testing::make_llama_style(a.model);
  a.model.num_layers = 2;
  a.model.num_moe_experts = 4;
  a.model.moe_ffn_hidden_size = 24;
  a.model.moe_router_topk = 2;
  a.model.moe_aux_loss_coeff = 0.01f;
  a.eval_interval = 1000;
  a.save_interval = 1000;
  return a;
}

TEST(HfMixtral, TrainedMoeModelExportsToTheReference) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = mixtral_args(tmp.path());
  a.save = (tmp / "seq").string();
  run_single(a);
  a.model.moe_grouped_gemm = true;
  a.save = (tmp / "grouped").string();
  run_single(a);

  const fs::path hf = tmp / "hf", hf_grouped = tmp / "hf_grouped";
  auto r = convert("--load " + (tmp / "seq").string() + " --save " + hf.string() +
                   " --save-format hf --print-checkpoint-structure");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.block_sparse_moe.experts.3.w3.weight [24, 32] float32"),
            std::string::npos) << r.output;
  const json c = json::parse(mt::read_file(hf / "config.json"));
  EXPECT_EQ(c["model_type"], "mixtral");
  EXPECT_EQ(c["num_local_experts"], 4);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["router_aux_loss_coef"], 0.01);
  EXPECT_EQ(c["sliding_window"], nullptr);
  // embed_tokens, per layer 4 attention + 2 norms + gate + 3 per expert, norm, lm_head
  EXPECT_EQ(hf_test::folder_tensors(hf).size(), size_t(1 + 2 * (4 + 2 + 1 + 3 * 4) + 2));
  expect_reference(hf_test::generate(tmp / "seq"), hf, tmp.path(), "trained");

  r = convert("--load " + (tmp / "grouped").string() + " --save " + hf_grouped.string() + " --save-format hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(hf, hf_grouped);
}

std::string export_error(const model::TransformerConfig& c) {
  try {
    hf_model_type(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(exported)";
}

// Qwen2-MoE-shaped: the second layer dense, a shared expert of width 16 with its gate, the top-k
// weights not renormalised, q/k/v biases.
TrainingArgs qwen_args(const fs::path& dir) {
  TrainingArgs a = mixtral_args(dir);
  a.model.moe_layer_freq = "[1,0]";
  a.model.moe_shared_expert_intermediate_size = 16;
  a.model.moe_shared_expert_gate = true;
  a.model.moe_router_pre_softmax = true;
  a.model.add_qkv_bias = true;
  return a;
}

TEST(HfMixtral, TrainedQwenMoeModelExportsToTheReference) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = qwen_args(tmp.path());
  a.save = (tmp / "ckpt").string();
  run_single(a);
  const fs::path hf = tmp / "hf";
  const auto r = convert("--load " + (tmp / "ckpt").string() + " --save " + hf.string() + " --save-format hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json c = json::parse(mt::read_file(hf / "config.json"));
  EXPECT_EQ(c["model_type"], "qwen2_moe");
  EXPECT_EQ(c["num_experts"], 4);
  EXPECT_EQ(c["moe_intermediate_size"], 24);
  EXPECT_EQ(c["intermediate_size"], 48);
  EXPECT_EQ(c["shared_expert_intermediate_size"], 16);
  EXPECT_EQ(c["norm_topk_prob"], false);
  EXPECT_EQ(c["decoder_sparse_step"], 1);
  EXPECT_EQ(c["mlp_only_layers"], json::array({1}));
  EXPECT_EQ(c["qkv_bias"], true);
  // embed_tokens; MoE layer: 4 attention weights, 3 biases, 2 norms, gate, 3 per expert, 3 shared
  // and its gate; dense layer: 4 + 3 + 2 + 3; norm, lm_head
  EXPECT_EQ(hf_test::folder_tensors(hf).size(), size_t(1 + (4 + 3 + 2 + 1 + 3 * 4 + 3 + 1) + (4 + 3 + 2 + 3) + 2));
  expect_reference(hf_test::generate(tmp / "ckpt"), hf, tmp.path(), "trained qwen2_moe");
}

TEST(HfMixtral, SettingsMixtralCannotExpressAreRefusedByName) {
  const model::TransformerConfig base = mixtral_args("/nonexistent").model;
  ASSERT_EQ(hf_model_type(base), "mixtral");
  struct Case {
    std::function<void(model::TransformerConfig&)> change;
    const char* named;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c.moe_router_pre_softmax = true; }, "--moe-router-pre-softmax"},
      {[](auto& c) { c.moe_router_score_function = "sigmoid"; }, "--moe-router-score-function sigmoid"},
      {[](auto& c) { c.moe_router_topk_scaling_factor = 2.5f; }, "--moe-router-topk-scaling-factor 2.5"},
      {[](auto& c) { c.moe_router_num_groups = 2, c.moe_router_group_topk = 1; }, "--moe-router-num-groups 2"},
      {[](auto& c) { c.moe_layer_freq = "[0,1]"; }, "--moe-layer-freq [0,1]"},
      {[](auto& c) { c.moe_router_load_balancing_type = "sinkhorn", c.moe_aux_loss_coeff = 0; },
       "--moe-router-load-balancing-type sinkhorn"},
      {[](auto& c) { c.moe_router_force_load_balancing = true; }, "--moe-router-force-load-balancing"},
      {[](auto& c) { c.window_left = 3, c.window_right = 2; }, "--window-size 3 2"},
      {[](auto& c) { c.qk_layernorm = true; }, "--qk-layernorm"},
      {[](auto& c) { c.normalization = "LayerNorm"; }, "MixtralForCausalLM, which has RMSNorm only"},
  };
  for (const Case& k : cases) {
    model::TransformerConfig c = base;
    k.change(c);
    const std::string msg = export_error(c);
    EXPECT_NE(msg.find(k.named), std::string::npos) << msg;
    EXPECT_NE(msg.find("MixtralForCausalLM cannot express it"), std::string::npos) << msg;
  }
  // Qwen2-MoE (experts with a shared expert).
  const model::TransformerConfig qwen = qwen_args("/nonexistent").model;
  ASSERT_EQ(hf_model_type(qwen), "qwen2_moe");
  const std::vector<Case> qwen_cases = {
      {[](auto& c) { c.moe_shared_expert_gate = false; }, "--moe-shared-expert-gate missing"},
      {[](auto& c) { c.add_qkv_bias = false; }, "--add-qkv-bias missing"},
      {[](auto& c) { c.window_left = 3, c.window_right = 0; }, "--window-size 3 0"},
      {[](auto& c) { c.kv_channels = 16; }, "--kv-channels 16"},
      {[](auto& c) { c.moe_router_score_function = "sigmoid"; }, "--moe-router-score-function sigmoid"},
  };
  for (const Case& k : qwen_cases) {
    model::TransformerConfig c = qwen;
    k.change(c);
    const std::string msg = export_error(c);
    EXPECT_NE(msg.find(k.named), std::string::npos) << msg;
    EXPECT_NE(msg.find("Qwen2MoeForCausalLM cannot express it"), std::string::npos) << msg;
  }
  // Training-time settings with no effect on the function export.
  model::TransformerConfig c = base;
  c.moe_expert_capacity_factor = 1.0f, c.moe_z_loss_coeff = 1e-3f, c.moe_router_load_balancing_type = "seq_aux_loss";
  EXPECT_EQ(hf_model_type(c), "mixtral");
  // Experts with learned absolute positions: GPT-2's column names the experts.
  c = tiny_gpt_args("/nonexistent", 1).model;
  c.num_moe_experts = 4;
  EXPECT_NE(export_error(c).find("--num-experts 4"), std::string::npos) << export_error(c);
}

TEST(HfMixtral, MalformedFoldersAreErrorsNamingTheKeyOrTensor) {
  mt::TempDir tmp;
  const fs::path hf = tmp / "hf";
  mixtral_reference("fixture " + hf.string());
  const json config = json::parse(mt::read_file(hf / "config.json"));
  const auto tensors = read_safetensors(hf / "model.safetensors").tensors;
  int n = 0;
  auto expect = [&](const json& cfg, const std::map<std::string, Tensor>& t, const std::string& want) {
    const fs::path dir = tmp / ("bad" + std::to_string(n++));
    std::vector<std::pair<std::string, Tensor>> list(t.begin(), t.end());
    hf_test::write_folder(dir, cfg, list);
    const auto r = convert("--load " + dir.string() + " --load-format hf --save " + (dir / "out").string());
    EXPECT_NE(r.exit_code, 0) << want;
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  };
  json c = config;
  c["num_experts_per_tok"] = 5;
  expect(c, tensors, "num_experts_per_tok 5 exceeds num_local_experts 4");
  c = config;
  c["router_jitter_noise"] = 0.1;
  expect(c, tensors, "\"router_jitter_noise\" = 0.1 is not supported");
  c = config;
  c["sliding_window"] = 0;
  expect(c, tensors, "\"sliding_window\" must be an integer in [1, ");
  auto t = tensors;
  t.erase("model.layers.1.block_sparse_moe.experts.3.w3.weight");
  expect(config, t, "tensor 'model.layers.1.block_sparse_moe.experts.3.w3.weight' is missing");
  t = tensors;
  t["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = tensors.at("model.layers.0.block_sparse_moe.experts.0.w1.weight");
  expect(config, t, "unexpected tensor 'model.layers.0.block_sparse_moe.experts.4.w1.weight'");
  // Qwen2-MoE
  const fs::path qwen = tmp / "qwen";
  mixtral_reference("fixture " + qwen.string() + " --qwen");
  const json qconfig = json::parse(mt::read_file(qwen / "config.json"));
  const auto qtensors = read_safetensors(qwen / "model.safetensors").tensors;
  c = qconfig;
  c["use_sliding_window"] = true;
  expect(c, qtensors, "\"use_sliding_window\" = true is not supported");
  c = qconfig;
  c["mlp_only_layers"] = json::array({5});
  expect(c, qtensors, "\"mlp_only_layers\" holds 5, not a layer number in [0, 3)");
  c = qconfig;
  c["qkv_bias"] = false;
  expect(c, qtensors, "\"qkv_bias\" = false is not supported");
  c = qconfig;
  c["mlp_only_layers"] = json::array();  // the dense layer's tensors are then unexpected
  expect(c, qtensors, "tensor 'model.layers.1.mlp.gate.weight' is missing");
  t = tensors;
  t["model.layers.0.block_sparse_moe.gate.weight"] = Tensor::zeros({3, 16}, DType::F32);
  expect(config, t, "'model.layers.0.block_sparse_moe.gate.weight' has shape [3, 16] but config.json implies [4, 16]");
}

}  // namespace
}  // namespace megatron::training
