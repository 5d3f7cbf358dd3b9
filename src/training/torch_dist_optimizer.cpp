// The optimizer state of Megatron-LM's torch_dist checkpoints; see torch_dist_optimizer.h.
#include "training/torch_dist_optimizer.h"

#include <map>

#include "core/error.h"
#include "training/torch_dist_buckets.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron::training {

using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kState = "optimizer.state.";
constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kOutputLayer = "output_layer.weight";

bool has_prefix(const DistcpFolder& f, const std::string& prefix) {
  auto it = f.entries().lower_bound(prefix);
  return it != f.entries().end() && it->first.starts_with(prefix);
}

// Megatron's name of the fp32 main weights in this folder: "param" (the distributed optimizer's
// fully_reshardable format), "fp32_param" (the plain optimizer), or "" when not saved.
std::string main_param_kind(const DistcpFolder& f) {
  if (has_prefix(f, std::string(kState) + "param.")) return "param";
  if (has_prefix(f, std::string(kState) + "fp32_param.")) return "fp32_param";
  return "";
}

// A step count: an int, a float with an integer value, or a scalar tensor of the common state.
std::optional<int64_t> step_of(const Value* v, const TorchFile& file) {
  if (v == nullptr) return std::nullopt;
  if (v->kind == Kind::Int && v->integer >= 0) return v->integer;
  if (v->kind == Kind::Float && v->real >= 0 && v->real < 9e15 && v->real == double(int64_t(v->real)))
    return int64_t(v->real);
  if (v->kind == Kind::Tensor && v->shape.empty()) {
    const Tensor t = file.tensor(*v).to(DType::F64);
    const double x = *t.data<double>();
    if (x >= 0 && x < 9e15 && x == double(int64_t(x))) return int64_t(x);
  }
  return std::nullopt;
}

// The "param_groups" of the optimizer's common state: under "optimizer" (the distributed and the
// mixed-precision optimizers wrap the inner optimizer's state dict) or at its top (fp32).
const Value* param_groups_of(const Value* common) {
  if (common == nullptr || common->kind != Kind::Dict) return nullptr;
  const Value* inner = common->get("optimizer");
  const Value* g = inner != nullptr && inner->kind == Kind::Dict ? inner->get("param_groups") : nullptr;
  if (g == nullptr) g = common->get("param_groups");
  return g != nullptr && g->kind == Kind::List ? g : nullptr;
}

// The step count of dp_reshardable state: the param groups of model-parallel rank 0's
// "optimizer" ShardedObject (torch.save of [DistributedOptimizer.state_dict() minus the state]).
int64_t dp_reshardable_step(const DistcpFolder& f, int64_t iteration, std::vector<std::string>& notes) {
  // A ChainedOptimizer's (experts in an optimizer of their own): the dense one's, "chained_0."
  std::string key = "optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1";
  if (!f.has(key) && f.has("chained_0." + key)) key = "chained_0." + key;
  std::optional<int64_t> step;
  if (f.has(key) && f.entry(key).is_bytes) {
    const std::vector<uint8_t> bytes = f.bytes(key);
    const TorchFile obj = TorchFile::from_memory(bytes, f.metadata_label() + " item '" + key + "'");
    const Value& root = obj.root();
    const Value* state = root.kind == Kind::List && root.items.size() == 1 ? root.items[0] : &root;
    if (const Value* groups = param_groups_of(state); groups != nullptr && !groups->items.empty())
      step = step_of(groups->items[0]->get("step"), obj);
  }
  if (!step) {
    notes.push_back(f.metadata_label() + " records no optimizer step count ('" + key + "'): Adam's bias "
                    "correction continues from the iteration number (" + std::to_string(iteration) + ")");
    step = iteration;
  }
  return *step;
}

}  // namespace

