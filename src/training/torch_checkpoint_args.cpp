// Our argument set (training_args_to_json) as Megatron-LM's argparse.Namespace and back; see
// torch_checkpoint.h. Every leaf of our nested JSON has a Megatron argument name (its own name
// unless listed below), so the mapping is derived from the argument set itself and follows it as
// it grows. Our "unset" sentinels (0, -1, "") are Megatron's None.
#include <cmath>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "model/model_settings.h"
#include "model/transformer_config.h"
#include "training/megatron_arguments.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_args {

namespace {

using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

// Megatron's name of a leaf of our argument JSON ("" to leave out: derived at run time).
std::string megatron_name(const std::vector<std::string>& path) {
  const std::string joined = [&] {
    std::string s;
    for (const std::string& p : path) s += (s.empty() ? "" : ".") + p;
    return s;
  }();
  if (joined == "tokenizer.type") return "tokenizer_type";
  if (joined == "optimizer_name") return "optimizer";
  if (joined == "optimizer.type") return "";  // from --optimizer
  if (joined == "model.num_moe_experts") return "num_experts";  // Megatron's --num-experts
  if (joined == "tensorboard.dir") return "tensorboard_dir";
  if (joined == "tensorboard.log_interval") return "tensorboard_log_interval";
  if (joined == "tensorboard.queue_size") return "tensorboard_queue_size";
  if (joined == "data.seq_length" || joined == "data.seed" || joined == "data.tokenizer" ||
      joined.starts_with("data.tokenizer."))
    return "";
  return path.back();
}

// Megatron arguments whose None our JSON writes as this value.
bool is_unset(const std::string& name, const json& v) {
  static const std::set<std::string> zero_is_none = {
      "num_layers_per_virtual_pipeline_stage", "train_samples", "train_iters", "lr_decay_iters",
      "lr_decay_samples", "lr_wsd_decay_iters", "lr_wsd_decay_samples", "loss_scale",
      "exit_interval", "exit_duration_in_mins", "ddp_bucket_size", "vocab_size", "save_interval",
      "decoder_num_layers", "decoder_seq_length", "num_experts", "moe_ffn_hidden_size",
      "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk",
      "moe_expert_capacity_factor", "moe_z_loss_coeff", "expert_tensor_parallel_size"};
  static const std::set<std::string> negative_is_none = {
      "lr", "ckpt_step", "start_weight_decay", "end_weight_decay", "lr_warmup_fraction"};
  if (v.is_string()) return v.get<std::string>().empty();
  if (v.is_number() && zero_is_none.count(name)) return v.get<double>() == 0;
  if (v.is_number() && negative_is_none.count(name)) return v.get<double>() < 0;
  return false;
}

Value* to_value(pickle::Document& doc, const std::string& name, const json& v) {
  if (v.is_null()) return doc.none();
  if (name == "params_dtype" && v.is_string()) return doc.torch_dtype(dtype_from_name(v.get<std::string>()));
  if (v.is_boolean()) return doc.boolean(v.get<bool>());
  if (v.is_number_unsigned()) return doc.integer(int64_t(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX)));
  if (v.is_number_integer()) return doc.integer(v.get<int64_t>());
  if (v.is_number_float()) return doc.real(v.get<double>());
  if (v.is_string()) return doc.str(v.get<std::string>());
  if (v.is_array()) {
    Value* l = doc.list();
    for (const json& x : v) l->items.push_back(to_value(doc, "", x));
    return l;
  }
  return doc.str(v.dump());  // an object where a value was expected: kept readable
}

template <typename F>
void for_each_leaf(const json& j, std::vector<std::string>& path, const F& f) {
  for (const auto& [k, v] : j.items()) {
    path.push_back(k);
    if (v.is_object()) for_each_leaf(v, path, f);
    else f(path, v);
    path.pop_back();
  }
}

// A Namespace value as JSON of the type of `like` (nullopt when it does not fit).
std::optional<json> from_value(const Value& v, const json& like) {
  switch (v.kind) {
    case Kind::Bool:
      if (like.is_boolean() || like.is_null()) return json(v.boolean);
      return std::nullopt;
    case Kind::Int:
      if (like.is_number_float()) return json(double(v.integer));
      if (like.is_number_unsigned()) return v.integer >= 0 ? std::optional<json>(json(uint64_t(v.integer))) : std::nullopt;
      if (like.is_number_integer() || like.is_null()) return json(v.integer);
      return std::nullopt;
    case Kind::Float:
      if (like.is_number_float() || like.is_null()) return json(v.real);
      if (like.is_number_integer() && v.real == double(int64_t(v.real))) return json(int64_t(v.real));
      return std::nullopt;
    case Kind::Str:
      if (like.is_string() || like.is_null()) return json(v.text);
      return std::nullopt;
    case Kind::TorchDType:
      if (like.is_string()) return json(dtype_name(v.dtype));
      return std::nullopt;
    case Kind::Enum:
      if (like.is_string()) return json(v.member.empty() && !v.items.empty() && v.items[0]->kind == Kind::Str
                                            ? v.items[0]->text : v.member);
      return std::nullopt;
    case Kind::List:
    case Kind::Tuple: {
      if (!like.is_array()) return std::nullopt;
      json a = json::array();
      for (const Value* x : v.items) {
        if (x->kind == Kind::Str) a.push_back(x->text);
        else if (x->kind == Kind::Int) a.push_back(x->integer);
        else if (x->kind == Kind::Float) a.push_back(x->real);
        else return std::nullopt;
      }
      return a;
    }
    default: return std::nullopt;
  }
}

