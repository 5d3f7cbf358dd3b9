// Checkpoint resharding; see checkpoint_convert.h for the rules.
#include "training/checkpoint_convert.h"

#include <fstream>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/tokenizer.h"
#include "model/stage_model.h"
#include "model/tensor_parallel.h"
#include "model/model_settings.h"
#include "training/torch_dist_checkpoint.h"
#include "training/torch_dist_write.h"
#include "model/weight_spec.h"
#include "optim/optimizer.h"
#include "training/checkpoint_files.h"
#include "training/hf_checkpoint_internal.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* const kWordEmbedding = "embedding.word_embeddings.weight";
const char* const kOutputLayer = "output_layer.weight";

// The global layer number of a "<block>.layers.<i>." name, or -1.
int layer_of(const std::string& name) {
  const std::string infix = ".layers.";
  const size_t at = name.find(infix);
  if (at == std::string::npos || at == 0) return -1;
  size_t i = at + infix.size(), end = i;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == i || end >= name.size() || name[end] != '.') return -1;
  return std::stoi(name.substr(i, end - i));
}

using detail::fsync_path;
using detail::set_mode;
using detail::write_text_file;

json read_metadata(const CheckpointOnDisk& ckpt) { return read_checkpoint_metadata(ckpt.dir); }

TrainingArgs args_of(const CheckpointOnDisk& ckpt) {
  try {
    return training_args_from_json(ckpt.state.args);
  } catch (const json::exception& e) {
    MG_THROW((ckpt.dir / "metadata.json").string(), ": malformed \"args\": ", e.what());
  }
}

// A boolean or string argument at the top level (Megatron's flat arguments) or in "model" (ours).
const json* model_arg(const json& args, const char* key) {
  for (const json* o : {&args, args.contains("model") ? &args["model"] : nullptr})
    if (o != nullptr && o->is_object() && o->contains(key)) return &(*o)[key];
  return nullptr;
}

// output_layer.weight is a parameter of its own, not the last stage's copy of the word embedding.
bool untied_output(const json& args) {
  const json* u = model_arg(args, "untie_embeddings_and_output_weights");
  return u && u->is_boolean() && u->get<bool>();
}

CheckpointRank rank_of(int tp_size, int tp_rank, int pp_size, int pp_rank,
                       const CheckpointParallel& parallel = {}) {
  CheckpointRank r;
  r.tp_size = tp_size;
  r.tp_rank = tp_rank;
  r.pp_size = pp_size;
  r.pp_rank = pp_rank;
  r.vp_size = parallel.virtual_pipeline_model_parallel_size;  // the loader's layout check compares it
  r.etp_size = parallel.expert_tensor_parallel_size;
  return r;
}

const std::vector<std::string>& moment_kinds(const std::string& type) {
  static const std::vector<std::string> adam{"exp_avg", "exp_avg_sq"}, sgd{"momentum_buffer"};
  return type == "adam" ? adam : sgd;
}

}  // namespace

ShardRule shard_rule(const model::WeightSpec& spec) {
  return {spec.partition_dim, spec.partition_dim >= 0 ? spec.partition_parts : 1,
          spec.partition_dim == 0 && spec.padded_vocab};
}

std::map<std::string, model::WeightSpec> config_weight_specs(const model::TransformerConfig& cfg) {
  return model::model_weight_specs(cfg);
}

std::map<std::string, model::WeightSpec> checkpoint_weight_specs(const CheckpointOnDisk& ckpt,
                                                                 const json& metadata) {
  const std::string label = (ckpt.dir / "metadata.json").string();
  if (metadata.is_object() && metadata.contains("weights")) {
    const json& rec = metadata["weights"];
    MG_REQUIRE(rec.is_object(), label, ": \"weights\" is not an object");
    std::map<std::string, model::WeightSpec> out;
    for (const auto& [name, r] : rec.items())
      out.emplace(name, model::weight_spec_from_json(name, r, label));
    return out;
  }
  // No record: the model the arguments describe (ours or Megatron-LM's), which must agree with
  // any partition dims the checkpoint recorded (format 2).
  std::map<std::string, model::WeightSpec> out =
      config_weight_specs(model::config_from_checkpoint_args(ckpt.state.args).config);
  if (metadata.is_object() && metadata.contains("parallel") && metadata["parallel"].is_object() &&
      metadata["parallel"].contains("partition_dims") &&
      metadata["parallel"]["partition_dims"].is_object())
    for (const auto& [name, d] : metadata["parallel"]["partition_dims"].items()) {
      auto it = out.find(name);
      MG_REQUIRE(it != out.end(), label, ": tensor '", name, "' is not a parameter of the model "
                 "its args describe");
      MG_REQUIRE(d.is_number_integer() && d.get<int>() == it->second.partition_dim, label,
                 ": partition dim ", d.dump(), " of '", name, "' disagrees with the model's ",
                 it->second.partition_dim);
    }
  return out;
}