TorchDistOptimizer torch_dist_optimizer(const DistcpFolder& f, const Value* common, const TorchFile& common_file,
                                        int64_t iteration, std::vector<std::string>& notes) {
  TorchDistOptimizer o;
  const std::string label = common_file.label();
  // A ChainedOptimizer's common state, {0: {...}, 1: {...}}: the first optimizer's (the dense one).
  if (common != nullptr && common->kind == Kind::Dict && common->get("param_state_sharding_type") == nullptr)
    if (const Value* first = common->get(int64_t(0)); first != nullptr && first->kind == Kind::Dict) common = first;
  const Value* sharding = common != nullptr && common->kind == Kind::Dict ? common->get("param_state_sharding_type")
                                                                           : nullptr;
  const std::string type = sharding != nullptr && sharding->kind == Kind::Str ? sharding->text : "";
  const bool adam = has_prefix(f, std::string(kState) + "exp_avg_sq.");
  const bool sgd = has_prefix(f, std::string(kState) + "momentum_buffer.");
  if (type == "dp_reshardable") {
    if (!has_dp_reshardable_state(f)) {
      o.note = "the distributed optimizer's dp_reshardable state is missing from " + f.metadata_label() +
               " (no bucket tensors): resume with --no-load-optim";
    } else {
      o.type = "adam";  // Megatron's distributed optimizer is Adam's
      o.main_params = true;
      o.dp_reshardable = true;
      o.step = dp_reshardable_step(f, iteration, notes);
    }
  } else if (!type.empty() && type != "fully_reshardable") {
    o.note = "the distributed optimizer's state is saved in Megatron's " + type.substr(0, 64) +
             " format" + (type == "dp_reshardable" ? " (flat buckets of its gradient buffers)" : "") +
             ", which this build does not read: resume with --no-load-optim (the weights load, the "
             "optimizer starts fresh), or save it with Megatron's --dist-ckpt-optim-fully-reshardable";
  } else if (!adam && !sgd) {
    if (has_prefix(f, "optimizer."))
      o.note = "the optimizer state of this torch_dist checkpoint is in none of the layouts this build "
               "reads (Adam's or SGD's state per parameter): resume with --no-load-optim";
  } else {
    o.type = adam ? "adam" : "sgd";
    o.main_params = !main_param_kind(f).empty();
    std::optional<int64_t> step;
    if (const Value* groups = param_groups_of(common); groups != nullptr && !groups->items.empty())
      step = step_of(groups->items[0]->get("step"), common_file);
    if (!step) {
      notes.push_back(label + " records no optimizer step count: Adam's bias correction continues "
                      "from the iteration number (" + std::to_string(iteration) + ")");
      step = iteration;
    }
    o.step = *step;
  }
  if (!o.note.empty()) notes.push_back(o.note);
  return o;
}

