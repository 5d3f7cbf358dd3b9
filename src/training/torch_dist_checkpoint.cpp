// Megatron-LM's torch_dist checkpoints read into any layout; see torch_dist_checkpoint.h.
#include "training/torch_dist_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/torch_file.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_format.h"
#include "training/torch_dist_moe.h"
#include "training/torch_dist_optimizer.h"
#include "training/torch_dist_stream.h"
#include "training/torch_dist_t5.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kCommonFile = "common.pt";
constexpr const char* kLayers = "decoder.layers.";
constexpr const char* kEncoderLayers = "encoder.layers.";  // BertModel's TransformerBlock

json read_marker(const fs::path& dir) {
  const fs::path file = dir / "metadata.json";
  std::ifstream in(file);
  MG_REQUIRE(in, file.string(), ": cannot be read");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    MG_THROW(file.string(), ": not valid JSON (", e.what(), ")");
  }
}

bool arg_flag(const Value* ns, const char* name) {
  const Value* v = ns != nullptr ? ns->get(name) : nullptr;
  return v != nullptr && v->kind == Kind::Bool && v->boolean;
}

int arg_int(const Value* ns, const char* name, int fallback) {
  const Value* v = ns != nullptr ? ns->get(name) : nullptr;
  return v != nullptr && v->kind == Kind::Int && v->integer >= 1 && v->integer < (1 << 20) ? int(v->integer)
                                                                                           : fallback;
}

// A key of the model's state (not the optimizer's, not RNG or other objects).
bool is_model_key(const std::string& key) {
  return key.starts_with("embedding.") || key.starts_with("decoder.") || key.starts_with("output_layer.") ||
         key.starts_with("encoder.") || key.starts_with("lm_head.") || key.starts_with("binary_head.") ||
         key.starts_with("pooler.") || key.starts_with("encoder_relative_pos_emb.") ||
         key.starts_with("decoder_relative_pos_emb.");
}

bool tied_of(const CheckpointOnDisk& ckpt) {
  return !training_args_from_json(ckpt.state.args).model.untie_embeddings_and_output_weights;
}

model::ModelFamilyId family_of(const CheckpointOnDisk& ckpt) {
  return training_args_from_json(ckpt.state.args).model.family_id();
}

// Our name of a Megatron name (chunk-local numbering = global here), "" to skip; the names of
// BertModel (its encoder block and heads) or T5Model (torch_dist_t5.h) by `family`.
std::string ours_of(const std::string& megatron, bool tied, const std::string& label, model::ModelFamilyId family) {
  bool tied_copy = false, legacy_qkv = false, alias = false;
  std::string ours;
  try {
    if (family == model::ModelFamilyId::t5) return torch_names::t5_to_ours(megatron, &alias);
    ours = torch_names::to_ours(megatron, 0, tied, &tied_copy, &legacy_qkv,
                                family == model::ModelFamilyId::bert ? "encoder" : "decoder");
  } catch (const Error& e) {
    MG_THROW(label, ": ", e.what());
  }
  return tied_copy ? std::string() : ours;
}

// A model key with a layer axis: "decoder.layers.<module>.<param>" (the default); keys of one
// layer ("decoder.layers.<N>.<module>.<param>", Megatron's non-homogeneous layers) have none.
// The layer stack's prefix of a key ("decoder.layers." or BERT's "encoder.layers."), "" for others.
std::string layers_of(const std::string& key) {
  for (const char* p : {kLayers, kEncoderLayers})
    if (key.starts_with(p)) return p;
  return "";
}

bool has_layer_axis(const std::string& key) {
  const std::string p = layers_of(key);
  return !p.empty() && key.size() > p.size() && !std::isdigit(static_cast<unsigned char>(key[p.size()]));
}

