// Reading Megatron-LM's model_optim_rng.pt checkpoints; see torch_checkpoint.h.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/torch_file.h"
#include "model/layer_spec.h"
#include "model/model_family.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

namespace {

std::string rank_dir_name(int t, int p, bool pipeline) {
  char name[32];
  if (pipeline)
    std::snprintf(name, sizeof name, "mp_rank_%02d_%03d", t, p);
  else
    std::snprintf(name, sizeof name, "mp_rank_%02d", t);
  return name;
}

fs::path rank_file(const CheckpointOnDisk& ckpt, int t, int p) {
  return ckpt.dir / rank_dir_name(t, p, ckpt.parallel.pipeline_model_parallel_size > 1) /
         kTorchCheckpointFile;
}

// "mp_rank_TT" or "mp_rank_TT_PPP" -> (TT, PPP or -1).
bool parse_rank_dir(const std::string& s, int* t, int* p) {
  auto digits = [&](size_t at, size_t n, int* out) {
    if (at + n > s.size()) return false;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
      v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
  };
  if (!s.starts_with("mp_rank_") || !digits(8, 2, t)) return false;
  if (s.size() == 10) {
    *p = -1;
    return true;
  }
  return s.size() == 14 && s[10] == '_' && digits(11, 3, p);
}

struct Layout {
  int tp = 0, pp = 0;
};

Layout scan_layout(const fs::path& dir) {
  std::set<std::pair<int, int>> ranks;
  bool with_pp = false, without_pp = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    int t = 0, p = 0;
    if (!e.is_directory() || !parse_rank_dir(e.path().filename().string(), &t, &p)) continue;
    if (!fs::exists(e.path() / kTorchCheckpointFile)) continue;
    (p < 0 ? without_pp : with_pp) = true;
    ranks.emplace(t, std::max(p, 0));
  }
  MG_REQUIRE(!ranks.empty(), dir.string(), " has no mp_rank_*/", kTorchCheckpointFile);
  MG_REQUIRE(!(with_pp && without_pp), dir.string(), " mixes mp_rank_TT and mp_rank_TT_PPP folders");
  Layout l;
  for (const auto& [t, p] : ranks) {
    l.tp = std::max(l.tp, t + 1);
    l.pp = std::max(l.pp, p + 1);
  }
  for (int p = 0; p < l.pp; ++p)
    for (int t = 0; t < l.tp; ++t)
      MG_REQUIRE(ranks.count({t, p}), (dir / rank_dir_name(t, p, with_pp) / kTorchCheckpointFile).string(),
                 " is missing: the checkpoint has ", l.tp, " x ", l.pp,
                 " tensor x pipeline ranks but not this one's file (incomplete copy?)");
  return l;
}

double number(const Value* v, double fallback) {
  if (v == nullptr) return fallback;
  if (v->kind == Kind::Float) return v->real;
  if (v->kind == Kind::Int) return double(v->integer);
  return fallback;
}

double checkpoint_version(const Value& root) { return number(root.get("checkpoint_version"), 0.0); }

// The model state dicts: "model", or "model0", "model1", ... (virtual pipeline stages).
std::vector<const Value*> model_chunks(const Value& root, const std::string& label) {
  if (const Value* m = root.get("model")) return {m};
  std::vector<const Value*> out;
  for (int c = 0;; ++c) {
    const Value* m = root.get("model" + std::to_string(c));
    if (m == nullptr) break;
    out.push_back(m);
  }
  MG_REQUIRE(!out.empty(), label, " has no \"model\" state dict (not a Megatron-LM checkpoint?)");
  return out;
}

// A nested state dict as dotted names (legacy models nest dicts per module).
void flatten(const Value& v, const std::string& prefix, int depth, const std::string& label,
             std::vector<std::pair<std::string, const Value*>>& out) {
  MG_REQUIRE(depth < 12, label, ": the model state dict nests deeper than 12 levels at '", prefix, "'");
  for (const auto& [k, x] : v.entries) {
    MG_REQUIRE(k->kind == Kind::Str, label, ": a model state dict key is a ", k->describe());
    const std::string name = prefix.empty() ? k->text : prefix + "." + k->text;
    if (x->kind == Kind::Dict)
      flatten(*x, name, depth + 1, label, out);
    else
      out.emplace_back(name, x);
  }
}

