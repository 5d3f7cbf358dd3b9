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
#include "training/torch_distrib_optim.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

namespace {

fs::path rank_file(const CheckpointOnDisk& ckpt, int t, int p, int e = 0) {
  const CheckpointParallel& c = ckpt.parallel;
  return ckpt.dir / checkpoint_rank_dir(t, c.pipeline_model_parallel_size, p, c.expert_model_parallel_size, e) /
         kTorchCheckpointFile;
}

// "mp_rank_TT", "mp_rank_TT_XXX" or "mp_rank_TT_PPP_EEE" -> TT and the 3-digit numbers after it.
bool parse_rank_dir(const std::string& s, int* t, std::vector<int>* rest) {
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
  rest->clear();
  for (size_t at = 10; at < s.size(); at += 4) {
    int v = 0;
    if (s[at] != '_' || !digits(at + 1, 3, &v) || at + 4 > s.size()) return false;
    rest->push_back(v);
  }
  return rest->size() <= 2;
}

// The rank folders: TT and the numbers after it, all of one form.
struct Layout {
  int tp = 0, pp = 1, ep = 1;
  int suffixes = 0;  // 0: mp_rank_TT, 1: mp_rank_TT_XXX (PPP or EEE: the args tell), 2: _PPP_EEE
  std::set<std::vector<int>> ranks;  // {TT, numbers...}
};

Layout scan_layout(const fs::path& dir) {
  Layout l;
  std::set<size_t> forms;
  for (const auto& e : fs::directory_iterator(dir)) {
    int t = 0;
    std::vector<int> rest;
    if (!e.is_directory() || !parse_rank_dir(e.path().filename().string(), &t, &rest)) continue;
    if (!fs::exists(e.path() / kTorchCheckpointFile)) continue;
    forms.insert(rest.size());
    rest.insert(rest.begin(), t);
    l.ranks.insert(rest);
  }
  MG_REQUIRE(!l.ranks.empty(), dir.string(), " has no mp_rank_*/", kTorchCheckpointFile);
  MG_REQUIRE(forms.size() == 1, dir.string(), " mixes mp_rank_TT, mp_rank_TT_XXX and mp_rank_TT_PPP_EEE "
             "folders (files of different checkpoints?)");
  l.suffixes = int(*forms.begin());
  return l;
}

// Megatron's get_checkpoint_name appends _PPP when PP > 1 and _EEE when EP > 1, so one number
// after TT is the pipeline or the expert-parallel rank: as Megatron, decided by the arguments
// (the first file's pipeline_model_parallel_size / expert_model_parallel_size). Every rank's
// folder must be there.
void resolve_layout(Layout& l, const fs::path& dir, const Value* ns, const std::string& label) {
  auto size_arg = [&](const char* n) -> int64_t {
    const Value* v = ns ? ns->get(n) : nullptr;
    return v != nullptr && v->kind == Kind::Int ? v->integer : 0;
  };
  int max_t = 0, max_a = -1, max_b = -1;
  for (const std::vector<int>& r : l.ranks) {
    max_t = std::max(max_t, r[0]);
    if (r.size() > 1) max_a = std::max(max_a, r[1]);
    if (r.size() > 2) max_b = std::max(max_b, r[2]);
  }
  l.tp = max_t + 1;
  // The sizes the arguments record count too: a folder missing at the end is then named.
  const int64_t pp = size_arg("pipeline_model_parallel_size"), ep = size_arg("expert_model_parallel_size");
  if (l.suffixes == 2) {
    l.pp = int(std::max<int64_t>(max_a + 1, pp));
    l.ep = int(std::max<int64_t>(max_b + 1, ep));
  } else if (l.suffixes == 1) {
    MG_REQUIRE(!(pp > 1 && ep > 1), label, ": the arguments say pipeline_model_parallel_size ", pp,
               " and expert_model_parallel_size ", ep, " but the folders are mp_rank_TT_XXX (one "
               "rank number after TT; Megatron writes mp_rank_TT_PPP_EEE for both)");
    const bool expert = ep > 1;
    MG_REQUIRE(expert || pp > 1 || ns == nullptr || !ns->get("pipeline_model_parallel_size"), label,
               ": the folders are mp_rank_TT_XXX but the arguments say pipeline_model_parallel_size ",
               pp, " and expert_model_parallel_size ", std::max<int64_t>(ep, 1),
               " (Megatron adds the number only when one of them is above 1)");
    (expert ? l.ep : l.pp) = int(std::max<int64_t>(max_a + 1, expert ? ep : pp));
    if (expert && pp > 1) l.pp = int(pp);
  }
  for (int p = 0; p < l.pp; ++p)
    for (int t = 0; t < l.tp; ++t)
      for (int e = 0; e < l.ep; ++e) {
        std::vector<int> key = {t};
        if (l.suffixes == 2) key = {t, p, e};
        else if (l.suffixes == 1) key = {t, l.ep > 1 ? e : p};
        MG_REQUIRE(l.ranks.count(key),
                   (dir / checkpoint_rank_dir(t, l.pp, p, l.ep, e) / kTorchCheckpointFile).string(),
                   " is missing: the checkpoint has ", l.tp, " x ", l.pp, " x ", l.ep,
                   " tensor x pipeline x expert ranks but not this one's file (incomplete copy?)");
      }
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
         fs::exists(dir / "mp_rank_00_000" / kTorchCheckpointFile) ||
         fs::exists(dir / "mp_rank_00_000_000" / kTorchCheckpointFile);
}

CheckpointOnDisk open_torch_checkpoint(const fs::path& dir, bool release,
                                       std::optional<int64_t> expected_iteration) {
  CheckpointOnDisk c;
  c.dir = dir;
  c.release = release;
  c.format = "torch";
  c.files = json::object();
  Layout layout = scan_layout(dir);
  std::string first_dir = "mp_rank_00";
  for (int i = 0; i < layout.suffixes; ++i) first_dir += "_000";
  const fs::path first = dir / first_dir / kTorchCheckpointFile;
  const TorchFile f = TorchFile::open(first);
  const std::string label = first.string();
  const Value& root = f.root();
  MG_REQUIRE(root.kind == Kind::Dict, label, " holds a ", root.describe(),
             ", not a Megatron-LM checkpoint dict");
  const Value* ns = root.get("args");
  if (ns != nullptr && ns->kind != Kind::Namespace) ns = nullptr;
  resolve_layout(layout, dir, ns, label);
  c.parallel.tensor_model_parallel_size = layout.tp;
  c.parallel.pipeline_model_parallel_size = layout.pp;
  c.parallel.expert_model_parallel_size = layout.ep;
  json args = torch_args::args_of(ns, label, c.notes);
  // The folders are the truth about the layout.
  args["parallel"]["tensor_model_parallel_size"] = layout.tp;
  args["parallel"]["pipeline_model_parallel_size"] = layout.pp;
  args["parallel"]["expert_model_parallel_size"] = layout.ep;
  if (layout.ep > 1) {
    const int64_t experts = args["model"].value("num_moe_experts", int64_t(0));
    MG_REQUIRE(experts > 0 && experts % layout.ep == 0, label, ": the checkpoint has ", layout.ep,
               " expert-parallel ranks (mp_rank_*_EEE folders) but its arguments say num_experts ",
               experts, " (not a positive multiple of ", layout.ep, ")");
  }
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

  const torch_detail::TorchOptimizers opt = torch_detail::optimizer_layout(root.get("optimizer"), ns);
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

TorchRankContents read_torch_rank(const CheckpointOnDisk& ckpt, int t, int p, bool with_optimizer,
                                  int e) {
  MG_CHECK(ckpt.format == "torch", "read_torch_rank of a ", ckpt.format, " checkpoint");
  const fs::path file = rank_file(ckpt, t, p, e);
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
  // optimizer's parameter groups index this list. Expert numbers are the EP rank's from 0.
  const int EP = ckpt.parallel.expert_model_parallel_size;
  const int first_expert = EP > 1 ? e * (a.model.num_moe_experts / EP) : 0;
  std::vector<torch_detail::TorchParam> params;
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
      const int local_expert = torch_names::expert_number(ours);
      if (local_expert >= 0) {  // this EP rank's local expert J: ours is the global number
        MG_REQUIRE(local_expert < std::max(1, a.model.num_moe_experts / EP), label, ": '", name,
                   "' is local expert ", local_expert, " but each of the ", EP, " expert-parallel "
                   "ranks holds ", a.model.num_moe_experts / EP, " of num_experts ",
                   a.model.num_moe_experts);
        ours = torch_names::shift_expert(ours, first_expert);
      }
      // The router's expert_bias: a persistent float32 buffer in Megatron, float64 state here.
      const bool buffer = ours.ends_with(".mlp.router.expert_bias");
      params.push_back({ours, name, v->shape, no_wd, tied_copy, local_expert >= 0, buffer, v});
      if (tied_copy) continue;
      Tensor tensor = f.tensor(*v);
      if (buffer) tensor = tensor.to(DType::F64);
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

  // The optimizer state, through the parameter groups (torch_checkpoint_optim.cpp).
  const torch_detail::TorchOptimizers layout = torch_detail::optimizer_layout(root.get("optimizer"), ns);
  if (layout.distributed) {  // Megatron's distributed optimizer: distrib_optim.pt beside the file
    out.optimizer = torch_distrib::read_rank(f, file, ns, layout, params, p, P, L, a.model.params_dtype);
    return out;
  }
  out.optimizer = torch_detail::map_optimizer(f, layout, params, ckpt.state.optimizer_type == "adam",
                                              a.model.params_dtype, label, out.notes);
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