// SwiGLU's fc1 saved with Megatron-Core's singleton local shards: "<fc1 key>_w" (gate) and
// "<fc1 key>_v" (up), each chunked over TP; the base key for either, "" for other keys.
std::string gated_base(const DistcpFolder& f, const std::string& key) {
  if (!key.ends_with("_w") && !key.ends_with("_v")) return "";
  const std::string base = key.substr(0, key.size() - 2);
  if (!base.ends_with("linear_fc1.weight") && !base.ends_with("linear_fc1.bias")) return "";
  MG_REQUIRE(f.has(base + "_w") && f.has(base + "_v"), f.metadata_label(), ": '", key, "' is half of SwiGLU's "
             "fc1 (gate _w and up _v) but '", base, key.ends_with("_w") ? "_v" : "_w", "' is missing");
  return base;
}

// The model keys (a gated pair once, by its base key), checked for what this build reads; with a
// prefix ("optimizer.state.exp_avg.") the keys of that state of the model's tensors, the prefix
// removed.
std::vector<std::string> model_keys(const DistcpFolder& f, const std::string& prefix = "") {
  std::vector<std::string> keys;
  for (const auto& [full_key, e] : f.entries()) {
    if (!full_key.starts_with(prefix)) continue;
    const std::string key = full_key.substr(prefix.size());
    if (e.is_bytes || !is_model_key(key) || key.ends_with("._extra_state")) continue;
    // T5Model's second name of its head's output layer: the same tensor, read once.
    if (torch_dist_t5::is_output_alias(key, f.has(prefix + "lm_head." + key))) continue;
    torch_dist_moe::refuse_singleton_expert_key(key, f.metadata_label());
    const std::string base = gated_base(f, full_key);
    if (base.empty())
      keys.push_back(key);
    else if (key.ends_with("_w"))
      keys.push_back(base.substr(prefix.size()));
  }
  return keys;
}

// Its global shape, without reading it.
Shape global_shape(const DistcpFolder& f, const std::string& key, const std::string& prefix = "") {
  if (f.has(prefix + key)) return f.entry(prefix + key).size;
  Shape s = f.entry(prefix + key + "_w").size;
  s[has_layer_axis(key) ? 1 : 0] += f.entry(prefix + key + "_v").size[has_layer_axis(key) ? 1 : 0];
  return s;
}

// One tensor of a model key: our name and its index along the key's leading axes (layer, expert).
struct Piece {
  std::string ours;
  std::vector<int64_t> index;
};

// The tensors of model key `key` of global shape `s`: one per layer of a key with a layer axis and
// per expert of an expert key (torch_dist_moe.h), under our names, those `want` accepts. An
// expert's name is the sequential or the grouped experts' one, as `want` asks (without `want`:
// `grouped`).
std::vector<Piece> pieces_of(const std::string& key, const Shape& s, bool tied, model::ModelFamilyId family,
                             bool grouped,
                             const std::function<bool(const std::string&)>& want, const std::string& label) {
  const bool layer_axis = has_layer_axis(key), expert = torch_dist_moe::is_expert_key(key);
  const size_t expert_axis = layer_axis ? 1 : 0;
  MG_REQUIRE(!layer_axis || !s.empty(), label, ": the layer tensor '", key, "' has no layer axis");
  MG_REQUIRE(!expert || s.size() > expert_axis, label, ": the expert tensor '", key, "' has no expert axis");
  const int64_t L = layer_axis ? s[0] : 1, E = expert ? s[expert_axis] : 1;
  const std::string stack = layers_of(key);  // "decoder.layers.", BERT's "encoder.layers.", or none
  const size_t at = stack.size();
  int fixed_layer = -1;  // a key of one layer: its number
  std::string rest = stack.empty() ? key : key.substr(at);
  if (!layer_axis && !stack.empty()) {
    const size_t dot = key.find('.', at);
    MG_REQUIRE(dot != std::string::npos && dot - at <= 6 &&
                   key.find_first_not_of("0123456789", at) == dot,
               label, ": '", key, "' names no layer (", stack, "<N>.<module>)");
    fixed_layer = std::stoi(key.substr(at, dot - at));
    rest = key.substr(dot + 1);
  }
  const std::string experts = "mlp.experts.experts.";
  std::vector<Piece> out;
  for (int64_t i = 0; i < L; ++i) {
    const int layer = layer_axis ? int(i) : fixed_layer;
    for (int64_t e = 0; e < E; ++e) {
      std::string ours;
      if (expert) {
        const auto [seq, grp] =
            torch_dist_moe::expert_names(layer, rest.substr(rest.find(experts) + experts.size()), int(e));
        ours = want ? (want(seq) ? seq : want(grp) ? grp : "") : grouped ? grp : seq;
      } else {
        ours = ours_of(layer_axis ? stack + std::to_string(i) + "." + rest : key, tied, label, family);
        if (want && !ours.empty() && !want(ours)) ours.clear();
      }
      if (ours.empty()) continue;
      Piece p{ours, {}};
      if (layer_axis) p.index.push_back(i);
      if (expert) p.index.push_back(e);
      out.push_back(std::move(p));
    }
  }
  return out;
}