bool flag(const Value* ns, const char* name) {
  const Value* v = ns ? ns->get(name) : nullptr;
  return v != nullptr && v->kind == Kind::Bool && v->boolean;
}

// Megatron's model-architecture arguments, copied as they are into our args (read by
// --use-checkpoint-args and the resharding rules).
void copy_architecture(const Value* ns, json& args) {
  static const char* keys[] = {"swiglu", "untie_embeddings_and_output_weights", "add_bias_linear",
                               "add_qkv_bias", "add_position_embedding", "position_embedding_type",
                               "normalization", "rotary_percent", "rotary_base", "apply_layernorm_1p",
                               "group_query_attention", "openai_gelu", "transformer_impl"};
  if (ns == nullptr) return;
  for (const char* k : keys) {
    const Value* v = ns->get(k);
    if (v == nullptr) continue;
    if (v->kind == Kind::Bool) args[k] = v->boolean;
    else if (v->kind == Kind::Int) args[k] = v->integer;
    else if (v->kind == Kind::Float) args[k] = v->real;
    else if (v->kind == Kind::Str) args[k] = v->text;
    else if (v->kind == Kind::Enum && !v->member.empty()) args[k] = v->member;
  }
  // The legacy model's PositionEmbeddingType enum names Megatron-Core's types differently.
  if (args.contains("position_embedding_type") && args["position_embedding_type"].is_string()) {
    const std::string t = args["position_embedding_type"].get<std::string>();
    if (t == "absolute") args["position_embedding_type"] = "learned_absolute";
    if (t == "rotary") args["position_embedding_type"] = "rope";
  }
}

optim::LRSchedulerConfig scheduler_from(const Value* sd, const TrainingArgs& a, int64_t* num_steps) {
  optim::LRSchedulerConfig c;
  c.max_lr = a.lr < 0 ? 0.0 : a.lr;
  c.min_lr = a.min_lr;
  c.lr_warmup_init = a.lr_warmup_init;
  c.start_wd = a.start_weight_decay >= 0 ? a.start_weight_decay : a.weight_decay;
  c.end_wd = a.end_weight_decay >= 0 ? a.end_weight_decay : a.weight_decay;
  *num_steps = 0;
  if (sd == nullptr || sd->kind != Kind::Dict) return c;
  auto any = [&](std::initializer_list<const char*> names) -> const Value* {
    for (const char* n : names)
      if (const Value* v = sd->get(n)) return v;
    return nullptr;
  };
  auto text = [&](std::initializer_list<const char*> names) -> std::string {
    const Value* v = any(names);
    return v != nullptr && v->kind == Kind::Str ? v->text : "";
  };
  c.max_lr = number(any({"max_lr", "start_lr"}), c.max_lr);
  c.min_lr = number(any({"min_lr"}), c.min_lr);
  c.lr_warmup_init = number(any({"lr_warmup_init", "init_lr"}), c.lr_warmup_init);
  c.lr_warmup_steps = int64_t(number(any({"lr_warmup_steps", "warmup_steps", "warmup_iter"}), 0));
  c.lr_decay_steps = int64_t(number(any({"lr_decay_steps", "decay_steps", "end_iter"}), 0));
  c.wsd_decay_steps = int64_t(number(any({"wsd_decay_steps"}), 0));
  c.start_wd = number(any({"start_wd"}), c.start_wd);
  c.end_wd = number(any({"end_wd"}), c.end_wd);
  c.wd_incr_steps = int64_t(number(any({"wd_incr_steps"}), 0));
  *num_steps = int64_t(number(any({"num_steps", "num_iters"}), 0));
  try {
    if (const std::string s = text({"lr_decay_style", "decay_style"}); !s.empty())
      c.decay_style = optim::parse_lr_decay_style(s);
    if (const std::string s = text({"lr_wsd_decay_style"}); !s.empty())
      c.wsd_decay_style = optim::parse_wsd_decay_style(s);
    if (const std::string s = text({"wd_incr_style"}); !s.empty())
      c.wd_incr_style = optim::parse_wd_incr_style(s);
  } catch (const Error&) {
    // A style this build does not have: the schedule stays the arguments'.
  }
  return c;
}