Tensor merge_shards(const std::vector<Tensor>& shards, const ShardRule& rule) {
  MG_CHECK(!shards.empty(), "merge_shards without shards");
  if (rule.dim < 0 || shards.size() == 1) return shards[0];
  const int d = rule.dim;
  const Tensor& s0 = shards[0];
  MG_CHECK(d < s0.dim(), "merge_shards: dim ", d, " of ", shape_str(s0.shape()));
  for (const Tensor& s : shards)
    MG_REQUIRE(s.shape() == s0.shape() && s.dtype() == s0.dtype(), "tensor-parallel shards differ: ",
               shape_str(s.shape()), " vs ", shape_str(s0.shape()));
  const int64_t n = s0.size(d), T = int64_t(shards.size());
  Shape full = s0.shape();
  full[size_t(d)] = n * T;
  Tensor out = Tensor::empty(full, s0.dtype());
  if (rule.parts > 1) {  // shard r = [block_0 piece r; block_1 piece r; ...]
    MG_REQUIRE(n % rule.parts == 0, "a shard of ", n, " rows along dimension ", d,
               " is not ", rule.parts, " equal blocks");
    const int64_t piece = n / rule.parts;
    for (int64_t r = 0; r < T; ++r)
      for (int b = 0; b < rule.parts; ++b)
        out.narrow(d, b * T * piece + r * piece, piece)
            .copy_(shards[size_t(r)].narrow(d, b * piece, piece));
    return out;
  }
  for (int64_t r = 0; r < T; ++r) out.narrow(d, r * n, n).copy_(shards[size_t(r)]);
  return out;
}

Tensor split_shard(const Tensor& full, const ShardRule& rule, int rank, int size) {
  if (rule.dim < 0 || size == 1) return full;
  return model::shard_along(full, rule.dim, rank, size, rule.parts);
}

Tensor repad_rows(const Tensor& table, int64_t rows, bool zero_fill) {
  const int64_t have = table.size(0);
  if (rows == have) return table;
  if (rows < have) return table.narrow(0, 0, rows).contiguous();
  Shape s = table.shape();
  s[0] = rows;
  Tensor out = Tensor::empty(s, table.dtype());
  out.narrow(0, 0, have).copy_(table);
  for (int64_t r = have; r < rows; ++r) {
    Tensor row = out.narrow(0, r, 1);
    if (zero_fill)
      row.zero_();
    else
      row.copy_(table.narrow(0, have - 1, 1));
  }
  return out;
}