bool grouped_of(const CheckpointOnDisk& ckpt) {
  return training_args_from_json(ckpt.state.args).model.moe_grouped_gemm;
}

// What metadata.json would say about this checkpoint (files and partition dims aside).
json metadata_of(const CheckpointOnDisk& c) {
  CheckpointMetadata m;
  m.state = c.state;
  m.optimizer = json(nullptr);
  m.parallel = c.parallel;
  return json(checkpoint_metadata_to_json(m));
}

}  // namespace

bool is_torch_dist_checkpoint(const fs::path& dir) {
  if (!fs::is_regular_file(dir / "metadata.json")) return false;
  try {
    const json j = read_marker(dir);
    return j.is_object() && j.contains("sharded_backend");
  } catch (const Error&) {
    return false;  // not Megatron's marker: our own reader reports what is wrong with it
  }
}

CheckpointOnDisk open_torch_dist_checkpoint(const fs::path& dir, bool release,
                                            std::optional<int64_t> expected_iteration) {
  const std::string marker_label = (dir / "metadata.json").string();
  const json marker = read_marker(dir);
  const json backend = marker.value("sharded_backend", json());
  MG_REQUIRE(backend.is_string(), marker_label, ": \"sharded_backend\" is ", backend.dump(), ", not a name");
  const std::string name = backend.get<std::string>();
  MG_REQUIRE(name != "zarr", dir.string(), " is a Megatron-LM checkpoint of the zarr backend "
             "(--ckpt-format zarr, deprecated), which this build does not read: convert it with "
             "Megatron-LM to torch_dist or torch");
  MG_REQUIRE(name == "torch_dist", marker_label, ": sharded_backend \"", name.substr(0, 64),
             "\" is not read by this build (it reads torch_dist and Megatron-LM's torch .pt files)");
  const json version = marker.value("sharded_backend_version", json(1));
  MG_REQUIRE(version == json(1), marker_label, ": torch_dist version ", version.dump(),
             "; this build reads version 1");

  CheckpointOnDisk c;
  c.dir = dir;
  c.release = release;
  c.format = "torch_dist";
  c.files = json::object();
  const fs::path common_file = dir / kCommonFile;
  MG_REQUIRE(fs::is_regular_file(common_file), common_file.string(), " does not exist: the common state "
             "(args, iteration) of the torch_dist checkpoint is missing (an incomplete copy?)");
  const TorchFile common = TorchFile::open(common_file);
  const std::string label = common_file.string();
  const Value& root = common.root();
  MG_REQUIRE(root.kind == Kind::Dict, label, " holds a ", root.describe(), ", not Megatron's common state dict");
  const Value* ns = root.get("args");
  if (ns != nullptr && ns->kind != Kind::Namespace) ns = nullptr;
  json args = torch_args::args_of(ns, label, c.notes);
  c.parallel.tensor_model_parallel_size = arg_int(ns, "tensor_model_parallel_size", 1);
  c.parallel.pipeline_model_parallel_size = arg_int(ns, "pipeline_model_parallel_size", 1);
  c.parallel.data_parallel_size = arg_int(ns, "data_parallel_size", 1);
  c.parallel.distributed_optimizer = arg_flag(ns, "use_distributed_optimizer");

  // The structure, and what the arguments leave out, from .metadata.
  const DistcpFolder f = DistcpFolder::open(dir);
  json& model = args["model"];
  const std::vector<std::string> keys = model_keys(f);
  model["model_family"] = "gpt";
  const bool t5 = torch_dist_t5::is_t5(keys);
  if (t5) {
    model["model_family"] = "t5";  // T5Model (pretrain_t5.py): an encoder and a decoder block
  } else if (std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.starts_with("encoder."); })) {
    // BertModel (pretrain_bert.py): an encoder block, bidirectional, its binary head optional.
    model["model_family"] = "bert";
    model["attention_mask_type"] = "bidirectional";
    model["bert_binary_head"] = std::any_of(keys.begin(), keys.end(), [](const std::string& k) {
      return k.starts_with("binary_head.");
    });
  }
  int64_t layers_seen = 0;  // non-homogeneous keys: 1 + the largest layer number
  for (const std::string& key : keys) {
    const Shape size = global_shape(f, key);
    if (key == "embedding.word_embeddings.weight" && size.size() == 2) {
      if (model["padded_vocab_size"].get<int64_t>() == 0) model["padded_vocab_size"] = size[0];
      if (model["hidden_size"].get<int64_t>() == 0) model["hidden_size"] = size[1];
    }
    if (key == "embedding.position_embeddings.weight" && model["max_position_embeddings"].get<int64_t>() == 0)
      model["max_position_embeddings"] = size[0];
    if (has_layer_axis(key)) {
      MG_REQUIRE(!size.empty(), f.metadata_label(), ": the layer tensor '", key, "' has no layer axis");
      // T5's decoder block: a layer axis of its own (decoder_num_layers; num_layers: the encoder's)
      const char* count = t5 && key.starts_with(kLayers) ? "decoder_num_layers" : "num_layers";
      if (model.value(count, json()).is_null() || model[count].get<int64_t>() == 0) model[count] = size[0];
      MG_REQUIRE(size[0] == model[count].get<int64_t>(), f.metadata_label(), ": '", key, "' holds ",
                 size[0], " layers but the checkpoint's args say ", count, " ", model[count].get<int64_t>());
    } else if (!layers_of(key).empty()) {
      layers_seen = std::max(layers_seen, int64_t(std::stoll(key.substr(layers_of(key).size(), 9))) + 1);
    }
  }
  if (model["num_layers"].get<int64_t>() == 0) model["num_layers"] = layers_seen;
  c.state.args = args;
  TrainingArgs a;
  try {
    a = training_args_from_json(args);
  } catch (const json::exception& e) {
    MG_THROW(label, ": cannot read its arguments: ", e.what());
  }
  const Value* it = root.get("iteration");
  MG_REQUIRE(release || (it != nullptr && it->kind == Kind::Int && it->integer >= 0), label,
             ": no iteration number in the common state");
  c.state.iteration = release ? 0 : it->integer;
  MG_REQUIRE(release || !expected_iteration || c.state.iteration == *expected_iteration, label, " says iteration ",
             c.state.iteration, " but its folder is ", dir.filename().string());
  if (ns != nullptr) {
    const Value* s = ns->get("consumed_train_samples");
    if (s != nullptr && s->kind == Kind::Int) c.state.consumed_train_samples = s->integer;
    const Value* v = ns->get("consumed_valid_samples");
    if (v != nullptr && v->kind == Kind::Int) c.state.consumed_valid_samples = v->integer;
  }
  const Value* sched = root.get("opt_param_scheduler");
  c.state.scheduler = torch_args::scheduler_from_state(sched, a, &c.state.scheduler_num_steps);
  if (sched == nullptr) c.state.scheduler_num_steps = c.state.consumed_train_samples;
  c.state.grad_scaler_dynamic = a.fp16 && a.loss_scale == 0;
  c.state.grad_scaler.scale = a.fp16 ? (a.loss_scale > 0 ? a.loss_scale : a.initial_loss_scale) : 1.0;
  c.state.grad_scaler.hysteresis_tracker = a.hysteresis;
  // Megatron's generators cannot continue here: dropout resumes from the seed, one counter step
  // per micro-batch consumed (as for its .pt files).
  const int64_t mbs = a.micro_batch_size;
  c.state.rng = RngState{a.seed, uint64_t(mbs > 0 ? c.state.consumed_train_samples / mbs : 0)};
  c.state.optimizer_type = torch_dist_optimizer(f, root.get("optimizer"), common, c.state.iteration, c.notes).type;
  {  // said once per folder and process (the folder is opened by several readers)
    static std::mutex mu;
    static std::set<std::string> told;
    std::lock_guard<std::mutex> lock(mu);
    if (told.insert(dir.string()).second)
      for (const std::string& n : c.notes) log_info(dir.string(), ": ", n);
  }
  return c;
}

