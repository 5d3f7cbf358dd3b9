// Megatron-LM's distrib_optim.pt read into model space; see torch_distrib_optim.h.
#include "training/torch_distrib_optim.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/torch_file.h"
#include "training/torch_dist_buckets.h"

namespace megatron::training::torch_distrib {

using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kHow = ": resume with --no-load-optim (the weights load, the optimizer starts fresh)";
const char* const kKinds[] = {"param", "exp_avg", "exp_avg_sq"};

const Value* arg(const Value* ns, const char* name) {
  return ns != nullptr && ns->kind == Kind::Namespace ? ns->get(name) : nullptr;
}
int64_t int_arg(const Value* ns, const char* name, int64_t fallback) {
  const Value* v = arg(ns, name);
  return v != nullptr && v->kind == Kind::Int ? v->integer : fallback;
}
bool flag_arg(const Value* ns, const char* name) {
  const Value* v = arg(ns, name);
  return v != nullptr && v->kind == Kind::Bool && v->boolean;
}
int64_t numel_of(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>()); }

// The one optimizer's state in the file: a dict, or the first entry of a ChainedOptimizer list.
const Value& dense_state(const Value& root, const std::string& label) {
  if (root.kind == Kind::Dict) return root;
  MG_REQUIRE(root.kind == Kind::List && !root.items.empty(), label, " holds a ", root.describe(),
             ", not Megatron's distributed optimizer state (a dict, or a ChainedOptimizer's list of them)", kHow);
  MG_REQUIRE(root.items.size() == 1, label, " holds the states of ", root.items.size(),
             " chained optimizers; read is one (a dense model's)", kHow);
  const Value& s = *root.items[0];
  MG_REQUIRE(s.kind == Kind::Dict, label, ": its optimizer's state is a ", s.describe(),
             " (None: the folder's data-parallel rank 0 did not save it)", kHow);
  return s;
}

// The world tensors of the one gradient buffer, each [sum of the buckets' unpadded elements].
std::map<std::string, Tensor> world_tensors(const TorchFile& f, const Value& st,
                                            const std::vector<BufferBucket>& layout, const std::string& label) {
  int64_t total = 0;
  for (const BufferBucket& b : layout) total += b.unpadded;
  std::vector<const Value*> buffers;
  for (const auto& [k, v] : st.entries)
    if (k->kind == Kind::Int) buffers.push_back(v);
  MG_REQUIRE(buffers.size() == 1, label, " holds ", buffers.size(), " gradient buffers; read is one "
             "(parameters of one dtype)", kHow);
  const Value& by_dtype = *buffers[0];
  MG_REQUIRE(by_dtype.kind == Kind::Dict && by_dtype.entries.size() == 1, label, ": gradient buffer 0 is a ",
             by_dtype.describe(), ", not one dtype's state", kHow);
  const Value& w = *by_dtype.entries[0].second;
  MG_REQUIRE(w.kind == Kind::Dict, label, ": gradient buffer 0's state is a ", w.describe(), kHow);
  const Value* coalesced = st.get("buckets_coalesced");
  const bool per_bucket = st.get("per_bucket_numel_unpadded") != nullptr;
  MG_REQUIRE((coalesced != nullptr && coalesced->kind == Kind::Bool && coalesced->boolean) || per_bucket, label,
             " has neither \"buckets_coalesced\" (Megatron-Core since 0.8) nor \"per_bucket_numel_unpadded\" "
             "(earlier releases): a layout this build does not read", kHow);
  std::map<std::string, Tensor> out;
  for (const char* kind : kKinds) {
    const Value* v = w.get(kind);
    MG_REQUIRE(v != nullptr, label, " has no '", kind, "' in gradient buffer 0: not a saved Adam state "
               "(read are param, exp_avg, exp_avg_sq)", kHow);
    if (!per_bucket || v->kind == Kind::Tensor) {
      MG_REQUIRE(v->kind == Kind::Tensor && v->shape.size() == 1 && v->shape[0] == total, label, ": '", kind,
                 "' is ", v->kind == Kind::Tensor ? shape_str(v->shape) : v->describe(), ", but the gradient "
                 "buffer of the model its args describe holds ", total, " elements (another model, parameter "
                 "order, data-parallel size or bucket size)", kHow);
      out[kind] = f.tensor(*v).to(DType::F32);
      continue;
    }
    // Per bucket: each tensor the padded bucket, its unpadded head the state.
    MG_REQUIRE(v->kind == Kind::List && v->items.size() == layout.size(), label, ": '", kind, "' is ",
               v->describe(), ", but the model its args describe makes ", layout.size(), " buckets", kHow);
    Tensor flat = Tensor::zeros({total}, DType::F32);
    int64_t at = 0;
    for (size_t b = 0; b < layout.size(); ++b) {
      const Value* t = v->items[b];
      MG_REQUIRE(t->kind == Kind::Tensor && t->shape.size() == 1 && t->shape[0] >= layout[b].unpadded, label,
                 ": bucket ", b, " of '", kind, "' is ", t->describe(), ", but the model its args describe "
                 "holds ", layout[b].unpadded, " elements there", kHow);
      flat.narrow(0, at, layout[b].unpadded).copy_(f.tensor(*t).to(DType::F32).narrow(0, 0, layout[b].unpadded));
      at += layout[b].unpadded;
    }
    out[kind] = std::move(flat);
  }
  if (const Value* n = w.get("numel_unpadded"))
    MG_REQUIRE(n->kind == Kind::Int && n->integer == total, label, ": numel_unpadded is ", n->describe(),
               ", but the gradient buffer of the model its args describe holds ", total, " elements", kHow);
  return out;
}

