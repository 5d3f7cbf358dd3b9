// pretrain-gpt --ckpt-format torch_dist: every rank writes its own items, as Megatron-Core's fully
// parallel save; see torch_dist_write.h.
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "core/error.h"
#include "training/checkpoint_files.h"
#include "training/torch_dist_buckets.h"
#include "training/torch_dist_buckets_family.h"
#include "training/torch_dist_buckets_moe.h"
#include "training/torch_dist_moe.h"
#include "training/torch_dist_t5.h"
#include "training/torch_dist_write.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Document;
using pickle::Value;
using torch_dist_io::WriteItem;

namespace {

constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kOutputLayer = "output_layer.weight";

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "torch.bfloat16";
    case DType::F16: return "torch.float16";
    default: return "torch.float32";
  }
}

// The distributed optimizer's state of this rank in Megatron's dp_reshardable buckets
// (torch_dist_buckets.h): the pieces it holds at their places in the flat buckets, with DP rank
// 0 writing the gaps between parameters (zeros) and the ShardedObjects. Under expert parallelism
// the experts' pieces go to the expert optimizer's buckets (torch_dist_buckets_moe.h), whose gaps
// and objects expert DP rank 0 writes.
void add_dp_reshardable_items(std::vector<WriteItem>& items, const fs::path& tmp, optim::MegatronOptimizer& opt,
                              const TrainingArgs& a, const CheckpointRank& rank, bool transformer_engine) {
  const model::ParameterList& ps = opt.parameters();
  std::map<std::string, const model::Parameter*> by_name;
  for (const model::Parameter* p : ps) by_name[p->name] = p;
  const bool tied = !a.model.untie_embeddings_and_output_weights;
  auto shape_of = [&](const std::string& n) -> std::optional<Shape> {
    auto it = by_name.find(n);
    if (it == by_name.end() && n == kWordEmbedding && tied) it = by_name.find(kOutputLayer);
    if (it == by_name.end()) return std::nullopt;
    return it->second->value.shape();
  };
  const int64_t E = a.model.num_moe_experts;
  const bool chained = stage_has_expert_buffer(a, rank.pp_rank, rank.pp_size, rank.ep_size);
  struct Buffer {
    std::vector<std::vector<BufferBucket>> chunks;  // gbuf_idx_<v>: model chunk v's buckets
    std::string g;  // the key prefix
    bool writer;    // rank 0 of its data-parallel group
    bool experts = false;  // the experts' optimizer (expert parallelism)
  };
  std::vector<Buffer> buffers;
  std::set<std::string> placed;
  const BufferModel family{a.model.family_id(), a.model.num_layers, a.model.decoder_layers(), tied,
                           transformer_engine, E};
  const int V = std::max(1, rank.vp_size);
  Buffer dense{{}, dp_reshardable_prefix(chained, false, rank.tp_rank + rank.tp_size * rank.pp_rank),
               rank.dp_rank == 0};
  for (int v = 0; v < V; ++v)
    dense.chunks.push_back(model_buffer_layout(
        family,
        [&](const std::string& n) { return chained && is_expert_param_name(n) ? std::nullopt : shape_of(n); },
        rank.pp_rank, rank.pp_size, rank.dp_size, 0, &placed, v, V));
  buffers.push_back(std::move(dense));
  if (chained)
    buffers.push_back({{megatron_buffer_layout(
                           [&](const std::string& n) { return is_expert_param_name(n) ? shape_of(n) : std::nullopt; },
                           rank.pp_rank, rank.pp_size, a.model.num_layers, rank.dp_size / rank.ep_size, false, 0,
                           &placed, transformer_engine, E)},
                       dp_reshardable_prefix(true, true, rank.tp_rank + rank.tp_size * (rank.ep_rank + rank.ep_size * rank.pp_rank)),
                       rank.edp_rank == 0, true});
  // name -> (buffer, chunk, bucket, start)
  std::map<std::string, std::tuple<size_t, size_t, size_t, int64_t>> where;
  for (size_t i = 0; i < buffers.size(); ++i)
    for (size_t v = 0; v < buffers[i].chunks.size(); ++v)
      for (size_t b = 0; b < buffers[i].chunks[v].size(); ++b)
        for (const BufferSlot& s : buffers[i].chunks[v][b].params) where[s.name] = {i, v, b, s.start};
  for (const model::Parameter* p : ps)
    MG_REQUIRE(where.count(p->name), "--ckpt-format torch_dist: the parameter '", p->name, "' has no place "
               "this build knows in Megatron's gradient buffer: save with this build's format (leave out "
               "--ckpt-format) or --no-save-optim");
  const DType pdtype = ps.empty() ? DType::F32 : ps[0]->value.dtype();
  const std::string dtype = "(" + torch_dtype_name(pdtype) + ", torch.float32)";
  auto add = [&](const Buffer& buf, size_t v, size_t b, const char* kind, int64_t at, const Tensor& data) {
    WriteItem it;
    it.key = buf.g + "gbuf_idx_" + std::to_string(v) + ".dtype_" + dtype + ".bucket_idx_" + std::to_string(b) + "." +
             kind;
    it.global = {buf.chunks[v][b].unpadded};
    it.offsets = {at};
    it.data = data.dtype() == DType::F32 ? data.contiguous().view({-1}) : data.to(DType::F32).contiguous().view({-1});
    items.push_back(std::move(it));
  };
  for (const optim::StatePiece& sp : opt.state_pieces()) {
    const model::Parameter& p = *ps[sp.param];
    const auto [i, v, b, start] = where.at(p.name);
    const int64_t at = start + sp.param_offset;
    add(buffers[i], v, b, "param", at, sp.main.defined() ? sp.main : p.value.view({-1}).narrow(0, sp.param_offset, sp.length));
    add(buffers[i], v, b, "exp_avg", at, sp.exp_avg);
    add(buffers[i], v, b, "exp_avg_sq", at, sp.exp_avg_sq);
  }
  for (const Buffer& buf : buffers) {
    if (!buf.writer) continue;
    for (size_t v = 0; v < buf.chunks.size(); ++v)
      for (size_t b = 0; b < buf.chunks[v].size(); ++b) {  // the gaps (Megatron's: garbage; here zeros)
        int64_t end = 0;
        for (const BufferSlot& s : buf.chunks[v][b].params) {
          if (s.start > end)
            for (const char* kind : {"param", "exp_avg", "exp_avg_sq"})
              add(buf, v, b, kind, end, Tensor::zeros({s.start - end}, DType::F32));
          end = s.start + std::accumulate(s.local.begin(), s.local.end(), int64_t(1), std::multiplies<>());
        }
      }
    auto numels = [&](bool padded) {
      return [&, padded](Document& d) {
        Value* per_buffer = d.list();  // one dict per gradient buffer (model chunk)
        for (const std::vector<BufferBucket>& layout : buf.chunks) {
          Value* counts = d.list();
          for (const BufferBucket& bk : layout) counts->items.push_back(d.integer(padded ? bk.padded : bk.unpadded));
          Value* by_dtype = d.dict();
          Document::set(by_dtype, d.tuple({d.torch_dtype(pdtype), d.torch_dtype(DType::F32)}), counts);
          per_buffer->items.push_back(by_dtype);
        }
        return d.list({per_buffer});  // the object in its ShardedObject list
      };
    };
    items.push_back(torch_dist_io::object_item(buf.g + "optimizer/shard_0_1", [&](Document& d) {
      return d.list({torch_dist_io::param_groups_state(d, a, true, opt.step_count(), buf.experts)});
    }, tmp));
    items.push_back(torch_dist_io::object_item(buf.g + "per_bucket_numel/shard_0_1", numels(true), tmp));
    items.push_back(torch_dist_io::object_item(buf.g + "per_bucket_numel_unpadded/shard_0_1", numels(false), tmp));
  }
}

}  // namespace