// A Namespace value as plain JSON (null for what JSON cannot hold).
json plain_value(const Value& v) {
  switch (v.kind) {
    case Kind::Bool: return v.boolean;
    case Kind::Int: return v.integer;
    case Kind::Float: return v.real;
    case Kind::Str: return v.text;
    case Kind::TorchDType: return dtype_name(v.dtype);
    case Kind::Enum:
      return v.member.empty() && !v.items.empty() && v.items[0]->kind == Kind::Str ? v.items[0]->text
                                                                                  : v.member;
    case Kind::List:
    case Kind::Tuple: {
      json a = json::array();
      for (const Value* x : v.items) a.push_back(plain_value(*x));
      return a;
    }
    default: return nullptr;
  }
}

json plain_namespace(const Value& ns) {
  json out = json::object();
  for (const auto& [k, v] : ns.entries)
    if (k->kind == Kind::Str) out[k->text] = plain_value(*v);
  return out;
}

// A value as Python prints it, for the comparison with MegatronArgument::neutral.
std::string python_text(const Value& v) {
  switch (v.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(v.integer);
    case Kind::Str: return "'" + v.text + "'";
    case Kind::Enum:
      if (!v.member.empty()) return v.member;
      return v.items.empty() ? v.text : python_text(*v.items[0]);
    case Kind::List:
    case Kind::Tuple: return v.items.empty() ? "None" : "[" + python_text(*v.items[0]) + ", ...]";
    default: return v.describe();
  }
}

bool is_neutral(const Value& v, const std::string& neutral) {
  if (v.kind == Kind::Float || (v.kind == Kind::Int && neutral.find('.') != std::string::npos)) {
    char* end = nullptr;
    const double n = std::strtod(neutral.c_str(), &end);
    return end != neutral.c_str() && *end == '\0' &&
           (v.kind == Kind::Float ? v.real : double(v.integer)) == n;
  }
  return python_text(v) == neutral;
}

}  // namespace

std::vector<std::string> check_namespace(const Value& ns, const std::string& label) {
  // The names our argument set reads (from_namespace below) besides the table's.
  static const TrainingArgs kDefaultArgs;  // (named: GCC 12 misreads the temporary)
  static const json kOurs = training_args_to_json(kDefaultArgs);
  std::set<std::string> ours;
  std::vector<std::string> path;
  for_each_leaf(kOurs, path,
                [&](const std::vector<std::string>& p, const json&) { ours.insert(megatron_name(p)); });
  std::vector<std::string> unknown;
  for (const auto& [k, v] : ns.entries) {
    if (k->kind != Kind::Str) continue;
    const std::string& name = k->text;
    if (is_derived_argument(name)) continue;  // validate_args' own (padded_vocab_size, ...)
    if (const MegatronArgument* a = find_argument_by_dest(name)) {
      MG_REQUIRE(a->neutral == nullptr || is_neutral(*v, a->neutral), label, ": the checkpoint's "
                 "arguments say ", name, " = ", python_text(*v), " (", a->flag, "), a model "
                 "feature this build does not implement (Megatron's default is ", a->neutral,
                 "); this model cannot be loaded here");
      continue;
    }
    if (!ours.count(name)) unknown.push_back(name);
  }
  return unknown;
}

Value* to_namespace(pickle::Document& doc, const json& ours, const json& extra) {
  Value* ns = doc.namespace_();
  std::set<std::string> done;
  for (const auto& [k, v] : extra.items()) {
    pickle::Document::set(ns, doc.str(k), to_value(doc, k, v));
    done.insert(k);
  }
  std::vector<std::string> path;
  for_each_leaf(ours, path, [&](const std::vector<std::string>& p, const json& v) {
    const std::string name = megatron_name(p);
    if (name.empty() || !done.insert(name).second) return;
    pickle::Document::set(ns, doc.str(name), is_unset(name, v) ? doc.none() : to_value(doc, name, v));
  });
  return ns;
}