bool transformer_engine(const Value* ns) {
  const Value* impl = arg(ns, "transformer_impl");
  return impl != nullptr && impl->kind == Kind::Str && impl->text == "transformer_engine";
}

}  // namespace

std::string unreadable(const Value* ns) {
  if (ns == nullptr || ns->kind != Kind::Namespace)
    return "the checkpoint has no args to rebuild Megatron's gradient buffer from";
  const Value* impl = arg(ns, "transformer_impl");
  if (impl == nullptr || impl->kind != Kind::Str)
    return "its args do not record transformer_impl, which decides the gradient buffer's parameter order";
  const std::string& i = impl->text;
  if (i != "local" && i != "transformer_engine")
    return "the gradient-buffer order of a --transformer-impl " + i.substr(0, 40) +
           " model is not modelled (read are Megatron-Core's local and Transformer Engine layer specs)";
  const Value* opt = arg(ns, "optimizer");
  if (opt != nullptr && opt->kind == Kind::Str && opt->text != "adam")
    return "its optimizer is " + opt->text.substr(0, 20) + " (Megatron's distributed optimizer saves Adam's state)";
  if (int_arg(ns, "virtual_pipeline_model_parallel_size", 1) > 1)
    return "it was saved with virtual pipeline stages (one gradient buffer per model chunk)";
  if (int_arg(ns, "num_experts", 0) > 1) return "it was saved with experts (the expert optimizer's buffers)";
  if (int_arg(ns, "data_parallel_size", 0) < 1) return "its args do not record data_parallel_size";
  return "";
}

SafetensorsContents read_rank(const TorchFile& model, const std::filesystem::path& model_file, const Value* ns,
                              const torch_detail::TorchOptimizers& layout,
                              const std::vector<torch_detail::TorchParam>& params, int p, int P,
                              int64_t num_layers, DType params_dtype) {
  const std::filesystem::path file = model_file.parent_path() / kDistribOptimFile;
  const std::string label = file.string();
  MG_REQUIRE(std::filesystem::exists(file), label, " is missing: ", model_file.string(), " was saved with "
             "--use-distributed-optimizer, whose optimizer state is in that file", kHow);
  const std::string why = unreadable(ns);
  MG_REQUIRE(why.empty(), label, ": ", why, kHow);
  std::map<std::string, Shape> local;  // the tied copy under the embedding's name
  for (const torch_detail::TorchParam& q : params) {
    if (q.buffer) continue;
    MG_REQUIRE(!q.name.starts_with("language_model."), label, ": the parameters are the legacy model's "
               "(megatron/model, '", q.name, "'), whose gradient-buffer order is not modelled (read are "
               "Megatron-Core's)", kHow);
    local[q.tied_copy ? std::string("embedding.word_embeddings.weight") : q.ours] = q.shape;
  }
  const bool tied = !flag_arg(ns, "untie_embeddings_and_output_weights");
  const int64_t DP = int_arg(ns, "data_parallel_size", 1);
  int64_t bucket_size = 0;
  if (flag_arg(ns, "overlap_grad_reduce") && p == 0)
    bucket_size = int_arg(ns, "ddp_bucket_size", 0) > 0 ? int_arg(ns, "ddp_bucket_size", 0)
                                                       : std::max<int64_t>(40000000, 1000000 * DP);
  std::set<std::string> placed;
  const std::vector<BufferBucket> buckets = megatron_buffer_layout(
      [&](const std::string& n) -> std::optional<Shape> {
        auto it = local.find(n);
        return it == local.end() ? std::nullopt : std::optional<Shape>(it->second);
      },
      p, P, num_layers, DP, tied, bucket_size, &placed, transformer_engine(ns));
  for (const auto& [name, shape] : local)
    MG_REQUIRE(placed.count(name) || name == "embedding.word_embeddings.weight", label, ": the model's tensor '",
               name, "' has no place this build knows in Megatron's gradient buffer", kHow);

  const TorchFile f = TorchFile::open(file);
  const std::map<std::string, Tensor> world = world_tensors(f, dense_state(f.root(), label), buckets, label);
  SafetensorsContents o;
  int64_t offset = 0;
  for (const BufferBucket& b : buckets) {
    for (const BufferSlot& s : b.params) {
      for (const char* kind : kKinds) {
        if (std::string(kind) == "param" && params_dtype == DType::F32) continue;  // the model's own
        Tensor v = world.at(kind).narrow(0, offset + s.start, numel_of(s.local)).contiguous().view(s.local).clone();
        const std::string ours = std::string(kind) == "param" ? "fp32_param" : kind;
        check_finite_tensor(v, s.name + " (optimizer " + ours + ")", label);
        o.tensors["optimizer.state." + ours + "." + s.name] = std::move(v);
      }
    }
    offset += b.unpadded;
  }
  // The step: DistributedOptimizer.state_dict keeps it in each parameter group.
  double step = 0;
  for (const torch_detail::TorchOptimizers::Part& part : layout.parts) {
    const Value* groups = part.inner != nullptr ? part.inner->get("param_groups") : nullptr;
    if (groups == nullptr || groups->kind != Kind::List) continue;
    for (const Value* g : groups->items) {
      const Value* s = g->kind == Kind::Dict ? g->get("step") : nullptr;
      if (s != nullptr && s->kind == Kind::Int) step = std::max(step, double(s->integer));
      if (s != nullptr && s->kind == Kind::Float) step = std::max(step, s->real);
      if (s != nullptr && s->kind == Kind::Tensor) step = std::max(step, model.tensor(*s).item_as_double(0));
    }
  }
  Tensor st = Tensor::empty({}, DType::I64);
  *st.data<int64_t>() = int64_t(step);
  o.tensors["optimizer.step"] = st;
  return o;
}