namespace {

// The global tensors of the model keys under `prefix` ("" for the weights, "optimizer.state.
// exp_avg." for a state of the optimizer), under our names, those `want` accepts.
std::map<std::string, Tensor> read_model_space(const CheckpointOnDisk& ckpt, const DistcpFolder& f,
                                               const std::string& prefix,
                                               const std::function<bool(const std::string&)>& want) {
  const std::string label = f.metadata_label();
  std::map<std::string, Tensor> out;
  // Tensor by tensor, each layer (and expert) of a stacked key read from its own chunks
  // (torch_dist_stream.h).
  for (const auto& [ours, source] : torch_dist_sources(ckpt, f, prefix, want)) {
    Tensor t = read_source(f, prefix, source);
    check_finite_tensor(t, prefix + source.key, label);
    // The router's expert_bias: a float32 buffer in Megatron, float64 state here.
    if (prefix.empty() && torch_dist_moe::is_expert_bias(ours)) t = t.to(DType::F64);
    out.emplace(ours, std::move(t));
  }
  return out;
}

}  // namespace

std::map<std::string, TorchDistSource> torch_dist_sources(const CheckpointOnDisk& ckpt, const DistcpFolder& f,
                                                          const std::string& prefix,
                                                          const std::function<bool(const std::string&)>& want) {
  const std::string label = f.metadata_label();
  const bool tied = tied_of(ckpt), grouped = grouped_of(ckpt);
  const model::ModelFamilyId family = family_of(ckpt);
  std::map<std::string, TorchDistSource> out;
  for (const std::string& key : model_keys(f, prefix))
    for (Piece& p : pieces_of(key, global_shape(f, key, prefix), tied, family, grouped, want, label)) {
      const auto [at, fresh] = out.emplace(p.ours, TorchDistSource{key, Shape(p.index.begin(), p.index.end())});
      // A norm keyed both by its module (input_layernorm.*, as earlier builds of this program keyed
      // local runs) and by the fused name (self_attention.linear_qkv.layer_norm_*) is one tensor twice.
      MG_REQUIRE(fresh, label, ": '", prefix + at->second.key, "' and '", prefix + key, "' both hold '", p.ours,
                 "' (one tensor under two of Megatron's names: files of two checkpoints mixed in one "
                 "folder?); save the checkpoint again from one run");
    }
  return out;
}