json from_namespace(const Value& ns, const std::string& label) {
  MG_REQUIRE(ns.kind == Kind::Namespace, label, ": \"args\" is a ", ns.describe(),
             ", not an argparse.Namespace");
  static const TrainingArgs kDefaults;  // (a named object: GCC 12 misreads the temporary)
  json out = training_args_to_json(kDefaults);
  std::vector<std::string> path;
  json leaves = out;
  for_each_leaf(leaves, path, [&](const std::vector<std::string>& p, const json& like) {
    const std::string name = megatron_name(p);
    if (name.empty()) return;
    const Value* v = ns.get(name);
    if (v == nullptr || v->kind == Kind::None) return;
    if (auto j = from_value(*v, like)) {
      json* slot = &out;
      for (const std::string& k : p) slot = &(*slot)[k];
      *slot = *j;
    }
  });
  auto get = [&](const char* n) { return ns.get(n); };
  auto flag = [&](const char* n) {
    const Value* v = get(n);
    return v != nullptr && v->kind == Kind::Bool && v->boolean;
  };
  auto integer = [&](const char* n) -> std::optional<int64_t> {
    const Value* v = get(n);
    if (v == nullptr || v->kind != Kind::Int) return std::nullopt;
    return v->integer;
  };
  // Megatron's spellings that differ from ours, old and new.
  if (const auto tp = integer("model_parallel_size"); tp && !get("tensor_model_parallel_size"))
    out["parallel"]["tensor_model_parallel_size"] = *tp;
  // The model's settings through their rows (model/model_settings.h): Megatron's spellings
  // (group_query_attention, the activation switches, norm_epsilon, window_size, the legacy
  // position-embedding enum) are the rows' business.
  const model::RecordedConfig rec = model::config_from_checkpoint_args(plain_namespace(ns));
  model::TransformerConfig cfg;
  model::from_json(out["model"], cfg);
  for (const model::ModelSetting& s : model::model_settings())
    if (rec.recorded.count(s.key)) s.copy(cfg, rec.config);
  model::to_json(out["model"], cfg);
  if (!get("params_dtype") || get("params_dtype")->kind != Kind::TorchDType)
    out["model"]["params_dtype"] = flag("fp16") ? "float16" : flag("bf16") ? "bfloat16" : "float32";
  if (const auto v = integer("virtual_pipeline_model_parallel_size");
      v && *v > 1 && !integer("num_layers_per_virtual_pipeline_stage")) {
    const int64_t L = out["model"]["num_layers"].get<int64_t>();
    const int64_t P = out["parallel"]["pipeline_model_parallel_size"].get<int64_t>();
    if (P > 0 && L % (P * *v) == 0) out["parallel"]["num_layers_per_virtual_pipeline_stage"] = L / (P * *v);
  }
  // Megatron's MoE arguments of other types: --moe-layer-freq an int or a list (moe_freq_type),
  // --moe-router-load-balancing-type and --moe-aux-loss-coeff one value or a list of one.
  if (const Value* v = get("moe_layer_freq")) {
    if (v->kind == Kind::Int) {
      out["model"]["moe_layer_freq"] = std::to_string(v->integer);
    } else if (v->kind == Kind::List || v->kind == Kind::Tuple) {
      std::string list = "[";
      for (const Value* x : v->items) {
        MG_REQUIRE(x->kind == Kind::Int, label, ": moe_layer_freq holds a ", x->describe(),
                   " (a list of 0 and 1 per layer was expected)");
        list += (list.size() > 1 ? "," : "") + std::to_string(x->integer);
      }
      out["model"]["moe_layer_freq"] = list + "]";
    }
  }
  auto single = [&](const char* n) -> const Value* {
    const Value* v = get(n);
    if (v == nullptr || (v->kind != Kind::List && v->kind != Kind::Tuple)) return nullptr;
    MG_REQUIRE(v->items.size() == 1, label, ": ", n, " lists ", v->items.size(), " values; this "
               "build has one load-balancing type per model");
    return v->items[0];
  };
  if (const Value* x = single("moe_router_load_balancing_type"); x && x->kind == Kind::Str)
    out["model"]["moe_router_load_balancing_type"] = x->text;
  if (const Value* x = single("moe_aux_loss_coeff"); x && (x->kind == Kind::Float || x->kind == Kind::Int))
    out["model"]["moe_aux_loss_coeff"] = x->kind == Kind::Float ? x->real : double(x->integer);
  out["optimizer"]["type"] = out["optimizer_name"];
  out["data"]["seq_length"] = out["model"]["seq_length"];
  out["data"]["seed"] = out["seed"];
  out["data"]["tokenizer"] = out["tokenizer"]["type"];
  return out;
}

}  // namespace megatron::training::torch_args