// The optimizer dict's layout: the torch optimizer state_dict inside it, the fp32 main params,
// or why the state cannot be mapped.
struct OptimizerLayout {
  const Value* inner = nullptr;     // {"state", "param_groups"}
  const Value* fp32_groups = nullptr;  // [[tensor, ...], ...] of Float16OptimizerWithFloat16Params
  const Value* grad_scaler = nullptr;
  std::string unmappable;
};

OptimizerLayout optimizer_layout(const Value* opt, const Value* ns) {
  OptimizerLayout l;
  if (opt == nullptr || opt->kind == Kind::None) {
    l.unmappable = "the checkpoint has no optimizer state (saved with --no-save-optim)";
    return l;
  }
  if (opt->kind == Kind::List) {
    l.unmappable = "its optimizer is a ChainedOptimizer (a list of optimizers), which this build "
                   "does not map";
    return l;
  }
  if (opt->kind != Kind::Dict) {
    l.unmappable = "its \"optimizer\" entry is a " + opt->describe();
    return l;
  }
  const Value* inner = opt->get("optimizer");
  if (inner == nullptr) inner = opt->get("optimizer_state_dict");
  if (inner != nullptr) {
    l.fp32_groups = opt->get("fp32_from_fp16_params");
    if (l.fp32_groups == nullptr) l.fp32_groups = opt->get("fp32_from_fp16");
    l.grad_scaler = opt->get("grad_scaler");
  } else {
    inner = opt;  // FP32Optimizer: the torch optimizer's own state_dict
  }
  l.inner = inner;
  if (flag(ns, "use_distributed_optimizer") || inner->kind != Kind::Dict || inner->get("state") == nullptr) {
    l.unmappable = "its optimizer state is in distrib_optim.pt (Megatron's distributed optimizer), "
                   "which this build does not read";
    l.inner = nullptr;
  }
  return l;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// True the first time a file is named (its warnings are printed once per process).
bool warned_once(const std::string& label) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(label).second;
}

}  // namespace

bool is_torch_checkpoint(const fs::path& dir) {
  if (fs::exists(dir / "metadata.json")) return false;
  return fs::exists(dir / "mp_rank_00" / kTorchCheckpointFile) ||
         fs::exists(dir / "mp_rank_00_000" / kTorchCheckpointFile);
}