std::map<std::string, Tensor> read_torch_dist_model(const CheckpointOnDisk& ckpt,
                                                    const std::function<bool(const std::string&)>& want,
                                                    const std::string& prefix) {
  MG_CHECK(ckpt.format == "torch_dist", "read_torch_dist_model of a ", ckpt.format, " checkpoint");
  return read_model_space(ckpt, DistcpFolder::open(ckpt.dir), prefix, want);
}

std::map<std::string, Shape> torch_dist_model_shapes(const CheckpointOnDisk& ckpt) {
  const DistcpFolder f = DistcpFolder::open(ckpt.dir);
  std::map<std::string, Shape> out;
  for (const auto& [ours, source] : torch_dist_sources(ckpt, f)) out[ours] = source_shape(f, "", source);
  return out;
}

std::map<std::string, Tensor> read_torch_dist_shards(const CheckpointOnDisk& ckpt,
                                                     const std::map<std::string, Shape>& params,
                                                     const CheckpointRank& rank, const std::string& prefix,
                                                     bool zero_fill_rows) {
  std::map<std::string, Tensor> out;
  stream_torch_dist_shards(ckpt, params, rank, prefix, zero_fill_rows,
                           [&](const std::string& name, const Tensor& t) { out.emplace(name, t); });
  return out;
}