fs::path save_torch_dist_checkpoint(const fs::path& save_dir, const CheckpointState& state,
                                    const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                                    const CheckpointRank& rank, const TorchSaveOptions& options) {
  const TrainingArgs a = training_args_from_json(state.args);
  TrainingArgs checked = a;
  checked.transformer_impl = options.transformer_impl;  // not among the recorded args
  check_torch_dist_save(checked, rank.vp_size, rank.ep_size);
  const bool te = options.transformer_impl == "transformer_engine";
  const bool multi = rank.multi();
  const bool root = !multi || rank.world->rank() == 0;
  const std::string name = iteration_dir_name(state.iteration);
  const fs::path tmp = save_dir / (".tmp_" + name);
  if (root) {
    detail::create_private_dirs(save_dir);
    detail::clean_leftovers(save_dir);
    fs::remove_all(tmp);
    detail::create_private_dirs(tmp);
  }
  if (multi) rank.world->barrier();  // the temporary folder exists for everyone

  CheckpointMetadata cm;
  cm.state = state;
  const json meta = json(checkpoint_metadata_to_json(cm));
  const int T = rank.tp_size, P = rank.pp_size, t = rank.tp_rank, p = rank.pp_rank, d = rank.dp_rank;
  const int L = int(a.model.num_layers);
  const bool distributed = optimizer != nullptr && optimizer->shard().has_value();
  const bool adam = optimizer != nullptr && optimizer->config().type == optim::OptimizerType::Adam;
  std::vector<WriteItem> items;
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  // Main replicas: the dense tensors' on data-parallel rank 0, the experts' on expert
  // data-parallel rank 0 of each expert-parallel rank (replica id (PP, expert TP, expert DP rank)).
  const bool expert_writer = torch_dist_moe::writes_experts(rank);
  auto writes = [&](const model::Parameter& par) { return par.expert >= 0 ? expert_writer : d == 0; };
  if (d == 0 || expert_writer) {  // the weights, and the plain optimizer's state per parameter, chunked alike
    std::vector<std::pair<std::string, std::function<Tensor(const optim::StatePiece&, const model::Parameter&)>>> kinds;
    if (optimizer != nullptr && !distributed) {
      kinds.emplace_back("fp32_param", [](const optim::StatePiece& s, const model::Parameter&) { return s.main; });
      kinds.emplace_back(adam ? "exp_avg" : "momentum_buffer",
                         [](const optim::StatePiece& s, const model::Parameter&) { return s.exp_avg; });
      if (adam) kinds.emplace_back("exp_avg_sq", [](const optim::StatePiece& s, const model::Parameter&) { return s.exp_avg_sq; });
    }
    std::map<size_t, const optim::StatePiece*> piece_of;
    std::vector<optim::StatePiece> pieces;
    if (!kinds.empty()) pieces = optimizer->state_pieces();
    for (const optim::StatePiece& s : pieces) piece_of[s.param] = &s;
    const model::ParameterList& ops = optimizer != nullptr ? optimizer->parameters() : params;
    auto add_param = [&](const std::string& prefix, const model::Parameter& par, const Tensor& value) {
      const torch_dist_moe::KeyPlace place = torch_dist_moe::sharded_key(par.name, te, moe);
      const ShardRule rule = shard_rule(par);
      // An expert's split: over the expert tensor-parallel ranks (parallel folding).
      const auto [st, sT] = torch_dist_moe::tensor_split(rank, par.name);
      Shape global = par.value.shape();
      if (rule.dim >= 0) global[size_t(rule.dim)] *= sT;
      // The router's expert_bias: float64 state here, a float32 buffer in Megatron.
      const Tensor v = value.dtype() == DType::F64 ? value.to(DType::F32) : value;
      if (a.model.family_id() == model::ModelFamilyId::t5) {  // its blocks' layer counts, the head's alias
        for (const std::string& key : torch_dist_t5::keys_of(par.name, place.key, !prefix.empty()))
          torch_dist_moe::add_chunks_at(items, prefix + key, place, int(torch_dist_t5::block_layers(key, a)), 0,
                                        global, rule.dim,
                                        torch_dist_io::local_chunks(v.view(par.value.shape()), rule, st, sT));
        return;
      }
      torch_dist_moe::add_chunks_at(items, prefix + place.key, place, L, moe.experts, global, rule.dim,
                                    torch_dist_io::local_chunks(v.view(par.value.shape()), rule, st, sT));
    };
    for (const model::Parameter* par : params)
      if (!par->shared && writes(*par)) add_param("", *par, par->value);
    for (const auto& [kind, get] : kinds)
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i]->shared || !piece_of.count(i) || !writes(*ops[i])) continue;
        const Tensor x = get(*piece_of.at(i), *ops[i]);
        if (x.defined()) add_param("optimizer.state." + kind + ".", *ops[i], x);
      }
  }
  if (distributed) {
    MG_REQUIRE(adam, "--ckpt-format torch_dist with --use-distributed-optimizer saves Adam's state (Megatron's "
               "distributed optimizer is Adam's); use --optimizer adam or leave out --ckpt-format");
    add_dp_reshardable_items(items, tmp, *optimizer, a, rank, te);
  }
  add_object_items(items, tmp, a, meta, t, T, p, P, d, rank.dp_size, te, expert_writer ? 0 : 1, rank.ep_rank,
                   rank.ep_size, torch_dist_moe::expert_tp_rank(rank));
  const int me = multi ? rank.world->rank() : 0;
  std::vector<torch_dist_io::ItemRecord> records = torch_dist_io::write_rank_files(tmp, me, items);
  detail::fsync_path(tmp, true);
  if (multi) {  // rank 0 describes every rank's items
    const std::vector<std::string> all =
        all_gather_strings(*rank.world, torch_dist_io::records_to_json(records).dump());
    records.clear();
    for (const std::string& s : all) {
      const std::vector<torch_dist_io::ItemRecord> r = torch_dist_io::records_from_json(json::parse(s));
      records.insert(records.end(), r.begin(), r.end());
    }
  }
  if (root) {
    torch_dist_io::write_dcp_metadata(tmp, records, (save_dir / name).string());
    torch_dist_io::CommonState c;
    c.meta = meta;
    c.tp = T;
    c.pp = P;
    c.dp = rank.dp_size;
    c.vp = rank.vp_size;
    c.ep = rank.ep_size;
    c.etp = rank.etp_size;
    c.dtype = params.empty() ? DType::F32 : params[0]->value.dtype();
    c.padded_vocab_size = a.model.padded_vocab_size;
    c.transformer_impl = options.transformer_impl;
    if (optimizer != nullptr) c.optimizer_form = distributed ? "dp_reshardable" : "plain";
    c.chained = distributed && stage_has_expert_buffer(a, 0, P, rank.ep_size);
    c.optimizer_type = adam ? "adam" : "sgd";
    c.optimizer_step = optimizer != nullptr ? optimizer->step_count() : 0;
    torch_dist_io::write_common_files(tmp, c);
    detail::fsync_path(tmp, true);
    detail::publish_iteration(save_dir, tmp, name, std::to_string(state.iteration));
  }
  if (multi) rank.world->barrier();  // complete (renamed, tracker written) for everyone
  return save_dir / name;
}