MergedCheckpoint merge_checkpoint(const CheckpointOnDisk& ckpt, bool with_optimizer) {
  if (ckpt.format == "torch") return merge_torch_checkpoint(ckpt, with_optimizer);
  if (ckpt.format == "torch_dist") return merge_torch_dist_checkpoint(ckpt, with_optimizer);
  MergedCheckpoint m;
  m.source = ckpt;
  m.metadata = read_metadata(ckpt);
  const std::string meta_label = (ckpt.dir / "metadata.json").string();
  const int T = ckpt.parallel.tensor_model_parallel_size, P = ckpt.parallel.pipeline_model_parallel_size;
  const bool untied = untied_output(ckpt.state.args);
  m.specs = checkpoint_weight_specs(ckpt, m.metadata);
  const bool optim = with_optimizer && has_optimizer_state(ckpt);
  if (optim) m.optimizer_type = ckpt.state.optimizer_type;
  MG_REQUIRE(!optim || m.optimizer_type == "adam" || m.optimizer_type == "sgd", meta_label,
             ": unknown optimizer type '", m.optimizer_type, "'");

  // name -> kind -> per-TP-rank shards ("param" is the model tensor).
  std::map<std::string, std::map<std::string, std::vector<Tensor>>> shards;
  std::map<std::string, int> stage_of;  // name -> source pipeline rank
  std::optional<int64_t> step;
  ProgressLine progress(true, 30);  // on a terminal; a plain line every 30 s in logs
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      if (progress.due())
        progress.update("reading " + progress_text(p * T + t, int64_t(P) * T, progress.elapsed(), "rank files"));
      const CheckpointRank rank = rank_of(T, t, P, p, ckpt.parallel);
      const std::string rel = rank.rank_dir() + "/model.safetensors";
      MG_REQUIRE(ckpt.parallel.expert_model_parallel_size > 1 || ckpt.files.contains(rel), meta_label,
                 " lists no ", rel, ": the checkpoint is ", ckpt.parallel.describe(),
                 " but that rank's model file is missing from it");
      // Under expert parallelism: every EP folder's experts, by their global numbers.
      SafetensorsContents st = detail::read_rank_tensors(ckpt, rank, "model.safetensors").contents;
      std::vector<std::string> names;
      for (auto& [name, tensor] : st.tensors) {
        if (P > 1 && name == kOutputLayer && p == P - 1 && p != 0 && !untied) {
          // The last stage's tied copy of the word embedding (not a single-rank parameter).
          if (t == 0) m.notes.push_back("dropped the last pipeline stage's tied copy of the word "
                                        "embedding (output_layer.weight)");
          continue;
        }
        auto [it, fresh] = stage_of.emplace(name, p);
        MG_REQUIRE(fresh || it->second == p, "tensor '", name, "' is in pipeline stages ",
                   it->second, " and ", p, " of ", ckpt.dir.string());
        auto& v = shards[name]["param"];
        MG_REQUIRE(int(v.size()) == t, (ckpt.dir / rel).string(), ": tensor '", name,
                   "' is missing from tensor-parallel rank ", v.size(), " of stage ", p);
        v.push_back(tensor);
        names.push_back(name);
      }
      if (!optim) continue;
      // The optimizer state through the trainer's own reader: a plain optimizer over this rank's
      // tensors, filled by load_optimizer_state (plain file or distributed shards).
      // The last stage of a PP > 1 checkpoint also has optimizer state for its tied copy of the
      // word embedding (output_layer.weight, not in its model file): read it as a parameter of the
      // embedding shard's shape, then drop it (it equals the first stage's).
      const bool tied_copy = P > 1 && p == P - 1 && !stage_of.count(kOutputLayer) &&
                             shards.count(kWordEmbedding) &&
                             int(shards[kWordEmbedding]["param"].size()) > t;
      std::vector<model::Parameter> params(names.size() + (tied_copy ? 1 : 0));
      model::ParameterList list;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].name = i < names.size() ? names[i] : kOutputLayer;
        params[i].value = i < names.size() ? shards[names[i]]["param"].back()
                                           : shards[kWordEmbedding]["param"][size_t(t)].clone();
        params[i].grad = Tensor::zeros(params[i].value.shape(), DType::F32);
        list.push_back(&params[i]);
      }
      optim::OptimizerConfig cfg;
      cfg.type = optim::parse_optimizer_type(m.optimizer_type);
      optim::Optimizer o(list, cfg);
      try {
        load_optimizer_state(ckpt, o, rank);
      } catch (const Error&) {
        if (!tied_copy) throw;
        // A checkpoint without state for the tied copy: read the stage's own parameters only.
        list.pop_back();
        optim::Optimizer own(list, cfg);
        load_optimizer_state(ckpt, own, rank);
        o = std::move(own);
      }
      MG_REQUIRE(!step || *step == o.step_count(), ckpt.dir.string(), ": optimizer.step of ",
                 rank.rank_dir(), " is ", o.step_count(), " but another rank's is ", *step);
      step = o.step_count();
      for (size_t i = 0; i < names.size(); ++i) {
        const optim::ParamState& s = o.state()[i];
        if (params[i].value.dtype() != DType::F32) shards[names[i]]["fp32_param"].push_back(s.main);
        shards[names[i]][moment_kinds(m.optimizer_type)[0]].push_back(s.exp_avg);
        if (m.optimizer_type == "adam") shards[names[i]]["exp_avg_sq"].push_back(s.exp_avg_sq);
      }
    }
  }
  if (step) m.optimizer_step = *step;
  for (auto& [name, kinds] : shards) {
    auto spec = m.specs.find(name);
    MG_REQUIRE(spec != m.specs.end(), meta_label, ": tensor '", name, "' has no weight record (",
               "not a parameter of the model the checkpoint's args describe)");
    const ShardRule rule = shard_rule(spec->second);
    const Tensor& first = kinds["param"][0];
    MG_REQUIRE(rule.dim < first.dim(), meta_label, ": partition dim ", rule.dim, " of '", name,
               "' but the tensor is ", shape_str(first.shape()));
    m.rules[name] = rule;
    // Experts sharded over ETP < T ranks: TP rank t's folder holds shard t % ETP.
    const int etp = spec->second.expert >= 0 ? ckpt.parallel.etp() : T;
    for (auto& [kind, v] : kinds) {
      MG_REQUIRE(int(v.size()) == T, ckpt.dir.string(), ": '", name, "' (", kind, ") is in ", v.size(),
                 " of ", T, " tensor-parallel ranks");
      if (etp != T) v.resize(size_t(etp));
      Tensor full = merge_shards(v, rule);
      if (kind == "param")
        m.model[name] = full;
      else
        m.optimizer[kind][name] = full;
    }
  }
  auto emb = m.model.find(kWordEmbedding);
  MG_REQUIRE(emb != m.model.end(), ckpt.dir.string(), " has no ", kWordEmbedding,
             " in any stage (not a GPT checkpoint, or the first stage's files are missing)");
  m.padded_vocab_size = emb->second.size(0);
  return m;
}