void write_rank(const std::filesystem::path& file, const std::map<std::string, Shape>& local,
                const BufferSpec& spec,
                const std::function<Tensor(const std::string& name, const std::string& kind)>& shard) {
  std::set<std::string> placed;
  const std::vector<BufferBucket> buckets = megatron_buffer_layout(
      [&](const std::string& n) -> std::optional<Shape> {
        auto it = local.find(n);
        return it == local.end() ? std::nullopt : std::optional<Shape>(it->second);
      },
      spec.p, spec.P, spec.num_layers, spec.data_parallel_size, spec.tied, spec.bucket_size, &placed,
      spec.transformer_engine);
  for (const auto& [name, shape] : local)
    MG_REQUIRE(placed.count(name) || name == "embedding.word_embeddings.weight", "the distributed optimizer's "
               "state cannot be written as Megatron's distrib_optim.pt: '", name, "' has no place this build knows "
               "in Megatron's gradient buffer; save with --ckpt-format torch_dist or this build's format");
  int64_t total = 0;
  for (const BufferBucket& b : buckets) total += b.unpadded;
  pickle::Document doc;
  Value* world = doc.dict();
  for (const char* kind : kKinds) {
    Tensor flat = Tensor::zeros({total}, DType::F32);  // the gaps between parameters: zeros
    int64_t offset = 0;
    for (const BufferBucket& b : buckets) {
      for (const BufferSlot& s : b.params) {
        const Tensor v = shard(s.name, kind).to(DType::F32).contiguous();
        MG_CHECK(v.shape() == s.local, "the ", kind, " shard of '", s.name, "' is ", shape_str(v.shape()),
                 ", its buffer slot ", shape_str(s.local));
        flat.narrow(0, offset + s.start, numel_of(s.local)).copy_(v.view({numel_of(s.local)}));
      }
      offset += b.unpadded;
    }
    doc.set(world, kind, doc.tensor(flat));
  }
  doc.set(world, "numel_unpadded", doc.integer(total));
  const DType grad = spec.params_dtype == DType::BF16 && !spec.grad_reduce_in_bf16 ? DType::F32 : spec.params_dtype;
  Value* by_dtype = doc.dict();
  pickle::Document::set(by_dtype, doc.tuple({doc.torch_dtype(spec.params_dtype), doc.torch_dtype(grad)}), world);
  Value* root = doc.dict();
  doc.set(root, "buckets_coalesced", doc.boolean(true));
  pickle::Document::set(root, doc.integer(0), by_dtype);
  doc.root = root;
  write_torch_file(file, *root, "distrib_optim");
}

Value* state_dict(pickle::Document& doc, const Value& plain, int64_t step) {
  const Value* inner = plain.get("optimizer");
  if (inner == nullptr) inner = &plain;  // FP32Optimizer: the torch optimizer's own
  const Value* groups = inner->get("param_groups");
  MG_CHECK(groups != nullptr && groups->kind == Kind::List, "the optimizer state dict has no param_groups");
  Value* out_groups = doc.list();
  for (const Value* g : groups->items) {
    Value* ng = doc.dict();
    for (const auto& [k, v] : g->entries)
      if (k->kind != Kind::Str || (k->text != "params" && k->text != "step")) pickle::Document::set(ng, k, v);
    doc.set(ng, "step", doc.integer(step));
    out_groups->items.push_back(ng);
  }
  Value* o = doc.dict();
  Value* opt = doc.dict();
  doc.set(opt, "param_groups", out_groups);
  doc.set(o, "optimizer", opt);
  for (const auto& [k, v] : plain.entries)
    if (k->kind == Kind::Str && k->text == "grad_scaler") pickle::Document::set(o, k, v);
  return o;
}

}  // namespace megatron::training::torch_distrib
