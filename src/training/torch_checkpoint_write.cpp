// Writing Megatron-LM's model_optim_rng.pt checkpoints; see torch_checkpoint.h.
#include <algorithm>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/torch_file.h"
#include "model/model_family.h"
#include "model/model_settings.h"
#include "model/stage_model.h"
#include "optim/lr_scheduler.h"
#include "training/checkpoint_files.h"
#include "training/torch_checkpoint.h"
#include "training/torch_distrib_optim.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Document;
using pickle::Value;

namespace {

const char* const kWordEmbedding = "embedding.word_embeddings.weight";
const char* const kOutputLayer = "output_layer.weight";

// One parameter of a rank's model chunk, in Megatron-Core's named_parameters() order.
struct ChunkParam {
  std::string ours;      // our name (the tensor in the merged checkpoint)
  std::string megatron;  // its name in the chunk's state dict
  bool tied_copy = false;
  bool expert = false;  // an expert's weight (its own optimizer under expert parallelism)
  bool buffer = false;  // the router's expert_bias: a buffer, no optimizer state
};

// The experts of expert-parallel rank e of EP: [first, first + count).
struct ExpertRange {
  int first = 0, count = 0;
  bool holds(int x) const { return x >= first && x < first + count; }
};

// An MoE layer's parameters after its pre-MLP norm, in MoELayer's registration order: the
// router (weight, bias; then its expert_bias buffer), the experts (SequentialMLP: each local
// expert's linear_fc1 and linear_fc2; TEGroupedMLP: linear_fc1's weight0..N-1, then linear_fc2's),
// the shared expert (SharedExpertMLP's own gate_weight before its linears).
std::vector<std::string> moe_layer_order(const MergedCheckpoint& m, const std::string& prefix,
                                         const ExpertRange& r) {
  std::vector<std::string> out = {"mlp.router.weight", "mlp.router.bias", "mlp.router.expert_bias"};
  const bool grouped = m.model.count(prefix + "mlp.experts.linear_fc1.weight" + std::to_string(r.first));
  if (grouped) {
    for (const char* fc : {"linear_fc1", "linear_fc2"})
      for (const char* w : {"weight", "bias"})
        for (int j = 0; j < r.count; ++j)
          out.push_back(str("mlp.experts.", fc, ".", w, r.first + j));
  } else {
    for (int j = 0; j < r.count; ++j)
      for (const char* n : {"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"})
        out.push_back(str("mlp.experts.local_experts.", r.first + j, ".", n));
  }
  for (const char* n : {"gate_weight", "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight",
                        "linear_fc2.bias"})
    out.push_back(str("mlp.shared_experts.", n));
  return out;
}

// The per-layer order of Megatron-Core's modules: the local spec registers input_layernorm,
// self_attention (core_attention, linear_proj, then linear_qkv), pre_mlp_layernorm, mlp; the
// Transformer Engine spec fuses the norms into linear_qkv / linear_fc1, whose norm parameters
// come before their weights.
std::vector<std::string> layer_order(bool te) {
  if (te)
    return {"self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
            "input_layernorm.weight",  "input_layernorm.bias",
            "self_attention.linear_qkv.weight",  "self_attention.linear_qkv.bias",
            "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
            "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
  return {"input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
          "self_attention.linear_proj.bias", "self_attention.linear_qkv.weight",
          "self_attention.linear_qkv.bias", "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
          "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
}

// A T5 layer's order (t5_spec.py): the decoder's pre_cross_attn_layernorm and cross_attention
// (Attention's linear_proj, then CrossAttention's linear_q and linear_kv) come between the
// self-attention and the MLP norm.
std::vector<std::string> t5_layer_order(bool te, bool decoder) {
  std::vector<std::string> order = layer_order(te);
  if (!decoder) return order;
  const auto mlp_norm = std::find(order.begin(), order.end(), "pre_mlp_layernorm.weight");
  order.insert(mlp_norm, {"pre_cross_attn_layernorm.weight", "pre_cross_attn_layernorm.bias",
                          "cross_attention.linear_proj.weight", "cross_attention.linear_proj.bias",
                          "cross_attention.linear_q.weight", "cross_attention.linear_q.bias",
                          "cross_attention.linear_kv.weight", "cross_attention.linear_kv.bias"});
  return order;
}

// What follows the layer stack on the last stage, in Megatron-Core's module order: GPTModel's
// output_layer; BertModel's lm_head (dense, layer_norm), output_layer (weight, bias), binary_head
// and pooler.
std::vector<std::string> head_order(model::ModelFamilyId family) {
  if (family == model::ModelFamilyId::bert)
    return {"lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
            "lm_head.layer_norm.bias", kOutputLayer, "output_layer.bias", "binary_head.weight",
            "binary_head.bias", "pooler.dense.weight", "pooler.dense.bias"};
  return {kOutputLayer};
}

std::vector<ChunkParam> chunk_params(const MergedCheckpoint& m, const model::PipelineLayout& layout,
                                     model::ModelFamilyId family, const std::string& block, int p,
                                     int c, bool te, std::set<std::string>& placed,
                                     const ExpertRange& experts) {
  std::vector<ChunkParam> out;
  const int offset = layout.first_layer(p, c);
  bool moe = false;  // the layer being added is an MoE layer
  auto add = [&](const std::string& ours, bool tied_copy = false) {
    if (!tied_copy && !m.model.count(ours)) return;
    const int x = torch_names::expert_number(ours);
    if (x >= 0 && !experts.holds(x)) return;  // another expert-parallel rank's
    // An MoE layer's pre-MLP norm is a module of its own (TENorm), not fused into an fc1.
    const bool fused_norm = te && !(moe && ours.find(".pre_mlp_layernorm.") != std::string::npos);
    std::string megatron = torch_names::to_megatron(ours, offset, fused_norm);
    if (x >= 0) megatron = torch_names::shift_expert(megatron, -experts.first);
    out.push_back({ours, megatron, tied_copy, x >= 0, ours.ends_with(".mlp.router.expert_bias")});
    if (!tied_copy) placed.insert(ours);
  };
  if (layout.has_embedding(p, c)) {
    add(kWordEmbedding);
    add("embedding.position_embeddings.weight");
    add("embedding.tokentype_embeddings.weight");
  }
  for (int l = offset; l < offset + layout.layers_per_chunk(); ++l) {
    const std::string prefix = block + ".layers." + std::to_string(l) + ".";
    moe = m.model.count(prefix + "mlp.router.weight") > 0;
    for (const std::string& n : layer_order(te)) add(prefix + n);
    if (moe)
      for (const std::string& n : moe_layer_order(m, prefix, experts)) add(prefix + n);
    // Parameters of this layer the lists above do not name keep their own (sorted) order.
    for (auto it = m.model.lower_bound(prefix); it != m.model.end() && it->first.starts_with(prefix); ++it)
      if (!placed.count(it->first)) add(it->first);
  }
  moe = false;
  if (layout.has_output(p, c)) {
    add(block + ".final_layernorm.weight");
    add(block + ".final_layernorm.bias");
    for (const std::string& n : head_order(family)) {
      if (n != kOutputLayer)
        add(n);
      else if (m.model.count(kOutputLayer))
        add(kOutputLayer);
      else if (!layout.has_embedding(p, c))
        add(kOutputLayer, /*tied_copy=*/true);  // the last stage's copy of the tied embedding
    }
  }
  return out;
}

// T5Model's parameters in named_parameters() order (one stage): the embedding, the encoder's
// and the decoder's relative position embeddings, the encoder block, the decoder block, T5LMHead.
std::vector<ChunkParam> t5_chunk_params(const MergedCheckpoint& m, int encoder_layers,
                                        int decoder_layers, bool te, std::set<std::string>& placed) {
  std::vector<ChunkParam> out;
  auto add = [&](const std::string& ours) {
    if (!m.model.count(ours)) return;
    out.push_back({ours, torch_names::t5_to_megatron(ours, te), false});
    placed.insert(ours);
  };
  add(kWordEmbedding);
  add("embedding.position_embeddings.weight");
  add("encoder_relative_pos_emb.relative_attention_bias.weight");
  add("decoder_relative_pos_emb.relative_attention_bias.weight");
  for (const std::string block : {"encoder", "decoder"}) {
    const int layers = block == "encoder" ? encoder_layers : decoder_layers;
    for (int l = 0; l < layers; ++l) {
      const std::string prefix = block + ".layers." + std::to_string(l) + ".";
      for (const std::string& n : t5_layer_order(te, block == "decoder")) add(prefix + n);
    }
    add(block + ".final_layernorm.weight");
    add(block + ".final_layernorm.bias");
  }
  add(kOutputLayer);  // untied: T5LMHead's own weight, no bias
  add("output_layer.bias");
  return out;
}

// The layer number and block of "<block>.layers.<n>.<rest>" ({-1, ""} otherwise).
std::pair<int, std::string> layer_and_block(const std::string& ours) {
  for (const std::string block : {"encoder", "decoder"}) {
    const std::string p = block + ".layers.";
    if (!ours.starts_with(p)) continue;
    const size_t at = p.size();
    return {std::stoi(ours.substr(at, ours.find('.', at) - at)), block};
  }
  return {-1, ""};
}

Tensor shard_of(const MergedCheckpoint& m, const ChunkParam& cp, const std::string& kind, int t, int T) {
  const std::string& name = cp.tied_copy ? std::string(kWordEmbedding) : cp.ours;
  const Tensor& full = kind == "param" ? m.model.at(name) : m.optimizer.at(kind).at(name);
  if (cp.buffer) return full.to(DType::F32);  // Megatron keeps expert_bias in float32, whole
  return split_shard(full, m.rules.at(name), t, T);
}

double current_lr(const optim::LRSchedulerConfig& c, int64_t num_steps) {
  try {
    optim::LRScheduler s(c);
    s.set_num_steps(num_steps);
    return s.lr();
  } catch (const Error&) {
    return c.max_lr;
  }
}

}  // namespace

fs::path write_torch_checkpoint(const MergedCheckpoint& m, const fs::path& save_dir, int T, int P,
                                int layers_per_virtual_stage, const TorchSaveOptions& options) {
  MG_REQUIRE(options.transformer_impl == "transformer_engine" || options.transformer_impl == "local",
             "--transformer-impl must be transformer_engine or local (got '", options.transformer_impl, "')");
  const bool te = options.transformer_impl == "transformer_engine";
  const json& meta = m.metadata;
  const json& args_json = meta.at("args");
  const TrainingArgs a = training_args_from_json(args_json);
  const int EP = options.expert_model_parallel_size;
  const int E = a.model.num_moe_experts;
  MG_REQUIRE(EP >= 1 && (EP == 1 || (E > 0 && E % EP == 0)), "expert-parallel size ", EP,
             " for the torch checkpoint: the model has ", E, " experts per MoE layer, not a "
             "positive multiple of ", EP);
  const bool t5 = a.model.family_id() == model::ModelFamilyId::t5;
  MG_REQUIRE(!t5 || (P == 1 && layers_per_virtual_stage == 0), "Megatron-LM's T5 .pt files are "
             "written for --pipeline-model-parallel-size 1 (got ", P, "): convert with "
             "--target-pipeline-parallel-size 1, or keep this build's checkpoint format");
  const model::PipelineLayout layout =
      model::PipelineLayout::make(a.model.num_layers, P, layers_per_virtual_stage);
  const int V = layout.num_chunks;
  const int64_t iteration = meta.at("iteration").get<int64_t>();
  const bool release = m.source.release;
  const std::string dir_name = release ? "release" : iteration_dir_name(iteration);
  const bool optim = !m.optimizer_type.empty();
  const bool adam = m.optimizer_type == "adam";
  const DType dtype = m.model.at(kWordEmbedding).dtype();
  const json& sc = meta.at("opt_param_scheduler");
  optim::LRSchedulerConfig sched;
  sched.max_lr = sc.at("max_lr").get<double>();
  sched.min_lr = sc.at("min_lr").get<double>();
  sched.lr_warmup_init = sc.value("lr_warmup_init", 0.0);
  sched.lr_warmup_steps = sc.at("lr_warmup_steps").get<int64_t>();
  sched.lr_decay_steps = sc.at("lr_decay_steps").get<int64_t>();
  sched.decay_style = optim::parse_lr_decay_style(sc.at("lr_decay_style").get<std::string>());
  sched.wsd_decay_steps = sc.value("wsd_decay_steps", int64_t(0));
  sched.start_wd = sc.at("start_wd").get<double>();
  sched.end_wd = sc.at("end_wd").get<double>();
  const int64_t num_steps = sc.at("num_steps").get<int64_t>();
  // Trained with --decoupled-lr: Megatron keeps the embedding and output layer in their own
  // parameter group (is_decoupled_lr true, its own max_lr/min_lr); these files have the two
  // groups of a run without it, so say so instead of dropping the schedule silently.
  if (optim && sc.contains("decoupled_lr"))
    log_warn("the checkpoint was trained with --decoupled-lr ", sc["decoupled_lr"].dump(),
             ": the .pt optimizer state has no decoupled group (the embedding and output layer are "
             "in the main groups, is_decoupled_lr false), so Megatron-LM loads it only without "
             "--decoupled-lr (its parameter groups must match); with --decoupled-lr resume there "
             "with --no-load-optim");
  MG_REQUIRE(!options.distributed_optimizer || (optim && adam && EP == 1 && V == 1 && !t5 &&
                                                a.model.family_id() == model::ModelFamilyId::gpt),
             "Megatron's distrib_optim.pt is written for GPT models with Adam's state, one model chunk and "
             "no expert parallelism (got ", optim ? m.optimizer_type : std::string("no optimizer state"), ", ", V,
             " model chunks, expert-parallel size ", EP, "); save with --ckpt-format torch_dist, or "
             "without --use-distributed-optimizer");
  const json& rng = meta.at("rng_state");
  const int dp = meta.contains("parallel") && meta["parallel"].is_object() &&
                         meta["parallel"].contains("data_parallel_size")
                     ? meta["parallel"]["data_parallel_size"].get<int>() : 1;

  // Megatron's argument names for what the loader and check_checkpoint_args read. A layer kind
  // Megatron-LM has no switch for would be read back as another one: refused by name.
  const std::string& act = a.model.activation;
  MG_REQUIRE(act == "gelu" || act == "gelu_tanh" || act == "swiglu" || act == "squared_relu",
             "the activation '", act, "' has no Megatron-LM argument (its .pt checkpoints know "
             "GeLU, SwiGLU and squared ReLU): it cannot be saved in the torch format; keep this "
             "build's checkpoint format");
  MG_REQUIRE(a.model.normalization == "LayerNorm" || a.model.normalization == "RMSNorm",
             "the normalization '", a.model.normalization, "' has no Megatron-LM argument (its .pt "
             "checkpoints know LayerNorm and RMSNorm): it cannot be saved in the torch format; "
             "keep this build's checkpoint format");
  json extra = {
      {"padded_vocab_size", m.padded_vocab_size},
      {"tensor_model_parallel_size", T}, {"pipeline_model_parallel_size", P},
      {"virtual_pipeline_model_parallel_size", V > 1 ? json(V) : json(nullptr)},
      {"num_layers_per_virtual_pipeline_stage", V > 1 ? json(layout.layers_per_chunk()) : json(nullptr)},
      {"data_parallel_size", dp}, {"world_size", T * P * dp},
      {"consumed_train_samples", meta.at("consumed_train_samples")},
      {"consumed_valid_samples", meta.at("consumed_valid_samples")}, {"iteration", iteration},
      {"fp16", a.fp16}, {"bf16", a.bf16}, {"params_dtype", dtype_name(dtype)},
      {"use_distributed_optimizer", options.distributed_optimizer}, {"ckpt_format", "torch"},
      {"transformer_impl", options.transformer_impl}, {"use_legacy_models", false},
      {"expert_model_parallel_size", EP},
      {"use_mcore_models", true}, {"data_parallel_random_init", false},
  };
  // The model's settings as Megatron's arguments: one row each (model/model_settings.h).
  extra.update(model::megatron_model_args(a.model));
  // What Megatron's validate_args derives from the other arguments, as it leaves them.
  extra["encoder_num_layers"] = a.model.num_layers;
  if (a.model.family_id() == model::ModelFamilyId::bert) extra["bert_binary_head"] = a.model.bert_binary_head;
  extra["encoder_seq_length"] = a.model.seq_length;
  if (t5) {  // pretrain_t5.py's own arguments (the rest are the table's and the tokenizer's)
    extra["decoder_seq_length"] = a.model.decoder_seq_length;
    extra["decoder_num_layers"] = a.model.decoder_layers();
  }
  extra["sequence_parallel"] = a.model.sequence_parallel && T > 1;
  if (E > 0) {  // the MoE arguments as Megatron's parser and validate_args leave them
    extra["num_experts"] = E;
    const std::string& freq = a.model.moe_layer_freq;
    if (freq.starts_with("[")) {  // moe_freq_type: a list of 0/1 per layer
      json list = json::array();
      for (char ch : freq)
        if (ch == '0' || ch == '1') list.push_back(ch - '0');
      extra["moe_layer_freq"] = list;
    } else {
      extra["moe_layer_freq"] = std::stoll(freq);
    }
    extra["moe_ffn_hidden_size"] = a.model.moe_ffn();
    extra["expert_tensor_parallel_size"] =
        a.parallel.expert_tensor_parallel_size > 0 ? a.parallel.expert_tensor_parallel_size : T;
  }
  if (a.weight_decay_incr_style == "constant") {
    extra["start_weight_decay"] = a.weight_decay;
    extra["end_weight_decay"] = a.weight_decay;
  }

  fs::create_directories(save_dir);
  detail::set_mode(save_dir, 0750);
  const fs::path tmp = save_dir / (".tmp_" + dir_name);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  detail::set_mode(tmp, 0750);
  std::set<std::string> placed;
  const std::string block = model::model_family_of(a.model).block;
  for (int p = 0; p < P; ++p) {
   for (int e = 0; e < EP; ++e) {
    const ExpertRange experts{e * (E / EP), E / EP};
    std::vector<std::vector<ChunkParam>> chunks;
    for (int c = 0; c < V; ++c)
      chunks.push_back(t5 ? t5_chunk_params(m, a.model.num_layers, a.model.decoder_layers(), te, placed)
                          : chunk_params(m, layout, a.model.family_id(), block, p, c, te, placed, experts));
    for (int t = 0; t < T; ++t) {
      Document doc;
      Value* root = doc.dict();
      doc.root = root;
      doc.set(root, "args", torch_args::to_namespace(doc, args_json, extra));
      doc.set(root, "checkpoint_version", doc.real(3.0));
      doc.set(root, "iteration", doc.integer(iteration));
      for (int c = 0; c < V; ++c) {
        Value* sd = doc.dict(/*ordered=*/true);
        const int offset = layout.first_layer(p, c);
        std::pair<int, std::string> last_layer = {-1, ""};
        for (const ChunkParam& cp : chunks[size_t(c)]) {
          Value* shard = doc.tensor(shard_of(m, cp, "param", t, T));
          doc.set(sd, cp.megatron, shard);
          // Every module whose class defines get_extra_state has an _extra_state entry: Transformer
          // Engine's (None: no FP8 metadata) and Megatron-Core's column/row-parallel linears (None).
          const auto layer = layer_and_block(cp.ours);
          if (layer.first >= 0 && layer != last_layer) {
            const std::string lp = str(block, ".layers.", layer.first, ".");
            const bool moe = !t5 && m.model.count(lp + "mlp.router.weight");
            const std::vector<std::string> extra_states =
                t5 ? torch_names::t5_extra_state_names(layer.first, te, layer.second)
                : moe ? torch_names::moe_extra_state_names(
                            layer.first - offset, te, experts.count,
                            m.model.count(str(lp, "mlp.experts.linear_fc1.weight", experts.first)) > 0,
                            m.model.count(lp + "mlp.shared_experts.linear_fc1.weight") > 0, block)
                      : torch_names::extra_state_names(layer.first - offset, te, block);
            for (const std::string& x : extra_states) doc.set(sd, x, doc.none());
            last_layer = layer;
          }
          // T5Model registers its head's output layer a second time (self.output_layer): the
          // state dict has the tensor under both names, and both modules' _extra_state.
          if (t5 && cp.megatron.starts_with("lm_head.output_layer."))
            doc.set(sd, cp.megatron.substr(8), shard);
        }
        if (t5) doc.set(sd, "lm_head.output_layer._extra_state", doc.none());
        // The last stage's output layer (a ColumnParallelLinear) has one too, even when tied to
        // the word embedding (its weight is then not in the state dict on a single stage).
        if (p == P - 1 && c == V - 1) doc.set(sd, "output_layer._extra_state", doc.none());
        doc.set(root, V == 1 ? std::string("model") : "model" + std::to_string(c), sd);
      }
      if (optim) {
        // One optimizer, or under expert parallelism Megatron-Core's ChainedOptimizer of the
        // dense parameters' and the expert-parallel ones' (a list of their state dicts). Each has
        // its parameter groups (weight-decayed first, as Megatron-Core sorts them; empty ones
        // left out, as _get_param_groups never makes them), parameters numbered through the
        // groups as torch's Optimizer.state_dict numbers them.
        const int parts = EP > 1 ? 2 : 1;
        Value* chained = doc.list();
        for (int part = 0; part < parts; ++part) {
        std::vector<const ChunkParam*> wd, no_wd;
        for (const auto& chunk : chunks)
          for (const ChunkParam& cp : chunk) {
            if (cp.buffer || (parts == 2 && cp.expert != (part == 1))) continue;
            const Tensor& full = cp.tied_copy ? m.model.at(kWordEmbedding) : m.model.at(cp.ours);
            (full.dim() == 1 || cp.megatron.ends_with(".bias") ? no_wd : wd).push_back(&cp);
          }
        Value* state = doc.dict();
        Value* param_groups = doc.list();
        Value* mains = doc.list();
        int64_t id = 0;
        for (int g = 0; g < 2; ++g) {
          const auto& members = g == 0 ? wd : no_wd;
          if (members.empty()) continue;
          Value* ids = doc.list();
          Value* group_mains = doc.list();
          for (const ChunkParam* cp : members) {
            Value* s = doc.dict();
            if (adam) {
              // torch's AdamW keeps the step per parameter (a float32 scalar tensor); Transformer
              // Engine's FusedAdam per group, and its load_state_dict refuses any other state.
              if (!te) doc.set(s, "step", doc.tensor(Tensor::full({}, double(m.optimizer_step), DType::F32)));
              doc.set(s, "exp_avg", doc.tensor(shard_of(m, *cp, "exp_avg", t, T)));
              doc.set(s, "exp_avg_sq", doc.tensor(shard_of(m, *cp, "exp_avg_sq", t, T)));
            } else {
              doc.set(s, "momentum_buffer", doc.tensor(shard_of(m, *cp, "momentum_buffer", t, T)));
            }
            Document::set(state, doc.integer(id), s);
            ids->items.push_back(doc.integer(id++));
            if (dtype != DType::F32) group_mains->items.push_back(doc.tensor(shard_of(m, *cp, "fp32_param", t, T)));
          }
          const double wd_mult = g == 0 ? 1.0 : 0.0;
          const double weight_decay = a.weight_decay * wd_mult;
          Value* pg = doc.dict();
          doc.set(pg, "params", ids);
          doc.set(pg, "is_expert_parallel", doc.boolean(part == 1));
          doc.set(pg, "default_config", doc.boolean(true));
          doc.set(pg, "wd_mult", doc.real(wd_mult));
          doc.set(pg, "lr_mult", doc.real(1.0));
          doc.set(pg, "is_decoupled_lr", doc.boolean(false));
          doc.set(pg, "max_lr", doc.real(sched.max_lr));
          doc.set(pg, "min_lr", doc.real(sched.min_lr));
          doc.set(pg, "lr", doc.real(current_lr(sched, num_steps)));
          doc.set(pg, "weight_decay", doc.real(weight_decay));
          if (adam) {
            doc.set(pg, "betas", doc.tuple({doc.real(a.optimizer.adam_beta1), doc.real(a.optimizer.adam_beta2)}));
            doc.set(pg, "eps", doc.real(a.optimizer.adam_eps));
            doc.set(pg, "bias_correction", doc.boolean(true));
            doc.set(pg, "amsgrad", doc.boolean(false));
            if (te) doc.set(pg, "step", doc.integer(m.optimizer_step));
          } else {
            doc.set(pg, "momentum", doc.real(a.optimizer.sgd_momentum));
            doc.set(pg, "dampening", doc.integer(0));
            doc.set(pg, "nesterov", doc.boolean(false));
          }
          doc.set(pg, "maximize", doc.boolean(false));
          doc.set(pg, "foreach", doc.none());
          doc.set(pg, "capturable", doc.boolean(false));
          doc.set(pg, "differentiable", doc.boolean(false));
          doc.set(pg, "fused", doc.none());
          param_groups->items.push_back(pg);
          mains->items.push_back(group_mains);
        }
        Value* inner = doc.dict();
        doc.set(inner, "state", state);
        doc.set(inner, "param_groups", param_groups);
        if (dtype == DType::F32) {
          chained->items.push_back(inner);  // FP32Optimizer.state_dict()
        } else {  // Float16OptimizerWithFloat16Params.state_dict()
          Value* o = doc.dict();
          doc.set(o, "optimizer", inner);
          if (a.fp16) {
            const json& gs = meta.at("grad_scaler");
            Value* scaler = doc.dict();
            doc.set(scaler, "scale", doc.tensor(Tensor::full({1}, gs.at("scale").get<double>(), DType::F32)));
            doc.set(scaler, "growth_tracker", doc.integer(gs.at("growth_tracker").get<int64_t>()));
            doc.set(scaler, "hysteresis_tracker", doc.integer(gs.at("hysteresis_tracker").get<int64_t>()));
            doc.set(o, "grad_scaler", scaler);
          }
          doc.set(o, "fp32_from_fp16_params", mains);
          chained->items.push_back(o);
        }
        }
        doc.set(root, "optimizer", options.distributed_optimizer
                                       ? torch_distrib::state_dict(doc, *chained->items[0], m.optimizer_step)
                                   : parts == 1 ? chained->items[0] : chained);
        Value* s = doc.dict();  // OptimizerParamScheduler.state_dict()
        for (const auto& [k, v] : sc.items()) {
          if (v.is_string()) doc.set(s, k, doc.str(v.get<std::string>()));
          else if (v.is_number_integer()) doc.set(s, k, doc.integer(v.get<int64_t>()));
          else if (v.is_number()) doc.set(s, k, doc.real(v.get<double>()));
        }
        doc.set(root, "opt_param_scheduler", s);
      }
      if (!rng.is_null())
        doc.set(root, "rng_state",
                torch_rng::megatron_rng_state(doc, a.seed, t, p, rng.at("seed").get<uint64_t>(),
                                              rng.at("dropout_offset").get<uint64_t>()));
      const std::string rank_dir = checkpoint_rank_dir(t, P, p, EP, e);
      fs::create_directories(tmp / rank_dir);
      detail::set_mode(tmp / rank_dir, 0750);
      const fs::path file = tmp / rank_dir / kTorchCheckpointFile;
      write_torch_file(file, *root, "model_optim_rng");
      detail::set_mode(file, 0640);
      if (options.distributed_optimizer) {  // save_parameter_state's file beside it
        std::map<std::string, Shape> local;
        std::map<std::string, const ChunkParam*> slots;
        for (const ChunkParam& cp : chunks[0]) {
          if (cp.buffer) continue;
          local[cp.tied_copy ? kWordEmbedding : cp.ours] = shard_of(m, cp, "param", t, T).shape();
          slots[cp.ours] = &cp;
        }
        torch_distrib::BufferSpec bs{p, P, a.model.num_layers, dp, !a.model.untie_embeddings_and_output_weights,
                                     0, te, dtype, a.grad_reduce_in_bf16};
        if (p == 0 && a.parallel.overlap_grad_reduce)
          bs.bucket_size = a.parallel.ddp_bucket_size > 0 ? a.parallel.ddp_bucket_size
                                                          : std::max<int64_t>(40000000, int64_t(1000000) * dp);
        const fs::path opt_file = tmp / rank_dir / torch_distrib::kDistribOptimFile;
        torch_distrib::write_rank(opt_file, local, bs, [&](const std::string& n, const std::string& kind) {
          return shard_of(m, *slots.at(n), kind == "param" && dtype != DType::F32 ? "fp32_param" : kind, t, T);
        });
        detail::set_mode(opt_file, 0640);
      }
      detail::fsync_path(tmp / rank_dir, true);
    }
   }
  }
  for (const auto& [name, t] : m.model)
    MG_REQUIRE(placed.count(name), "tensor '", name, "' has no place in Megatron-Core's ",
               a.model.family_id() == model::ModelFamilyId::bert ? "BertModel" : t5 ? "T5Model" : "GPTModel",
               " (it would be lost in the torch checkpoint)");
  detail::fsync_path(tmp, true);
  detail::publish_iteration(save_dir, tmp, dir_name,
                            release ? std::string("release") : std::to_string(iteration));
  return save_dir / dir_name;
}

fs::path save_torch_checkpoint(const fs::path& save_dir, const CheckpointState& state,
                               const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                               const CheckpointRank& rank, const TorchSaveOptions& options) {
  const bool root = !rank.multi() || rank.world->rank() == 0;
  const fs::path staging = save_dir / ".torch_staging";
  save_checkpoint(staging, state, params, optimizer, rank);  // collective: every rank's files
  fs::path out = save_dir / iteration_dir_name(state.iteration);
  std::string failure;
  if (root) {
    try {
      const auto ckpt = find_checkpoint(staging, state.iteration);
      MG_CHECK(ckpt.has_value(), "the staged checkpoint is missing");
      const MergedCheckpoint m = merge_checkpoint(*ckpt, optimizer != nullptr);
      int lpvs = 0;
      if (state.args.contains("parallel") && state.args["parallel"].contains("num_layers_per_virtual_pipeline_stage"))
        lpvs = state.args["parallel"]["num_layers_per_virtual_pipeline_stage"].get<int>();
      TorchSaveOptions o = options;
      o.expert_model_parallel_size = rank.ep_size;
      if (optimizer == nullptr) o.distributed_optimizer = false;  // --no-save-optim: nothing to lay out
      if (o.distributed_optimizer && (rank.ep_size > 1 || lpvs > 0 ||
                                      m.optimizer_type != "adam" ||
                                      training_args_from_json(m.metadata.at("args")).model.family_id() !=
                                          model::ModelFamilyId::gpt)) {
        log_warn("--ckpt-format torch: Megatron's distrib_optim.pt is written for GPT models trained with "
                 "Adam, one model chunk and no expert parallelism; this checkpoint's optimizer state is "
                 "saved as the plain optimizer's (Megatron-LM loads it without --use-distributed-optimizer)");
        o.distributed_optimizer = false;
      }
      out = write_torch_checkpoint(m, save_dir, rank.tp_size, rank.pp_size, lpvs, o);
      fs::remove_all(staging);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (rank.multi()) {  // every rank learns whether rank 0 succeeded
    const std::vector<std::string> all = all_gather_strings(*rank.world, failure);
    failure = all[0];
  }
  MG_REQUIRE(failure.empty(), "saving the torch checkpoint in ", save_dir.string(), " failed: ", failure);
  return out;
}

}  // namespace megatron::training