CheckpointOnDisk open_torch_checkpoint(const fs::path& dir, bool release,
                                       std::optional<int64_t> expected_iteration) {
  CheckpointOnDisk c;
  c.dir = dir;
  c.release = release;
  c.format = "torch";
  c.files = json::object();
  const Layout layout = scan_layout(dir);
  c.parallel.tensor_model_parallel_size = layout.tp;
  c.parallel.pipeline_model_parallel_size = layout.pp;
  const fs::path first = rank_file(c, 0, 0);
  const TorchFile f = TorchFile::open(first);
  const std::string label = first.string();
  const Value& root = f.root();
  MG_REQUIRE(root.kind == Kind::Dict, label, " holds a ", root.describe(),
             ", not a Megatron-LM checkpoint dict");
  const Value* ns = root.get("args");
  if (ns != nullptr && ns->kind != Kind::Namespace) ns = nullptr;
  json args = torch_args::args_of(ns, label, c.notes);
  // The folders are the truth about the layout.
  args["parallel"]["tensor_model_parallel_size"] = layout.tp;
  args["parallel"]["pipeline_model_parallel_size"] = layout.pp;
  const std::vector<const Value*> chunks = model_chunks(root, label);
  c.parallel.virtual_pipeline_model_parallel_size = int(chunks.size());
  if (chunks.size() > 1 && args["parallel"]["num_layers_per_virtual_pipeline_stage"].get<int64_t>() == 0) {
    const int64_t L = args["model"]["num_layers"].get<int64_t>();
    if (L % (layout.pp * int64_t(chunks.size())) == 0)
      args["parallel"]["num_layers_per_virtual_pipeline_stage"] = L / (layout.pp * int64_t(chunks.size()));
  }
  {  // What old checkpoints' arguments leave out, from the first rank's tensors.
    std::vector<std::pair<std::string, const Value*>> tensors;
    for (const Value* chunk : chunks) flatten(*chunk, "", 0, label, tensors);
    std::set<std::string> layers;
    json& model = args["model"];
    {  // The family from the parameter names of the first and last stages (Megatron's args do
       // not record the script): BERT's heads are on the last one.
      std::vector<std::string> names;
      for (const auto& [name, t] : tensors) names.push_back(name);
      if (layout.pp > 1) {
        const fs::path last_file = rank_file(c, 0, layout.pp - 1);
        const TorchFile last = TorchFile::open(last_file);
        MG_REQUIRE(last.root().kind == Kind::Dict, last_file.string(), " holds a ",
                   last.root().describe(), ", not a Megatron-LM checkpoint dict");
        std::vector<std::pair<std::string, const Value*>> last_tensors;
        for (const Value* chunk : model_chunks(last.root(), last_file.string()))
          flatten(*chunk, "", 0, last_file.string(), last_tensors);
        for (const auto& [name, t] : last_tensors) names.push_back(name);
      }
      try {
        model["model_family"] = torch_names::family_of(names);
      } catch (const Error& e) {
        MG_THROW(label, ": ", e.what());
      }
      const model::ModelFamilyId family =
          model::model_family_kind(model["model_family"].get<std::string>()).id;
      MG_REQUIRE(family != model::ModelFamilyId::t5 || layout.pp == 1, label, ": a T5 checkpoint of ",
                 layout.pp, " pipeline stages: Megatron's T5 .pt files are read for "
                 "--pipeline-model-parallel-size 1 only (reshard it to one stage with Megatron-LM's "
                 "tools, or keep this build's checkpoint format)");
      if (family == model::ModelFamilyId::bert) {  // BertModel (pretrain_bert.py)
        model["attention_mask_type"] = "bidirectional";
        model["bert_binary_head"] = std::any_of(names.begin(), names.end(), [](const std::string& n) {
          return n.starts_with("binary_head.");
        });
      }
    }
    for (const auto& [name, t] : tensors) {
      if (t->kind != Kind::Tensor || t->shape.empty()) continue;
      if (name.ends_with("word_embeddings.weight")) {
        if (model["padded_vocab_size"].get<int64_t>() == 0) model["padded_vocab_size"] = t->shape[0] * layout.tp;
        if (model["hidden_size"].get<int64_t>() == 0 && t->shape.size() == 2) model["hidden_size"] = t->shape[1];
      }
      if (name.ends_with("position_embeddings.weight") && model["max_position_embeddings"].get<int64_t>() == 0)
        model["max_position_embeddings"] = t->shape[0];
      const size_t at = name.find("layers.");
      // T5's num_layers is the encoder's depth (decoder_num_layers the decoder's).
      if (at != std::string::npos && (model::model_family_kind(model["model_family"].get<std::string>()).id !=
                                          model::ModelFamilyId::t5 ||
                                      name.starts_with("encoder.")))
        layers.insert(name.substr(0, name.find('.', at + 7)));
    }
    if (model["num_layers"].get<int64_t>() == 0)  // each rank holds 1/P of them
      model["num_layers"] = int64_t(layers.size()) * layout.pp;
  }
  if (const Value* dp = ns ? ns->get("data_parallel_size") : nullptr; dp && dp->kind == Kind::Int && dp->integer >= 1)
    c.parallel.data_parallel_size = int(dp->integer);
  c.state.args = args;
  TrainingArgs a;
  try {
    a = training_args_from_json(args);
  } catch (const json::exception& e) {
    MG_THROW(label, ": cannot read its arguments: ", e.what());
  }

  const Value* it = root.get("iteration");
  if (it == nullptr) it = root.get("total_iters");
  MG_REQUIRE(release || (it != nullptr && it->kind == Kind::Int && it->integer >= 0), label,
             ": no iteration number in the checkpoint");
  c.state.iteration = release ? 0 : it->integer;
  MG_REQUIRE(release || !expected_iteration || c.state.iteration == *expected_iteration, label,
             " says iteration ", c.state.iteration, " but its folder is ", dir.filename().string());
  if (ns != nullptr) {
    c.state.consumed_train_samples = int64_t(number(ns->get("consumed_train_samples"), 0));
    c.state.consumed_valid_samples = int64_t(number(ns->get("consumed_valid_samples"), 0));
  }
  const Value* sched = root.get("opt_param_scheduler");
  if (sched == nullptr) sched = root.get("lr_scheduler");
  c.state.scheduler = scheduler_from(sched, a, &c.state.scheduler_num_steps);
  if (sched == nullptr) c.state.scheduler_num_steps = c.state.consumed_train_samples;

  const OptimizerLayout opt = optimizer_layout(root.get("optimizer"), ns);
  c.state.grad_scaler_dynamic = a.fp16 && a.loss_scale == 0;
  c.state.grad_scaler.scale = a.fp16 ? (a.loss_scale > 0 ? a.loss_scale : a.initial_loss_scale) : 1.0;
  c.state.grad_scaler.hysteresis_tracker = a.hysteresis;
  if (opt.grad_scaler != nullptr && opt.grad_scaler->kind == Kind::Dict) {
    if (const Value* s = opt.grad_scaler->get("scale")) {
      if (s->kind == Kind::Tensor) {
        const Tensor t = f.tensor(*s);
        if (t.numel() == 1 && dtype_is_floating(t.dtype())) c.state.grad_scaler.scale = t.item_as_double(0);
      } else {
        c.state.grad_scaler.scale = number(s, c.state.grad_scaler.scale);
      }
    }
    c.state.grad_scaler.growth_tracker = int64_t(number(opt.grad_scaler->get("growth_tracker"), 0));
    c.state.grad_scaler.hysteresis_tracker =
        int64_t(number(opt.grad_scaler->get("hysteresis_tracker"), double(a.hysteresis)));
  }
  if (opt.unmappable.empty()) {
    c.state.optimizer_type = a.optimizer_name == "sgd" ? "sgd" : "adam";
  } else if (root.get("optimizer") != nullptr) {
    c.notes.push_back(opt.unmappable + ": the weights load, the optimizer starts fresh "
                      "(--no-load-optim, or --finetune)");
  }

  const Value* rng = root.get("rng_state");
  if (rng != nullptr && rng->kind == Kind::List && !rng->items.empty() && rng->items[0]->kind == Kind::Dict) {
    const Value* ours = rng->items[0]->get("dropout_rng_state");
    if (ours != nullptr && ours->kind == Kind::Dict && ours->get("seed") && ours->get("offset") &&
        ours->get("seed")->kind == Kind::Int && ours->get("offset")->kind == Kind::Int) {
      c.state.rng = RngState{uint64_t(ours->get("seed")->integer), uint64_t(ours->get("offset")->integer)};
    } else {
      // Megatron's generators cannot continue here: dropout resumes from the seed, one counter
      // step per micro-batch consumed.
      c.state.rng = RngState{a.seed, uint64_t(a.micro_batch_size > 0
                                                  ? c.state.consumed_train_samples / a.micro_batch_size
                                                  : 0)};
    }
  }
  for (const std::string& n : c.notes) log_info(dir.string(), ": ", n);
  return c;
}