void repad_vocabulary(MergedCheckpoint& m, int64_t rows) {
  MG_REQUIRE(rows > 0, "padded vocabulary size must be > 0");
  for (auto& [name, rule] : m.rules) {
    if (!rule.vocab) continue;
    m.model[name] = repad_rows(m.model[name], rows, false);
    for (auto& [kind, tensors] : m.optimizer) {
      auto it = tensors.find(name);
      if (it != tensors.end()) it->second = repad_rows(it->second, rows, kind != "fp32_param");
    }
  }
  m.padded_vocab_size = rows;
}

std::map<std::string, Tensor> read_single_rank_model(const CheckpointOnDisk& ckpt,
                                                     int64_t padded_vocab_size) {
  MergedCheckpoint m = merge_checkpoint(ckpt, false);
  if (padded_vocab_size > 0 && padded_vocab_size != m.padded_vocab_size) {
    log_info("re-padding the vocabulary of ", ckpt.dir.string(), " from ", m.padded_vocab_size,
             " to ", padded_vocab_size, " rows");
    repad_vocabulary(m, padded_vocab_size);
  }
  for (const std::string& n : m.notes) log_info(ckpt.dir.string(), ": ", n);
  return std::move(m.model);
}

namespace convert_detail {

// The unpadded vocabulary size: given, or from the checkpoint's tokenizer arguments.
std::optional<int64_t> true_vocab_size(const ConvertOptions& o, const TrainingArgs& args,
                                       std::string* why_not) {
  if (o.true_vocab_size) return o.true_vocab_size;
  try {
    return data::build_tokenizer(o.tokenizer ? *o.tokenizer : args.tokenizer)->vocab_size();
  } catch (const Error& e) {
    *why_not = e.what();
    return std::nullopt;
  }
}

// The target layout checked against the model (before any tensor is read); `label` names the
// file the model's arguments come from.
model::PipelineLayout target_layout(const TrainingArgs& args, const ConvertOptions& o,
                                    const std::string& label) {
  const int P = o.target_pp;
  const int L = args.model.num_layers;
  MG_REQUIRE(L >= 1, label, ": args.model.num_layers is missing");
  MG_REQUIRE(L % P == 0, "--target-pipeline-parallel-size ", P, " does not divide the ", L,
             " layers (--num-layers) of the checkpoint");
  MG_REQUIRE(o.target_layers_per_virtual_stage == 0 ||
                 (P > 1 && (L / P) % o.target_layers_per_virtual_stage == 0),
             "--target-num-layers-per-virtual-pipeline-stage ", o.target_layers_per_virtual_stage,
             " needs --target-pipeline-parallel-size > 1 and must divide the ", L / P,
             " layers of each pipeline stage");
  return model::PipelineLayout::make(L, P, o.target_layers_per_virtual_stage);
}

// Writes m's single-rank tensors (vocabulary padded for the target) in the target layout and
// format; m.source and m.metadata describe the source.
ConvertResult write_target(MergedCheckpoint& m, const ConvertOptions& o,
                           const model::PipelineLayout& layout, int L, int64_t target_vocab,
                           ConvertResult res) {
  const CheckpointOnDisk& ckpt = m.source;
  const int T = o.target_tp, P = o.target_pp;
  // T5: an encoder of L layers and a decoder of its own depth, numbered from 0 each.
  const model::TransformerConfig& cfg = args_of(ckpt).model;
  const bool t5 = cfg.family_id() == model::ModelFamilyId::t5;
  MG_REQUIRE(!t5 || (P == 1 && ckpt.parallel.pipeline_model_parallel_size == 1),
             "checkpoint convert reshards T5 checkpoints over tensor-parallel ranks only "
             "(--target-pipeline-parallel-size 1, from one pipeline stage)");
  // Layers and stages.
  std::map<std::string, int> stage;
  std::set<std::pair<bool, int>> layers_seen;  // (decoder of a T5, layer)
  for (const auto& [name, t] : m.model) {
    const int layer = layer_of(name);
    if (layer >= 0) {
      const bool t5_decoder = t5 && name.starts_with("decoder.");
      const int depth = t5_decoder ? cfg.decoder_layers() : L;
      MG_REQUIRE(layer < depth, ckpt.dir.string(), ": tensor '", name, "' names layer ", layer,
                 " but the model's ", t5_decoder ? "decoder" : "layer stack", " has ", depth, " layers");
      layers_seen.emplace(t5_decoder, layer);
      stage[name] = (layer / layout.layers_per_chunk()) % P;  // virtual stage c * P + r
    } else if (name.starts_with("embedding.")) {
      stage[name] = 0;
    } else {  // after the layers: the final norm, the output layer, the family's heads
      stage[name] = P - 1;
    }
  }
  const int all_layers = L + (t5 ? cfg.decoder_layers() : 0);
  MG_REQUIRE(int(layers_seen.size()) == all_layers, ckpt.dir.string(), " holds tensors of ",
             layers_seen.size(), " of its ", all_layers, " layers (a pipeline stage's files are missing?)");

  const bool optim = !m.optimizer_type.empty();
  res.optimizer = optim;
  if (!optim)
    res.optimizer_note = o.drop_optimizer ? "dropped on request (--no-save-optim)"
                                          : "the source checkpoint has none";

  MG_REQUIRE(!o.use_distributed_optimizer || o.save_format == "torch", "--use-distributed-optimizer "
             "chooses Megatron's distrib_optim.pt files of --save-format torch (got --save-format ", o.save_format,
             "): drop it, or save with --save-format torch");
  if (o.save_format == "torch") {  // Megatron-LM's files (training/torch_checkpoint.h)
    m.metadata["args"]["model"]["padded_vocab_size"] = target_vocab;
    TorchSaveOptions so{o.transformer_impl};
    so.expert_model_parallel_size = o.target_ep;
    so.distributed_optimizer = o.use_distributed_optimizer && optim;
    res.dir = write_torch_checkpoint(m, o.save, T, P, o.target_layers_per_virtual_stage, so);
    res.num_tensors = m.model.size();
    res.num_files = size_t(T) * size_t(P) * size_t(o.target_ep);
    res.to = CheckpointParallel{T, P, ckpt.parallel.data_parallel_size, false};
    res.to.expert_model_parallel_size = o.target_ep;
    res.to.virtual_pipeline_model_parallel_size = layout.num_chunks;
    res.notes = m.notes;
    return res;
  }

  if (o.save_format == "torch_dist") {  // Megatron-LM's default format (training/torch_dist_write.h)
    // Layout-independent keys; common.pt records the target layout (EP, virtual stages).
    m.metadata["args"]["model"]["padded_vocab_size"] = target_vocab;
    TorchSaveOptions so{o.transformer_impl};
    so.expert_model_parallel_size = o.target_ep;
    res.dir = write_torch_dist_checkpoint(m, o.save, T, P, so, o.target_layers_per_virtual_stage);
    res.num_tensors = m.model.size();
    res.num_files = size_t(T) * size_t(P) * 2 + 3;
    res.to = CheckpointParallel{T, P, o.target_ep};
    res.to.expert_model_parallel_size = o.target_ep;
    res.to.virtual_pipeline_model_parallel_size = layout.num_chunks;
    res.notes = m.notes;
    return res;
  }

  // Write the folder under a temporary name.
  const std::string dir_name = ckpt.dir.filename().string();
  detail::create_private_dirs(o.save);
  const fs::path tmp = o.save / (".tmp_" + dir_name);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  set_mode(tmp, 0750);
  json files = json::object();
  json weights = json::object();
  for (const auto& [name, spec] : m.specs)
    if (m.model.count(name)) weights[name] = model::weight_spec_to_json(spec);
  const std::vector<std::string>& moments = optim ? moment_kinds(m.optimizer_type)
                                                  : std::vector<std::string>{};
  // --target-expert-model-parallel-size EP: one folder per EP rank, each with the dense tensors
  // and its block of E / EP experts (by the expert number each weight records).
  const int EP = o.target_ep;
  const json& margs = m.metadata.contains("args") ? m.metadata["args"] : json(nullptr);
  const int64_t experts = margs.is_object() && margs.contains("model") && margs["model"].is_object()
                              ? margs["model"].value("num_moe_experts", int64_t(0))
                              : 0;
  MG_REQUIRE(EP == 1 || (experts > 0 && experts % EP == 0), "--target-expert-model-parallel-size ",
             EP, ": the checkpoint's model has ", experts, " experts per MoE layer, not a positive "
             "multiple of ", EP);
  ProgressLine progress(true, 30);
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      for (int e = 0; e < EP; ++e) {
        if (progress.due())
          progress.update("writing " + progress_text(p * T + t, int64_t(P) * T, progress.elapsed(), "rank files"));
        const std::string rd = checkpoint_rank_dir(t, P, p, EP, e);
        fs::create_directories(tmp / rd);
        set_mode(tmp / rd, 0750);
        std::vector<std::pair<std::string, Tensor>> model_tensors, optim_tensors;
        if (optim) {
          Tensor step = Tensor::empty({}, DType::I64);
          *step.data<int64_t>() = m.optimizer_step;
          optim_tensors.emplace_back("optimizer.step", step);
        }
        for (const auto& [name, full] : m.model) {
          if (stage.at(name) != p) continue;
          if (const int x = m.specs.at(name).expert; EP > 1 && x >= 0 && x / (experts / EP) != e)
            continue;
          const ShardRule& rule = m.rules.at(name);
          model_tensors.emplace_back(name, split_shard(full, rule, t, T));
          if (!optim) continue;
          std::vector<std::string> kinds = moments;
          if (full.dtype() != DType::F32) kinds.insert(kinds.begin(), "fp32_param");
          for (const std::string& kind : kinds) {
            auto it = m.optimizer[kind].find(name);
            MG_REQUIRE(it != m.optimizer[kind].end(), ckpt.dir.string(), ": no optimizer state '",
                       kind, "' for '", name, "'");
            optim_tensors.emplace_back("optimizer.state." + kind + "." + name,
                                       split_shard(it->second, rule, t, T));
          }
        }
        if (optim && P > 1 && p == P - 1 && !m.model.count(kOutputLayer)) {
          // The last stage's tied copy of the word embedding: not in the model file, but the
          // trainer's optimizer there has state for it, equal to the first stage's.
          const Tensor& emb = m.model.at(kWordEmbedding);
          std::vector<std::string> kinds = moments;
          if (emb.dtype() != DType::F32) kinds.insert(kinds.begin(), "fp32_param");
          for (const std::string& kind : kinds)
            optim_tensors.emplace_back(
                std::string("optimizer.state.") + kind + "." + kOutputLayer,
                split_shard(m.optimizer[kind].at(kWordEmbedding), m.rules.at(kWordEmbedding), t, T));
        }
        detail::write_tensor_file(tmp, rd + "/model.safetensors", model_tensors, files);
        res.num_tensors += model_tensors.size();
        if (optim) detail::write_tensor_file(tmp, rd + "/optimizer.safetensors", optim_tensors, files);
        fsync_path(tmp / rd, true);
      }
    }
  }
  res.num_files = files.size();

  CheckpointMetadata meta = checkpoint_metadata_from_json(m.metadata, (ckpt.dir / "metadata.json").string());
  json src_parallel = m.metadata.contains("parallel") ? m.metadata["parallel"] : json(nullptr);
  if (src_parallel.is_object()) src_parallel.erase("partition_dims");
  meta.parallel = CheckpointParallel{T, P, ckpt.parallel.data_parallel_size, layout.num_chunks, false, EP};
  meta.weights = weights;
  meta.optimizer = optim ? json{{"type", m.optimizer_type}, {"distributed", false}} : json(nullptr);
  json& args = meta.state.args;
  args["parallel"]["tensor_model_parallel_size"] = T;
  args["parallel"]["pipeline_model_parallel_size"] = P;
  args["parallel"]["num_layers_per_virtual_pipeline_stage"] = o.target_layers_per_virtual_stage;
  args["parallel"]["expert_tensor_parallel_size"] = 0;  // the experts are split as the dense layers
  args["model"]["padded_vocab_size"] = target_vocab;
  meta.files = files;
  meta.converted_from = {{"load", fs::absolute(o.load).string()},
                         {"folder", dir_name},
                         {"parallel", src_parallel},
                         {"padded_vocab_size", res.padded_vocab_from},
                         {"optimizer_state", optim ? "resharded" : res.optimizer_note},
                         {"tool", "megatron checkpoint convert"}};
  detail::write_metadata(tmp, checkpoint_metadata_to_json(meta).dump(2) + "\n");
  fsync_path(tmp, true);
  res.dir = o.save / dir_name;
  detail::publish_iteration(o.save, tmp, dir_name,
                            ckpt.release ? std::string("release") : std::to_string(ckpt.state.iteration));
  res.to = CheckpointParallel{T, P, ckpt.parallel.data_parallel_size, false};
  res.to.expert_model_parallel_size = EP;
  res.notes = m.notes;
  return res;
}
}  // namespace convert_detail