SafetensorsContents read_torch_dist_optimizer(const CheckpointOnDisk& ckpt, optim::MegatronOptimizer& optimizer,
                                              const CheckpointRank& rank) {
  const DistcpFolder f = DistcpFolder::open(ckpt.dir);
  const TorchFile common = TorchFile::open(ckpt.dir / "common.pt");
  std::vector<std::string> notes;
  const TorchDistOptimizer o =
      torch_dist_optimizer(f, common.root().get("optimizer"), common, ckpt.state.iteration, notes);
  MG_REQUIRE(!o.type.empty(), ckpt.dir.string(), ": ", o.note.empty() ? "no optimizer state" : o.note);
  const bool tied = !training_args_from_json(ckpt.state.args).model.untie_embeddings_and_output_weights;
  // name -> this rank's shape; the tied copy of the embedding reads the embedding's state.
  std::map<std::string, Shape> params;
  bool tied_copy = false, own_embedding = false;
  for (const model::Parameter* p : optimizer.parameters()) {
    own_embedding = own_embedding || p->name == kWordEmbedding;
    if (tied && p->name == kOutputLayer) {
      tied_copy = true;
      params.emplace(kWordEmbedding, p->value.shape());
    } else {
      params.emplace(p->name, p->value.shape());
    }
  }
  bool want_main = false;
  for (const optim::StatePiece& p : optimizer.state_pieces()) want_main = want_main || p.main.defined();
  std::vector<std::pair<std::string, std::string>> kinds;  // (Megatron's, ours)
  if (want_main && o.main_params) kinds.emplace_back(o.dp_reshardable ? "param" : main_param_kind(f), "fp32_param");
  if (o.type == "adam") {
    kinds.emplace_back("exp_avg", "exp_avg");
    kinds.emplace_back("exp_avg_sq", "exp_avg_sq");
  } else {
    kinds.emplace_back("momentum_buffer", "momentum_buffer");
  }
  std::map<std::string, std::map<std::string, Tensor>> buckets;  // dp_reshardable, in model space
  if (o.dp_reshardable) buckets = read_dp_reshardable_state(ckpt, f);
  SafetensorsContents out;
  Tensor step = Tensor::empty({}, DType::I64);
  *step.data<int64_t>() = o.step;
  out.tensors.emplace("optimizer.step", step);
  for (const auto& [theirs, ours] : kinds) {
    std::map<std::string, Tensor> t =
        o.dp_reshardable ? cut_torch_dist_shards(ckpt, buckets[theirs], params, rank, ours != "fp32_param")
                         : read_torch_dist_shards(ckpt, params, rank, std::string(kState) + theirs + ".",
                                                  ours != "fp32_param");
    for (auto& [name, x] : t) {
      const Tensor f32 = x.dtype() == DType::F32 ? x : x.to(DType::F32);
      if (name == kWordEmbedding && tied_copy) out.tensors.emplace("optimizer.state." + ours + "." + kOutputLayer, f32);
      if (name != kWordEmbedding || !tied_copy || own_embedding)
        out.tensors.emplace("optimizer.state." + ours + "." + name, f32);
    }
  }
  return out;
}

void merge_torch_dist_optimizer(const CheckpointOnDisk& ckpt, MergedCheckpoint& m) {
  const DistcpFolder f = DistcpFolder::open(ckpt.dir);
  const TorchFile common = TorchFile::open(ckpt.dir / "common.pt");
  std::vector<std::string> notes;
  const TorchDistOptimizer o =
      torch_dist_optimizer(f, common.root().get("optimizer"), common, ckpt.state.iteration, notes);
  if (o.type.empty()) return;  // the note is in ckpt.notes
  m.optimizer_type = o.type;
  m.optimizer_step = o.step;
  bool half = false;
  for (const auto& [name, t] : m.model) half = half || t.dtype() != DType::F32;
  std::vector<std::pair<std::string, std::string>> kinds;
  if (half && o.main_params) kinds.emplace_back(o.dp_reshardable ? "param" : main_param_kind(f), "fp32_param");
  std::map<std::string, std::map<std::string, Tensor>> buckets;  // dp_reshardable, in model space
  if (o.dp_reshardable) buckets = read_dp_reshardable_state(ckpt, f);
  for (const char* k : o.type == "adam" ? std::vector<const char*>{"exp_avg", "exp_avg_sq"}
                                        : std::vector<const char*>{"momentum_buffer"})
    kinds.emplace_back(k, k);
  for (const auto& [theirs, ours] : kinds) {
    std::map<std::string, Tensor> t = o.dp_reshardable ? std::move(buckets[theirs])
                                                        : read_torch_dist_model(ckpt, {}, std::string(kState) + theirs + ".");
    for (const auto& [name, x] : m.model)
      MG_REQUIRE(t.count(name), f.metadata_label(), " has no optimizer state '", kState, theirs, ".' for '",
                 name, "' (Megatron's key of that tensor): the checkpoint is incomplete; convert with "
                 "--no-save-optim");
    for (auto& [name, x] : t) {
      MG_REQUIRE(m.model.count(name) && x.shape() == m.model.at(name).shape(), f.metadata_label(),
                 ": the optimizer state '", kState, theirs, ".' of '", name, "' has shape ", shape_str(x.shape()),
                 ", not its parameter's");
      m.optimizer[ours][name] = x.dtype() == DType::F32 ? x : x.to(DType::F32);
    }
  }
}

}  // namespace megatron::training
