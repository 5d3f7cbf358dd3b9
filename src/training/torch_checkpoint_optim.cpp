// Megatron-LM's optimizer state in a model_optim_rng.pt file mapped onto parameters; see
// torch_checkpoint.h. The optimizer entry is one optimizer's state_dict (FP32Optimizer: torch's
// own; Float16OptimizerWithFloat16Params: {"optimizer", "grad_scaler", "fp32_from_fp16_params"})
// or, under expert parallelism, Megatron-Core's ChainedOptimizer's list of two: the dense
// parameters' optimizer, then the expert-parallel parameters' (is_expert_parallel groups).
#include <algorithm>

#include "core/error.h"
#include "core/torch_file.h"
#include "training/torch_checkpoint.h"
#include "training/torch_distrib_optim.h"

namespace megatron::training::torch_detail {

using pickle::Kind;
using pickle::Value;

namespace {

double number(const Value* v, double fallback) {
  if (v == nullptr) return fallback;
  if (v->kind == Kind::Float) return v->real;
  if (v->kind == Kind::Int) return double(v->integer);
  return fallback;
}

bool flag(const Value* ns, const char* name) {
  const Value* v = ns ? ns->get(name) : nullptr;
  return v != nullptr && v->kind == Kind::Bool && v->boolean;
}

// One optimizer's state_dict: the torch optimizer state_dict inside it and the fp32 main params.
TorchOptimizers::Part part_of(const Value* opt, std::string* unmappable) {
  TorchOptimizers::Part l;
  if (opt->kind != Kind::Dict) {
    *unmappable = "its \"optimizer\" entry is a " + opt->describe();
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
  return l;
}

// One optimizer's state onto `params` (Megatron's order), into `o`; false (and a note) when it
// does not fit.
bool map_one(const TorchFile& f, const TorchOptimizers::Part& ol, const std::vector<const TorchParam*>& ps,
             bool adam, DType params_dtype, const std::string& label, std::vector<std::string>& notes,
             SafetensorsContents& o, std::optional<double>& step) {
  struct View {
    const std::vector<const TorchParam*>& v;
    size_t size() const { return v.size(); }
    const TorchParam& operator[](size_t i) const { return *v[i]; }
  } params{ps};
  auto unmapped = [&](const std::string& why) {
    notes.push_back(label + ": optimizer state not loaded: " + why);
    return false;
  };
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
  const bool fp32_model = params_dtype == DType::F32;
  size_t gi = 0;
  for (size_t cg = 0; cg < chosen->size(); ++cg) {
    const std::vector<size_t>& gp = (*chosen)[cg];
    if (gp.empty()) continue;
    const size_t g = id_group_index[gi++];
    const Value* mains = nullptr;
    if (ol.fp32_groups != nullptr && ol.fp32_groups->kind == Kind::List && g < ol.fp32_groups->items.size())
      mains = ol.fp32_groups->items[g];
    for (size_t j = 0; j < gp.size(); ++j) {
      const TorchParam& prm = params[gp[j]];
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
        if (notes.empty() || !notes.back().ends_with("(fp32_from_fp16_params missing)"))
          notes.push_back(label + ": fp32 main weights taken from the " +
                          std::string(dtype_name(params_dtype)) +
                          " weights (fp32_from_fp16_params missing)");
      }
    }
  }
  return true;
}

}  // namespace

TorchOptimizers optimizer_layout(const Value* opt, const Value* ns) {
  TorchOptimizers l;
  if (opt == nullptr || opt->kind == Kind::None) {
    l.unmappable = "the checkpoint has no optimizer state (saved with --no-save-optim)";
    return l;
  }
  std::vector<const Value*> items;
  if (opt->kind == Kind::List) {  // ChainedOptimizer.state_dict() of several optimizers
    items.assign(opt->items.begin(), opt->items.end());
    if (items.empty() || items.size() > 2) {
      l.unmappable = "its optimizer is a ChainedOptimizer of " + std::to_string(items.size()) +
                     " optimizers (read are one, or Megatron-Core's dense and expert-parallel pair)";
      return l;
    }
  } else {
    items = {opt};
  }
  for (const Value* item : items) {
    l.parts.push_back(part_of(item, &l.unmappable));
    if (!l.unmappable.empty()) return l;
  }
  l.grad_scaler = l.parts[0].grad_scaler;
  bool stateless = false;
  for (const TorchOptimizers::Part& p : l.parts)
    stateless = stateless || p.inner->kind != Kind::Dict || p.inner->get("state") == nullptr;
  if (flag(ns, "use_distributed_optimizer") || stateless) {
    const std::string why = flag(ns, "use_distributed_optimizer") ? torch_distrib::unreadable(ns)
                                                                  : "its args do not say use_distributed_optimizer";
    if (why.empty() && l.parts.size() == 1) {
      l.distributed = true;
    } else {
      l.unmappable = "its optimizer state is in distrib_optim.pt (Megatron's distributed optimizer), which this "
                     "build does not read here: " + (why.empty() ? std::string("a chained optimizer") : why);
      l.parts.clear();
    }
  }
  return l;
}

std::optional<SafetensorsContents> map_optimizer(const TorchFile& f, const TorchOptimizers& l,
                                                 const std::vector<TorchParam>& params, bool adam,
                                                 DType params_dtype, const std::string& label,
                                                 std::vector<std::string>& notes) {
  if (!l.unmappable.empty()) {
    notes.push_back(label + ": optimizer state not loaded: " + l.unmappable);
    return std::nullopt;
  }
  // One optimizer over every parameter, or the dense one and the experts' (buffers have none).
  std::vector<std::vector<const TorchParam*>> subsets(l.parts.size());
  for (const TorchParam& p : params) {
    if (p.buffer) continue;
    subsets[l.parts.size() == 2 && p.expert ? 1 : 0].push_back(&p);
  }
  SafetensorsContents o;
  std::optional<double> step;
  for (size_t i = 0; i < l.parts.size(); ++i)
    if (!map_one(f, l.parts[i], subsets[i], adam, params_dtype, label, notes, o, step)) return std::nullopt;
  Tensor st = Tensor::empty({}, DType::I64);
  *st.data<int64_t>() = int64_t(step.value_or(0.0));
  o.tensors["optimizer.step"] = st;
  return o;
}

}  // namespace megatron::training::torch_detail