TorchRankContents read_torch_rank(const CheckpointOnDisk& ckpt, int t, int p, bool with_optimizer) {
  MG_CHECK(ckpt.format == "torch", "read_torch_rank of a ", ckpt.format, " checkpoint");
  const fs::path file = rank_file(ckpt, t, p);
  const std::string label = file.string();
  const TorchFile f = TorchFile::open(file);
  const Value& root = f.root();
  MG_REQUIRE(root.kind == Kind::Dict, label, " holds a ", root.describe(), ", not a Megatron-LM checkpoint");
  const Value* ns = root.get("args");
  const double version = checkpoint_version(root);
  const TrainingArgs a = training_args_from_json(ckpt.state.args);
  const int T = ckpt.parallel.tensor_model_parallel_size, P = ckpt.parallel.pipeline_model_parallel_size;
  const std::vector<const Value*> chunks = model_chunks(root, label);
  const int V = int(chunks.size());
  MG_REQUIRE(V == ckpt.parallel.virtual_pipeline_model_parallel_size, label, " has ", V,
             " model chunks but the first rank's file has ", ckpt.parallel.virtual_pipeline_model_parallel_size);
  const int L = a.model.num_layers;
  MG_REQUIRE(L > 0 && L % (P * V) == 0, label, ": ", L, " layers (args.num_layers) do not split into ",
             P, " pipeline stages x ", V, " model chunks");
  const bool tied = !flag(ns, "untie_embeddings_and_output_weights");
  const int heads = a.model.num_attention_heads;
  const std::string block = model::model_family_of(a.model).block;
  const bool t5 = a.model.family_id() == model::ModelFamilyId::t5;
  TorchRankContents out;

  // The parameters in Megatron's order (model chunks, then each state dict's order): the
  // optimizer's parameter groups index this list.
  struct Param {
    std::string ours;
    std::string name;  // in the file
    Shape shape;
    bool no_wd;
    bool tied_copy;  // the last stage's copy of the word embedding: not a model tensor here
    const Value* value;
  };
  std::vector<Param> params;
  for (int c = 0; c < V; ++c) {
    const int offset = (c * P + p) * (L / (P * V));
    std::vector<std::pair<std::string, const Value*>> entries;
    flatten(*chunks[size_t(c)], "", 0, label, entries);
    // The legacy BertModel saves language_model, lm_head, binary_head, then the last stage's
    // word_embeddings_for_head, but registers the word embeddings' copy before its heads, and
    // its optimizer numbers parameters in registration order.
    std::stable_partition(entries.begin(), entries.end(), [](const auto& e) {
      return e.first.starts_with("language_model.") || e.first.starts_with("word_embeddings_for_head.");
    });
    std::set<std::string> names_in_chunk;
    for (const auto& e : entries) names_in_chunk.insert(e.first);
    for (const auto& [name, v] : entries) {
      bool tied_copy = false, legacy_qkv = false, alias = false;
      std::string ours;
      try {
        ours = t5 ? torch_names::t5_to_ours(name, &alias)
                  : torch_names::to_ours(name, offset, tied, &tied_copy, &legacy_qkv, block);
      } catch (const Error& e) {
        MG_THROW(label, ": ", e.what());
      }
      if (ours.empty()) continue;  // _extra_state, rotary buffers
      if (alias && names_in_chunk.count("lm_head." + name)) {
        // T5Model's second name of its head's output layer: the same tensor, not a parameter of
        // its own (named_parameters, and so the optimizer, count it once).
        const Value* primary = nullptr;
        for (const auto& [n2, v2] : entries)
          if (n2 == "lm_head." + name) primary = v2;
        MG_REQUIRE(v->kind == Kind::Tensor && primary->kind == Kind::Tensor &&
                       same_bytes(f.tensor(*v), f.tensor(*primary)),
                   label, ": '", name, "' and 'lm_head.", name, "' are one module's tensor in "
                   "Megatron-Core's T5Model but differ in this file");
        continue;
      }
      MG_REQUIRE(v->kind == Kind::Tensor, label, ": '", name, "' is a ", v->describe(), ", not a tensor");
      const bool no_wd = v->shape.size() == 1 || name.ends_with(".bias");
      params.push_back({ours, name, v->shape, no_wd, tied_copy, v});
      if (tied_copy) continue;
      Tensor tensor = f.tensor(*v);
      check_finite_tensor(tensor, name, label);
      if (legacy_qkv && version < 2.0) {
        MG_REQUIRE(heads > 0, label, ": checkpoint_version ", version, " stores QKV in an order that "
                   "depends on the number of attention heads, and the file has no \"args\" that "
                   "record it (num_attention_heads)");
        tensor = torch_names::fix_qkv_ordering(tensor, version, heads / T, a.model.head_dim(), label + ": '" + name + "'");
      }
      MG_REQUIRE(out.model.tensors.emplace(ours, tensor).second, label, ": two tensors map to '", ours,
                 "' (the second is '", name, "')");
    }
  }
  if (!with_optimizer || ckpt.state.optimizer_type.empty()) return out;

  // The optimizer state, through the parameter groups.
  const OptimizerLayout ol = optimizer_layout(root.get("optimizer"), ns);
  auto unmapped = [&](const std::string& why) {
    out.notes.push_back(label + ": optimizer state not loaded: " + why);
    return out;
  };
  if (!ol.unmappable.empty()) return unmapped(ol.unmappable);
  const Value* groups = ol.inner->get("param_groups");
  const Value* state = ol.inner->get("state");
  if (groups == nullptr || groups->kind != Kind::List || state->kind != Kind::Dict)
    return unmapped("no param_groups/state in its optimizer state_dict");
  std::vector<std::vector<int64_t>> ids;
  for (const Value* g : groups->items) {
    const Value* ps = g->kind == Kind::Dict ? g->get("params") : nullptr;
    if (ps == nullptr || ps->kind != Kind::List) return unmapped("a parameter group without \"params\"");
    ids.emplace_back();
    for (const Value* i : ps->items) {
      if (i->kind != Kind::Int) return unmapped("a parameter group lists a non-integer id");
      ids.back().push_back(i->integer);
    }
  }
  // Which of Megatron's groupings this is: [weight-decayed, not], [not, weight-decayed], or one.
  std::vector<size_t> wd, no_wd, all;
  for (size_t i = 0; i < params.size(); ++i) {
    (params[i].no_wd ? no_wd : wd).push_back(i);
    all.push_back(i);
  }
  std::vector<std::vector<std::vector<size_t>>> candidates = {{wd, no_wd}, {no_wd, wd}, {all}};
  std::vector<size_t> id_group_index;
  for (size_t g = 0; g < ids.size(); ++g)
    if (!ids[g].empty()) id_group_index.push_back(g);
  const std::vector<std::vector<size_t>>* chosen = nullptr;
  const bool adam = ckpt.state.optimizer_type == "adam";
  const std::vector<std::string> kinds = adam ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                                              : std::vector<std::string>{"momentum_buffer"};
  auto shapes_fit = [&](const std::vector<std::vector<size_t>>& groups_of_params) {
    size_t gi = 0;
    for (const auto& gp : groups_of_params) {
      if (gp.empty()) continue;
      if (gi >= id_group_index.size() || ids[id_group_index[gi]].size() != gp.size()) return false;
      const std::vector<int64_t>& gids = ids[id_group_index[gi]];
      for (size_t j = 0; j < gp.size(); ++j) {
        const Value* s = state->get(gids[j]);
        if (s == nullptr) continue;
        const Value* m = s->get(kinds[0]);
        if (m == nullptr || m->kind != Kind::Tensor || m->shape != params[gp[j]].shape) return false;
      }
      ++gi;
    }
    return gi == id_group_index.size();
  };
  for (const auto& cand : candidates)
    if (shapes_fit(cand)) {
      chosen = &cand;
      break;
    }
  if (chosen == nullptr)
    return unmapped(str("its ", ids.size(), " parameter groups do not match the model's ", params.size(),
                        " parameters (split into weight-decayed and not) by size and shape"));

  // The step: per parameter (torch), per group (Apex), or common.
  std::optional<double> step;
  auto take_step = [&](const Value* v) {
    if (v == nullptr) return;
    double s = 0;
    if (v->kind == Kind::Tensor) {
      const Tensor st = f.tensor(*v);
      if (st.numel() != 1 || !dtype_is_floating(st.dtype())) return;
      s = st.item_as_double(0);
    } else if (v->kind == Kind::Int || v->kind == Kind::Float) {
      s = number(v, 0);
    } else {
      return;
    }
    step = std::max(step.value_or(0.0), s);
  };
  take_step(state->get("common_step"));
  for (const Value* g : groups->items) take_step(g->get("step"));
  SafetensorsContents o;
  const bool fp32_model = a.model.params_dtype == DType::F32;
  size_t gi = 0;
  for (size_t cg = 0; cg < chosen->size(); ++cg) {
    const std::vector<size_t>& gp = (*chosen)[cg];
    if (gp.empty()) continue;
    const size_t g = id_group_index[gi++];
    const Value* mains = nullptr;
    if (ol.fp32_groups != nullptr && ol.fp32_groups->kind == Kind::List && g < ol.fp32_groups->items.size())
      mains = ol.fp32_groups->items[g];
    for (size_t j = 0; j < gp.size(); ++j) {
      const Param& prm = params[gp[j]];
      const Value* s = state->get(ids[g][j]);
      if (s != nullptr) take_step(s->get("step"));
      for (const std::string& k : kinds) {
        const Value* m = s != nullptr ? s->get(k) : nullptr;
        Tensor value;
        if (m == nullptr) {
          value = Tensor::zeros(prm.shape, DType::F32);  // never stepped
        } else {
          if (m->kind != Kind::Tensor || m->shape != prm.shape)
            return unmapped("'" + k + "' of '" + prm.ours + "' does not have the parameter's shape");
          value = f.tensor(*m).to(DType::F32);
          check_finite_tensor(value, prm.name + " (optimizer " + k + ")", label);
        }
        o.tensors["optimizer.state." + k + "." + prm.ours] = value;
      }
      if (fp32_model) continue;
      const Value* main = mains != nullptr && mains->kind == Kind::List && j < mains->items.size()
                              ? mains->items[j] : nullptr;
      if (main != nullptr && main->kind == Kind::Tensor && main->shape == prm.shape) {
        Tensor fp32 = f.tensor(*main).to(DType::F32);
        check_finite_tensor(fp32, prm.name + " (optimizer fp32 main weight)", label);
        o.tensors["optimizer.state.fp32_param." + prm.ours] = std::move(fp32);
      } else {
        o.tensors["optimizer.state.fp32_param." + prm.ours] = f.tensor(*prm.value).to(DType::F32);
        if (out.notes.empty() || !out.notes.back().ends_with("(fp32_from_fp16_params missing)"))
          out.notes.push_back(label + ": fp32 main weights taken from the " +
                              std::string(dtype_name(a.model.params_dtype)) +
                              " weights (fp32_from_fp16_params missing)");
      }
    }
  }
  Tensor st = Tensor::empty({}, DType::I64);
  *st.data<int64_t>() = int64_t(step.value_or(0.0));
  o.tensors["optimizer.step"] = st;
  out.optimizer = std::move(o);
  return out;
}

json torch_args::args_of(const Value* ns, const std::string& label, std::vector<std::string>& notes) {
  json args = ns != nullptr ? torch_args::from_namespace(*ns, label) : training_args_to_json(TrainingArgs{});
  if (ns == nullptr) notes.push_back("the checkpoint has no \"args\": give the model flags");
  if (ns != nullptr)
    if (const std::vector<std::string> unknown = torch_args::check_namespace(*ns, label);
        !unknown.empty() && warned_once(label)) {
      std::string names;
      for (const std::string& n : unknown) names += (names.empty() ? "" : ", ") + n;
      log_warn(label, ": the checkpoint's arguments include ", unknown.size(), " this build does "
               "not know (a newer Megatron-LM's; ignored): ", names);
    }
  copy_architecture(ns, args);
  return args;
}

optim::LRSchedulerConfig torch_args::scheduler_from_state(const Value* sd, const TrainingArgs& a,
                                                          int64_t* num_steps) {
  return scheduler_from(sd, a, num_steps);
}

}  // namespace megatron::training