std::map<std::string, Tensor> cut_torch_dist_shards(const CheckpointOnDisk& ckpt, std::map<std::string, Tensor> full,
                                                    const std::map<std::string, Shape>& params,
                                                    const CheckpointRank& rank, bool zero_fill_rows) {
  const std::map<std::string, model::WeightSpec> specs = checkpoint_weight_specs(ckpt, json());
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : full) {
    if (!params.count(name)) continue;
    const Shape& shape = params.at(name);
    auto spec = specs.find(name);
    if (spec == specs.end() && torch_dist_moe::is_expert_bias(name)) {  // whole on every rank
      out.emplace(name, t);
      continue;
    }
    MG_REQUIRE(spec != specs.end(), ckpt.dir.string(), ": tensor '", name, "' is not a parameter of the "
               "model the checkpoint's args describe");
    const ShardRule rule = shard_rule(spec->second);
    const auto [tp_rank, T] = torch_dist_moe::tensor_split(rank, name);  // an expert's: over ETP
    if (rule.vocab && !shape.empty()) {
      const int64_t rows = shape[0] * (rule.dim == 0 ? T : 1);
      if (t.size(0) != rows) t = repad_rows(t, rows, zero_fill_rows);
    }
    out.emplace(name, T > 1 ? split_shard(t, rule, tp_rank, T) : t);
  }
  return out;
}

MergedCheckpoint merge_torch_dist_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer) {
  MergedCheckpoint m;
  m.source = ckpt;
  m.specs = checkpoint_weight_specs(ckpt, json());
  m.model = read_torch_dist_model(ckpt);
  for (auto it = m.model.begin(); it != m.model.end();) {  // state, not a weight: not converted
    if (!torch_dist_moe::is_expert_bias(it->first)) {
      ++it;
      continue;
    }
    m.notes.push_back("the router's expert_bias '" + it->first + "' is training state, not a weight: not converted");
    it = m.model.erase(it);
  }
  for (const auto& [name, t] : m.model) {
    auto spec = m.specs.find(name);
    MG_REQUIRE(spec != m.specs.end(), ckpt.dir.string(), ": tensor '", name, "' is not a parameter of the "
               "model the checkpoint's args describe");
    m.rules[name] = shard_rule(spec->second);
  }
  m.metadata = metadata_of(ckpt);
  auto emb = m.model.find("embedding.word_embeddings.weight");
  MG_REQUIRE(emb != m.model.end(), ckpt.dir.string(), " has no word embedding (not a GPT checkpoint?)");
  m.padded_vocab_size = emb->second.size(0);
  m.notes.insert(m.notes.begin(), ckpt.notes.begin(), ckpt.notes.end());
  if (with_optimizer && has_optimizer_state(ckpt)) merge_torch_dist_optimizer(ckpt, m);
  return m;
}

}  // namespace megatron::training