using namespace convert_detail;

ConvertResult convert_checkpoint(const ConvertOptions& o) {
  MG_REQUIRE(!o.load.empty(), "--load is required: the checkpoint folder to convert");
  MG_REQUIRE(!o.save.empty(), "--save is required: the folder to write the converted checkpoint to");
  MG_REQUIRE(o.target_tp >= 1, "--target-tensor-parallel-size must be >= 1 (got ", o.target_tp, ")");
  MG_REQUIRE(o.target_pp >= 1, "--target-pipeline-parallel-size must be >= 1 (got ", o.target_pp, ")");
  MG_REQUIRE(o.target_ep >= 1, "--target-expert-model-parallel-size must be >= 1 (got ", o.target_ep, ")");
  MG_REQUIRE(o.target_ep == 1 || o.save_format == "safetensors" || o.save_format == "torch" ||
                 o.save_format == "torch_dist",
             "--target-expert-model-parallel-size ", o.target_ep, " with --save-format ",
             o.save_format, ": only this build's format and Megatron-LM's torch and torch_dist formats "
             "record an expert-parallel layout; leave the flag out");
  std::error_code ec;
  MG_REQUIRE(fs::is_directory(o.load, ec), "--load ", o.load.string(), " is not a directory");
  if (fs::exists(o.save, ec)) {
    MG_REQUIRE(fs::is_directory(o.save, ec), "--save ", o.save.string(), " exists and is not a folder");
    MG_REQUIRE(fs::is_empty(o.save, ec), "--save ", o.save.string(),
               " is not empty; the converter does not overwrite: pass a new or empty folder");
  }
  MG_REQUIRE(!fs::exists(o.save, ec) || !fs::equivalent(o.load, o.save, ec),
             "--save must differ from --load");
  MG_REQUIRE(o.save_format == "safetensors" || o.save_format == "torch" || o.save_format == "torch_dist" ||
                 o.save_format == "hf",
             "--save-format must be safetensors, torch, torch_dist or hf (got '", o.save_format, "')");
  if (o.load_format == "hf") return import_hf(o);
  auto found = find_checkpoint(o.load, o.ckpt_step);
  MG_REQUIRE(found.has_value(), "no checkpoint in --load ", o.load.string(),
             ": latest_checkpointed_iteration.txt is missing (pass --ckpt-step N to pick an "
             "iteration folder)");
  const CheckpointOnDisk& ckpt = *found;
  MG_REQUIRE(o.load_format == "auto" || o.load_format == ckpt.format, "--load-format ", o.load_format,
             ": ", ckpt.dir.string(), " holds a ", ckpt.format, " checkpoint",
             ckpt.format == "torch"        ? " (Megatron-LM's model_optim_rng.pt files)"
             : ckpt.format == "torch_dist" ? " (Megatron-LM's .metadata and .distcp files)"
                                           : " (metadata.json)");
  TrainingArgs args = args_of(ckpt);
  if (o.save_format == "hf") return export_hf(ckpt, args, o);
  const int T = o.target_tp;

  // Validate the target layout against the model before reading any tensor.
  const int L = args.model.num_layers;
  const model::PipelineLayout layout = target_layout(args, o, (ckpt.dir / "metadata.json").string());
  int64_t target_vocab = args.model.padded_vocab_size;
  const int src_tp = ckpt.parallel.tensor_model_parallel_size;
  const int64_t divisor = args.make_vocab_size_divisible_by;
  std::string why_not;
  const std::optional<int64_t> true_vocab = true_vocab_size(o, args, &why_not);
  if (true_vocab) {
    MG_REQUIRE(*true_vocab >= 1 && *true_vocab <= args.model.padded_vocab_size,
               "--true-vocab-size ", *true_vocab, " must be in [1, ", args.model.padded_vocab_size,
               "] (the checkpoint's padded vocabulary)");
    MG_REQUIRE(o.true_vocab_size ||
                   data::padded_vocab_size(*true_vocab, divisor, src_tp) == args.model.padded_vocab_size,
               "the checkpoint's tokenizer has ", *true_vocab, " tokens, which pad to ",
               data::padded_vocab_size(*true_vocab, divisor, src_tp), " rows under its TP=", src_tp,
               ", but the checkpoint has ", args.model.padded_vocab_size,
               " (another tokenizer?); pass --true-vocab-size N");
    target_vocab = data::padded_vocab_size(*true_vocab, divisor, T);
  } else if (T != src_tp) {
    // The true size is in (padded - divisor * src_tp, padded]; fine when all of them pad alike.
    const int64_t hi = args.model.padded_vocab_size, lo = std::max<int64_t>(1, hi - divisor * src_tp + 1);
    target_vocab = data::padded_vocab_size(hi, divisor, T);
    MG_REQUIRE(data::padded_vocab_size(lo, divisor, T) == target_vocab,
               "cannot tell the unpadded vocabulary size, which the padded size for "
               "--target-tensor-parallel-size ", T, " depends on: the checkpoint's tokenizer cannot "
               "be built (", why_not, "); pass --true-vocab-size N");
  }
  {
    model::TransformerConfig c = args.model;
    c.padded_vocab_size = target_vocab;
    c.validate_tensor_parallel(T);  // heads, query groups, FFN, vocabulary divisible by T
  }

  MergedCheckpoint m = merge_checkpoint(ckpt, !o.drop_optimizer);
  MG_REQUIRE(m.padded_vocab_size == args.model.padded_vocab_size, ckpt.dir.string(),
             ": the word embedding has ", m.padded_vocab_size, " rows but args.model.padded_vocab_size is ",
             args.model.padded_vocab_size);
  ConvertResult res;
  res.iteration = ckpt.state.iteration;
  res.from = ckpt.parallel;
  res.padded_vocab_from = m.padded_vocab_size;
  if (target_vocab != m.padded_vocab_size) repad_vocabulary(m, target_vocab);
  res.padded_vocab_to = target_vocab;
  return write_target(m, o, layout, L, target_vocab, std::move(res));
}


}  // namespace megatron::training