void check_torch_dist_save(const TrainingArgs& a, int vp_size, int ep_size) {
  (void)ep_size;  // experts are written by their global numbers under any expert-parallel size
  const bool bert = a.model.family_id() == model::ModelFamilyId::bert;
  const bool t5 = a.model.family_id() == model::ModelFamilyId::t5;
  MG_REQUIRE(a.model.family_id() == model::ModelFamilyId::gpt || bert || t5,
             "--ckpt-format torch_dist saves GPT, BERT and T5 models here: leave out --ckpt-format (this build's "
             "format, which `checkpoint convert` reshards) or use --ckpt-format torch for other models");
  MG_REQUIRE(a.model.num_moe_experts == 0 || !a.parallel.use_distributed_optimizer || a.no_save_optim ||
                 !a.model.moe_grouped_gemm || a.transformer_impl != "local",
             "--ckpt-format torch_dist with --use-distributed-optimizer, --moe-grouped-gemm and --transformer-impl "
             "local: Megatron-Core's legacy GroupedMLP keeps one weight1 / weight2 per layer in its gradient "
             "buffer, which this build does not write; use --transformer-impl transformer_engine (TEGroupedMLP), "
             "leave out --moe-grouped-gemm, add --no-save-optim, or leave out --ckpt-format");
  MG_REQUIRE(a.model.num_moe_experts == 0 || !a.parallel.use_distributed_optimizer || a.no_save_optim ||
                 a.parallel.expert_tensor_parallel_size == 0 ||
                 a.parallel.expert_tensor_parallel_size == a.parallel.tensor_model_parallel_size,
             "--ckpt-format torch_dist with --use-distributed-optimizer and --expert-tensor-parallel-size other "
             "than --tensor-model-parallel-size: this build does not write the experts' dp_reshardable buffers "
             "sharded over their own tensor-parallel group; add --no-save-optim or leave out --ckpt-format");
  // Virtual pipeline stages: the keys hold global layer numbers whatever the chunking; the
  // dp_reshardable state has a gradient buffer per model chunk (GPT's layout, without experts).
  MG_REQUIRE(vp_size <= 1 || !a.parallel.use_distributed_optimizer || a.no_save_optim ||
                 (a.model.family_id() == model::ModelFamilyId::gpt && a.model.num_moe_experts == 0),
             "--ckpt-format torch_dist with virtual pipeline stages (--num-layers-per-virtual-pipeline-stage), "
             "--use-distributed-optimizer and ", a.model.num_moe_experts > 0 ? "experts" : "a BERT or T5 model",
             ": this build writes the distributed optimizer's per-chunk gradient buffers of dense GPT models "
             "only; save with the plain optimizer, with --no-save-optim, or leave out --ckpt-format");
}

}  // namespace megatron::training
