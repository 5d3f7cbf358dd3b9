// Checkpoint save/load; see checkpoint.h for the layout.
#include "training/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <tuple>
#include <memory>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "model/weight_spec.h"
#include "training/checkpoint_files.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_checkpoint.h"
#include "training/torch_dist_stream.h"

// JSON codecs of the argument structs, in their own namespaces so that nlohmann finds them.
namespace megatron {
NLOHMANN_JSON_SERIALIZE_ENUM(DType, {{DType::F32, "float32"}, {DType::F64, "float64"},
                                     {DType::F16, "float16"}, {DType::BF16, "bfloat16"},
                                     {DType::I8, "int8"}, {DType::U8, "uint8"},
                                     {DType::I16, "int16"}, {DType::U16, "uint16"},
                                     {DType::I32, "int32"}, {DType::I64, "int64"}})
}  // namespace megatron
namespace megatron::data {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TokenizerOptions, type, vocab_file, merge_file,
                                                tokenizer_model, vocab_size, vocab_extra_ids,
                                                tiktoken_pattern, tiktoken_num_special_tokens,
                                                special_tokens)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    GPTDataConfig, data_path, split, train_data_path, valid_data_path, test_data_path, seq_length,
    seed, data_cache_path, mmap, tokenizer, pad_id, mid_level_dataset_surplus, use_cache, eod_id,
    reset_position_ids, reset_attention_mask, eod_mask_loss)
}  // namespace megatron::data
namespace megatron::optim {
NLOHMANN_JSON_SERIALIZE_ENUM(OptimizerType, {{OptimizerType::Adam, "adam"},
                                             {OptimizerType::SGD, "sgd"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OptimizerConfig, type, adam_beta1, adam_beta2,
                                                adam_eps, sgd_momentum, clip_grad)
}  // namespace megatron::optim
namespace megatron::training {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ParallelArgs, tensor_model_parallel_size,
                                                pipeline_model_parallel_size,
                                                num_layers_per_virtual_pipeline_stage,
                                                context_parallel_size, use_distributed_optimizer, overlap_grad_reduce,
                                                overlap_param_gather, ddp_bucket_size,
                                                distributed_timeout_minutes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TensorBoardOptions, dir, log_interval, queue_size,
                                                log_timers, log_learning_rate, log_loss_scale,
                                                log_batch_size, log_world_size, log_validation_ppl)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    TrainingArgs, model, parallel, make_vocab_size_divisible_by, tokenizer, data, micro_batch_size,
    global_batch_size, train_iters, train_samples, lr, min_lr, lr_warmup_init, lr_warmup_fraction,
    lr_decay_style, lr_decay_iters, lr_decay_samples, lr_warmup_iters, lr_warmup_samples,
    lr_wsd_decay_style, lr_wsd_decay_iters, lr_wsd_decay_samples, weight_decay,
    start_weight_decay, end_weight_decay, weight_decay_incr_style, optimizer, optimizer_name, seed,
    fp16, bf16, loss_scale, initial_loss_scale, min_loss_scale, loss_scale_window, hysteresis,
    log_interval, log_throughput, eval_interval, eval_iters, exit_interval, exit_duration_in_mins,
    exit_signal_handler, metrics_jsonl, tensorboard, save, save_interval, no_save_optim,
    no_save_rng, load, ckpt_step, finetune, no_load_optim, no_load_rng,
    override_opt_param_scheduler, use_checkpoint_opt_param_scheduler, exit_on_missing_checkpoint)
}  // namespace megatron::training

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using detail::fsync_path;
using detail::set_mode;
using detail::write_text_file;

std::string model_file(const CheckpointRank& rank) { return rank.rank_dir() + "/model.safetensors"; }

// The iterations of the iter_N folders in `dir`, ascending.
std::vector<int64_t> iteration_folders(const fs::path& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("iter_") || name.size() < 6 || name.size() > 23 || !e.is_directory(ec)) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    out.push_back(std::stoll(name.substr(5)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void warn_leftovers(const fs::path& dir) {
  const auto names = detail::leftover_folders(dir);
  if (names.empty()) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  log_warn(dir.string(), " holds ", list, ": incomplete checkpoint folders left by interrupted saves; "
           "they are not loaded, and the next save into this folder removes them");
}

std::string read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MG_REQUIRE(in, "cannot read ", p.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}


nlohmann::ordered_json scheduler_to_json(const optim::LRSchedulerConfig& c, int64_t num_steps) {
  nlohmann::ordered_json j;
  j["max_lr"] = c.max_lr;
  j["min_lr"] = c.min_lr;
  j["lr_warmup_init"] = c.lr_warmup_init;
  j["lr_warmup_steps"] = c.lr_warmup_steps;
  j["lr_decay_steps"] = c.lr_decay_steps;
  j["lr_decay_style"] = optim::lr_decay_style_name(c.decay_style);
  j["wsd_decay_steps"] = c.wsd_decay_steps;
  j["lr_wsd_decay_style"] = optim::wsd_decay_style_name(c.wsd_decay_style);
  j["start_wd"] = c.start_wd;
  j["end_wd"] = c.end_wd;
  j["wd_incr_steps"] = c.wd_incr_steps;
  j["wd_incr_style"] = optim::wd_incr_style_name(c.wd_incr_style);
  if (c.has_decoupled_lr()) {  // --decoupled-lr: the embedding/output group's own bounds
    j["decoupled_lr"] = c.decoupled_max_lr;
    j["decoupled_min_lr"] = c.decoupled_min_lr;
  }
  j["num_steps"] = num_steps;
  return j;
}

// Typed access to metadata.json with errors naming the file and the key.
struct MetaReader {
  const json& root;
  std::string label;
  const json& at(const json& obj, const char* key, const char* where) const {
    MG_REQUIRE(obj.is_object() && obj.contains(key), label, ": missing \"", key, "\"", where,
               " (incomplete or foreign checkpoint metadata)");
    return obj[key];
  }
  int64_t i64(const json& obj, const char* key, const char* where = "") const {
    const json& v = at(obj, key, where);
    MG_REQUIRE(v.is_number_integer(), label, ": \"", key, "\"", where, " must be an integer, got ",
               v.dump());
    return v.get<int64_t>();
  }
  uint64_t u64(const json& obj, const char* key, const char* where = "") const {
    const json& v = at(obj, key, where);
    MG_REQUIRE(v.is_number_unsigned(), label, ": \"", key, "\"", where,
               " must be a non-negative integer, got ", v.dump());
    return v.get<uint64_t>();
  }
  double f64(const json& obj, const char* key, const char* where = "") const {
    const json& v = at(obj, key, where);
    MG_REQUIRE(v.is_number(), label, ": \"", key, "\"", where, " must be a number, got ", v.dump());
    return v.get<double>();
  }
  std::string string(const json& obj, const char* key, const char* where = "") const {
    const json& v = at(obj, key, where);
    MG_REQUIRE(v.is_string(), label, ": \"", key, "\"", where, " must be a string, got ", v.dump());
    return v.get<std::string>();
  }
};

CheckpointState state_from_json(const json& j, const std::string& label) {
  MetaReader r{j, label};
  CheckpointState s;
  s.iteration = r.i64(j, "iteration");
  s.consumed_train_samples = r.i64(j, "consumed_train_samples");
  s.consumed_valid_samples = r.i64(j, "consumed_valid_samples");
  const json& gs = r.at(j, "grad_scaler", "");
  MG_REQUIRE(r.at(gs, "dynamic", " in grad_scaler").is_boolean(), label,
             ": grad_scaler.dynamic must be true or false");
  s.grad_scaler_dynamic = gs["dynamic"].get<bool>();
  s.grad_scaler.scale = r.f64(gs, "scale", " in grad_scaler");
  s.grad_scaler.growth_tracker = r.i64(gs, "growth_tracker", " in grad_scaler");
  s.grad_scaler.hysteresis_tracker = r.i64(gs, "hysteresis_tracker", " in grad_scaler");
  const json& sc = r.at(j, "opt_param_scheduler", "");
  const char* in_sc = " in opt_param_scheduler";
  s.scheduler.max_lr = r.f64(sc, "max_lr", in_sc);
  s.scheduler.min_lr = r.f64(sc, "min_lr", in_sc);
  s.scheduler.lr_warmup_init = r.f64(sc, "lr_warmup_init", in_sc);
  s.scheduler.lr_warmup_steps = r.i64(sc, "lr_warmup_steps", in_sc);
  s.scheduler.lr_decay_steps = r.i64(sc, "lr_decay_steps", in_sc);
  s.scheduler.wsd_decay_steps = r.i64(sc, "wsd_decay_steps", in_sc);
  s.scheduler.start_wd = r.f64(sc, "start_wd", in_sc);
  s.scheduler.end_wd = r.f64(sc, "end_wd", in_sc);
  s.scheduler.wd_incr_steps = r.i64(sc, "wd_incr_steps", in_sc);
  if (sc.contains("decoupled_lr")) {  // absent: saved without --decoupled-lr
    s.scheduler.decoupled_max_lr = r.f64(sc, "decoupled_lr", in_sc);
    s.scheduler.decoupled_min_lr = r.f64(sc, "decoupled_min_lr", in_sc);
  }
  try {
    s.scheduler.decay_style = optim::parse_lr_decay_style(r.string(sc, "lr_decay_style", in_sc));
    s.scheduler.wsd_decay_style = optim::parse_wsd_decay_style(r.string(sc, "lr_wsd_decay_style", in_sc));
    s.scheduler.wd_incr_style = optim::parse_wd_incr_style(r.string(sc, "wd_incr_style", in_sc));
  } catch (const Error& e) {
    MG_THROW(label, ": opt_param_scheduler: ", e.what());
  }
  s.scheduler_num_steps = r.i64(sc, "num_steps", in_sc);
  const json& rng = r.at(j, "rng_state", "");
  if (!rng.is_null()) {
    MG_REQUIRE(r.string(rng, "generator", " in rng_state") == "philox4x32-10", label,
               ": rng_state.generator must be \"philox4x32-10\"");
    s.rng = RngState{r.u64(rng, "seed", " in rng_state"), r.u64(rng, "dropout_offset", " in rng_state")};
  }
  const json& opt = r.at(j, "optimizer", "");
  if (!opt.is_null()) s.optimizer_type = r.string(opt, "type", " in optimizer");
  s.args = r.at(j, "args", "");
  MG_REQUIRE(s.args.is_object(), label, ": \"args\" must be an object");
  MG_REQUIRE(s.iteration >= 0 && s.consumed_train_samples >= 0 && s.consumed_valid_samples >= 0 &&
                 s.scheduler_num_steps >= 0,
             label, ": negative iteration, sample or step count");
  return s;
}

}  // namespace

nlohmann::ordered_json checkpoint_metadata_to_json(const CheckpointMetadata& m) {
  const CheckpointState& state = m.state;
  nlohmann::ordered_json meta;
  meta["format_version"] = kCheckpointFormatVersion;
  meta["iteration"] = state.iteration;
  meta["consumed_train_samples"] = state.consumed_train_samples;
  meta["consumed_valid_samples"] = state.consumed_valid_samples;
  meta["grad_scaler"] = {{"dynamic", state.grad_scaler_dynamic},
                         {"scale", state.grad_scaler.scale},
                         {"growth_tracker", state.grad_scaler.growth_tracker},
                         {"hysteresis_tracker", state.grad_scaler.hysteresis_tracker}};
  meta["opt_param_scheduler"] = scheduler_to_json(state.scheduler, state.scheduler_num_steps);
  if (state.rng)
    meta["rng_state"] = {{"generator", "philox4x32-10"},
                         {"seed", state.rng->seed},
                         {"dropout_offset", state.rng->dropout_offset}};
  else
    meta["rng_state"] = nullptr;
  meta["optimizer"] = m.optimizer;
  if (m.parallel) {
    const CheckpointParallel& p = *m.parallel;
    meta["parallel"] = {{"tensor_model_parallel_size", p.tensor_model_parallel_size},
                        {"pipeline_model_parallel_size", p.pipeline_model_parallel_size},
                        {"virtual_pipeline_model_parallel_size", p.virtual_pipeline_model_parallel_size},
                        {"data_parallel_size", p.data_parallel_size}};
    if (p.expert_model_parallel_size > 1)
      meta["parallel"]["expert_model_parallel_size"] = p.expert_model_parallel_size;
    if (p.expert_tensor_parallel_size > 0 && p.expert_tensor_parallel_size != p.tensor_model_parallel_size)
      meta["parallel"]["expert_tensor_parallel_size"] = p.expert_tensor_parallel_size;
  }
  if (!m.weights.is_null()) meta["weights"] = m.weights;
  meta["args"] = state.args;
  if (!m.files.is_null()) meta["files"] = m.files;
  if (!m.converted_from.is_null()) meta["converted_from"] = m.converted_from;
  return meta;
}

CheckpointMetadata checkpoint_metadata_from_json(const json& j, const std::string& label) {
  MG_REQUIRE(j.is_object() && j.contains("format_version") && j["format_version"].is_number_integer(),
             label, ": no format_version (not a megatron.cpp training checkpoint?)");
  const int64_t version = j["format_version"].get<int64_t>();
  // Version 2 recorded no weight specs: checkpoint_weight_specs (checkpoint_convert.cpp) infers
  // them once from the names and the recorded partition dims.
  MG_REQUIRE(version == kCheckpointFormatVersion || version == 2, label, ": format_version ",
             version, " is not supported (this build reads versions 2 and ",
             kCheckpointFormatVersion, ")");
  CheckpointMetadata m;
  m.state = state_from_json(j, label);
  m.optimizer = j.at("optimizer");
  if (j.contains("parallel") && !j["parallel"].is_null()) {  // absent in old single-rank ones
    MetaReader r{j, label};
    const json& p = j["parallel"];
    CheckpointParallel c;
    c.tensor_model_parallel_size = int(r.i64(p, "tensor_model_parallel_size", " in parallel"));
    c.pipeline_model_parallel_size = int(r.i64(p, "pipeline_model_parallel_size", " in parallel"));
    c.data_parallel_size = int(r.i64(p, "data_parallel_size", " in parallel"));
    if (p.contains("virtual_pipeline_model_parallel_size"))  // absent before pipeline training
      c.virtual_pipeline_model_parallel_size =
          int(r.i64(p, "virtual_pipeline_model_parallel_size", " in parallel"));
    if (p.contains("expert_model_parallel_size"))  // absent without expert parallelism
      c.expert_model_parallel_size = int(r.i64(p, "expert_model_parallel_size", " in parallel"));
    if (p.contains("expert_tensor_parallel_size")) {  // absent when it is TP
      c.expert_tensor_parallel_size = int(r.i64(p, "expert_tensor_parallel_size", " in parallel"));
      MG_REQUIRE(c.expert_tensor_parallel_size >= 1 &&
                     c.tensor_model_parallel_size % c.expert_tensor_parallel_size == 0,
                 label, ": expert_tensor_parallel_size ", c.expert_tensor_parallel_size,
                 " does not divide tensor_model_parallel_size ", c.tensor_model_parallel_size);
    }
    MG_REQUIRE(c.tensor_model_parallel_size >= 1 && c.pipeline_model_parallel_size >= 1 &&
                   c.data_parallel_size >= 1 && c.virtual_pipeline_model_parallel_size >= 1 &&
                   c.expert_model_parallel_size >= 1,
               label, ": parallel sizes must be >= 1");
    m.parallel = c;
  }
  if (m.optimizer.is_object() && m.optimizer.contains("distributed")) {
    MG_REQUIRE(m.optimizer.at("distributed").is_boolean(), label,
               ": optimizer.distributed must be true or false");
    if (!m.parallel) m.parallel = CheckpointParallel{};
    m.parallel->distributed_optimizer = m.optimizer.at("distributed").get<bool>();
  }
  if (j.contains("weights")) m.weights = j["weights"];
  if (j.contains("files")) m.files = j["files"];
  if (j.contains("converted_from")) m.converted_from = j["converted_from"];
  return m;
}

std::string iteration_dir_name(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", (long long)iteration);
  return name;
}

namespace detail {

void write_text_file(const fs::path& p, const std::string& text) {
  write_file_atomically(p, text, {.durable = true, .mode = 0640, .per_process_tmp = false});
}

void publish_iteration(const fs::path& save_dir, const fs::path& tmp, const std::string& name,
                       const std::string& tracker) {
  const fs::path final_dir = save_dir / name;
  const fs::path old_dir = save_dir / (".old_" + name);
  fs::remove_all(old_dir);
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir);
  fs::rename(tmp, final_dir);
  fsync_path(save_dir, true);
  fs::remove_all(old_dir);
  write_text_file(save_dir / kTrackerFile, tracker);
  fsync_path(save_dir, true);
}


void write_tensor_file(const fs::path& dir, const std::string& rel,
                       const std::vector<std::pair<std::string, Tensor>>& tensors, json& files,
                       std::map<std::string, std::string> metadata) {
  const fs::path p = dir / rel;
  metadata.emplace("format", "pt");
  write_safetensors(p, tensors, metadata);
  set_mode(p, 0640);
  files[rel] = {{"bytes", fs::file_size(p)}, {"sha256", sha256_file(p)}};
}

}  // namespace detail

CheckpointRank CheckpointRank::from(const ParallelState& ps) {
  CheckpointRank r;
  r.world = &ps.world();
  r.tp_size = ps.tp_size();
  r.tp_rank = ps.tp_rank();
  r.pp_size = ps.pp_size();
  r.pp_rank = ps.pp_rank();
  // Context-parallel ranks hold identical weights and the distributed optimizer shards over
  // DP x CP, so for checkpoints the data-parallel dimension is DP x CP (Megatron's
  // data_parallel_group_with_cp): only its rank 0 writes the model of a model-parallel rank.
  r.dp_size = ps.dp_size() * ps.cp_size();
  r.dp_rank = ps.layout().rank_in(GroupKind::DP_CP, ps.world_rank());
  r.ep_size = ps.ep_size();
  r.ep_rank = ps.ep_size() > 1 ? ps.ep_rank() : 0;
  r.edp_rank = ps.ep_size() > 1 ? ps.layout().rank_in(GroupKind::EXPERT_DP, ps.world_rank()) : r.dp_rank;
  const int etp = ps.layout().config.expert_tensor_parallel_size;
  if (etp > 0 && etp != ps.tp_size()) {
    // The experts' own mesh: the replicas of this rank's folder are the ranks of its TP, PP and
    // EP rank (its dense data-parallel replicas at EP 1), counted in world order.
    r.etp_size = etp;
    const ParallelLayout& l = ps.layout();
    auto key = [&](int w) {
      return std::tuple(l.rank_in(GroupKind::TP, w), l.rank_in(GroupKind::PP, w),
                        ps.ep_size() > 1 ? l.rank_in(GroupKind::EP, w) : 0);
    };
    r.edp_rank = 0;
    for (int w = 0; w < ps.world_rank(); ++w) r.edp_rank += key(w) == key(ps.world_rank());
  }
  return r;
}

std::string checkpoint_rank_dir(int tp_rank, int pp_size, int pp_rank, int ep_size, int ep_rank) {
  char name[48];
  if (pp_size > 1)
    std::snprintf(name, sizeof name, "mp_rank_%02d_%03d", tp_rank, pp_rank);
  else
    std::snprintf(name, sizeof name, "mp_rank_%02d", tp_rank);
  std::string out = name;
  if (ep_size > 1) {
    std::snprintf(name, sizeof name, "_%03d", ep_rank);
    out += name;
  }
  return out;
}

std::string CheckpointRank::rank_dir() const {
  return checkpoint_rank_dir(tp_rank, pp_size, pp_rank, ep_size, ep_rank);
}

std::string CheckpointParallel::describe() const {
  return str("TP=", tensor_model_parallel_size, " x PP=", pipeline_model_parallel_size,
             expert_model_parallel_size > 1 ? str(" x EP=", expert_model_parallel_size) : "",
             etp() != tensor_model_parallel_size ? str(" (experts: ETP=", etp(), ")") : "",
             " x DP=", data_parallel_size, distributed_optimizer ? " (distributed optimizer)" : "");
}

json training_args_to_json(const TrainingArgs& args) { return json(args); }

TrainingArgs training_args_from_json(const json& j) { return j.get<TrainingArgs>(); }

namespace {

// Writes the iteration into tmp_dir and publishes it (below).
void save_iteration(const fs::path& save_dir, const fs::path& tmp_dir, const CheckpointState& state,
                    const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                    const CheckpointRank& rank);

}  // namespace

fs::path save_checkpoint(const fs::path& save_dir, const CheckpointState& state,
                         const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                         const CheckpointRank& rank) {
  const bool multi = rank.multi();
  const bool root = !multi || rank.world->rank() == 0;
  const std::string name = iteration_dir_name(state.iteration);
  const fs::path final_dir = save_dir / name;
  const fs::path tmp_dir = save_dir / (".tmp_" + name);
  if (root) {
    detail::create_private_dirs(save_dir);
    detail::clean_leftovers(save_dir);  // of saves interrupted by kill -9
  }
  try {
    save_iteration(save_dir, tmp_dir, state, params, optimizer, rank);
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    // A write that failed (a full disk): nothing of this save may stay behind to fill the disk.
    const uint64_t needed = detail::rank_save_bytes(params, optimizer, rank);
    MG_THROW(e.what(), "; ", detail::remove_partial_save(save_dir, tmp_dir, needed));
  }
  return final_dir;
}

namespace {

void save_iteration(const fs::path& save_dir, const fs::path& tmp_dir, const CheckpointState& state,
                    const model::ParameterList& params, optim::MegatronOptimizer* optimizer,
                    const CheckpointRank& rank) {
  const bool multi = rank.multi();
  const bool root = !multi || rank.world->rank() == 0;
  const std::string name = iteration_dir_name(state.iteration);
  if (root) {
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    set_mode(tmp_dir, 0750);
  }
  if (multi) rank.world->barrier();  // the temporary folder exists for everyone

  // This rank's files: the model (data-parallel rank 0 of each model-parallel rank; under expert
  // parallelism expert data-parallel rank 0 of each TP x PP x EP rank) and its optimizer state
  // (checkpoint_optimizer.cpp decides which rank writes what).
  const std::string rank_dir = rank.rank_dir();
  json files = json::object();
  json optimizer_meta = nullptr;
  const bool writes_model = rank.edp_rank == 0;
  const bool writes_optim = optimizer != nullptr && (writes_model || optimizer->shard().has_value());
  if (writes_model || writes_optim) {
    fs::create_directories(tmp_dir / rank_dir);
    set_mode(tmp_dir / rank_dir, 0750);
  }
  if (writes_model) {
    std::vector<std::pair<std::string, Tensor>> model_tensors;
    for (const model::Parameter* p : params)
      if (!p->shared) model_tensors.emplace_back(p->name, p->value);  // the owner's copy is saved
    detail::write_tensor_file(tmp_dir, model_file(rank), model_tensors, files);
  }
  if (optimizer != nullptr)
    optimizer_meta = detail::save_optimizer_files(tmp_dir, *optimizer, rank, files);
  if (writes_model || writes_optim) fsync_path(tmp_dir / rank_dir, true);
  json weights = json::object();  // every saved parameter's spec (model/parameter.h)
  for (const model::Parameter* p : params)
    if (!p->shared) weights[p->name] = model::weight_spec_to_json(*p);
  if (multi) {  // rank 0 lists every rank's files (and every pipeline stage's parameters)
    const json mine = {{"files", files}, {"weights", weights}};
    const std::vector<std::string> all = all_gather_strings(*rank.world, mine.dump());
    for (const std::string& f : all) {
      const json j = json::parse(f);
      files.update(j["files"]);
      weights.update(j["weights"]);
    }
  }

  if (root) {
    CheckpointMetadata m;
    m.state = state;
    m.optimizer = optimizer_meta;
    m.parallel = CheckpointParallel{rank.tp_size, rank.pp_size, rank.dp_size, rank.vp_size, false,
                                    rank.ep_size, rank.etp_size};
    m.weights = weights;
    m.files = files;
    const nlohmann::ordered_json meta = checkpoint_metadata_to_json(m);
    detail::write_metadata(tmp_dir, meta.dump(2) + "\n");
    fsync_path(tmp_dir, true);

    detail::publish_iteration(save_dir, tmp_dir, name, std::to_string(state.iteration));
  }
  if (multi) rank.world->barrier();  // complete (renamed, tracker written) for everyone
}

}  // namespace

std::optional<CheckpointLocation> locate_checkpoint(const fs::path& load_dir,
                                                    std::optional<int64_t> ckpt_step) {
  const fs::path tracker = load_dir / kTrackerFile;
  CheckpointLocation c;
  std::string sub;
  if (ckpt_step) {
    c.iteration = *ckpt_step;
    MG_REQUIRE(*ckpt_step >= 0, "--ckpt-step must be >= 0 (got ", *ckpt_step, ")");
    sub = iteration_dir_name(*ckpt_step);
    MG_REQUIRE(fs::is_directory(load_dir / sub) || !fs::is_directory(load_dir / (".old_" + sub)),
               "--ckpt-step ", *ckpt_step, ": ", (load_dir / sub).string(), " does not exist; ",
               (load_dir / (".old_" + sub)).string(), " holds it (a re-save of that iteration was "
               "interrupted): rename it back to ", sub);
    MG_REQUIRE(fs::is_directory(load_dir / sub), "--ckpt-step ", *ckpt_step, ": checkpoint folder ",
               (load_dir / sub).string(), " does not exist");
  } else {
    if (!fs::exists(load_dir)) return std::nullopt;
    if (!fs::exists(tracker)) {
      // Iteration folders without a tracker: a save that never wrote it, or a deleted tracker.
      // Starting from random weights here would silently throw the checkpoints away.
      const std::vector<int64_t> found = iteration_folders(load_dir);
      if (!found.empty())
        MG_THROW("--load ", load_dir.string(), " has ", found.size(), " checkpoint folder",
                 found.size() > 1 ? "s" : "", " (", iteration_dir_name(found.front()),
                 found.size() > 1 ? str(" ... ", iteration_dir_name(found.back())) : std::string(),
                 ") but no ", kTrackerFile, ": pass --ckpt-step ", found.back(),
                 " to load the newest, or write its iteration into ", tracker.string());
      warn_leftovers(load_dir);
      return std::nullopt;
    }
    MG_REQUIRE(fs::is_regular_file(tracker), tracker.string(),
               " is not a file (a folder of that name?): it must hold the iteration to load; "
               "remove it, or pass --ckpt-step N to pick an iteration folder");
    std::string text = read_text_file(tracker);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
    if (text == "release") {
      c.release = true;
      sub = "release";
    } else {
      bool ok = !text.empty() && text.size() <= 18;
      for (char ch : text) ok = ok && std::isdigit(static_cast<unsigned char>(ch));
      MG_REQUIRE(ok, tracker.string(), ": expected an iteration number or 'release', got '",
                 text.substr(0, 64), text.size() > 64 ? "...'" : "'",
                 " (corrupted tracker file; pass --ckpt-step N to pick an iteration folder)");
      c.iteration = std::stoll(text);
      sub = iteration_dir_name(c.iteration);
    }
    MG_REQUIRE(fs::is_directory(load_dir / sub) || !fs::is_directory(load_dir / (".old_" + sub)),
               tracker.string(), " names ", sub, " but ", (load_dir / sub).string(),
               " does not exist; ", (load_dir / (".old_" + sub)).string(),
               " holds it (a re-save of that iteration was interrupted): rename it back to ", sub);
    MG_REQUIRE(fs::is_directory(load_dir / sub), tracker.string(), " names ", sub, " but ",
               (load_dir / sub).string(),
               " does not exist (deleted or never completed; pass --ckpt-step N to pick another)");
  }
  warn_leftovers(load_dir);
  c.dir = load_dir / sub;
  return c;
}

std::optional<CheckpointOnDisk> find_checkpoint(const fs::path& load_dir,
                                                std::optional<int64_t> ckpt_step) {
  const std::optional<CheckpointLocation> where = locate_checkpoint(load_dir, ckpt_step);
  if (!where) return std::nullopt;
  if (is_torch_dist_checkpoint(where->dir))  // Megatron-LM's default format (torch_dist)
    return open_torch_dist_checkpoint(where->dir, where->release,
                                      where->release ? std::nullopt : std::optional<int64_t>(where->iteration));
  if (is_torch_checkpoint(where->dir))  // Megatron-LM's model_optim_rng.pt files
    return open_torch_checkpoint(where->dir, where->release,
                                 where->release ? std::nullopt : std::optional<int64_t>(where->iteration));
  CheckpointOnDisk c;
  c.dir = where->dir;
  c.release = where->release;
  const fs::path meta_path = c.dir / "metadata.json";
  const std::string label = meta_path.string();
  const json j = read_checkpoint_metadata(c.dir);  // checked against metadata.json.sha256
  const CheckpointMetadata m = checkpoint_metadata_from_json(j, label);
  c.state = m.state;
  MG_REQUIRE(m.files.is_object(), label, ": missing \"files\" checksums");
  c.files = m.files;
  bool has_model = false;
  for (const auto& [rel, entry] : c.files.items())
    has_model = has_model || rel.ends_with("/model.safetensors");
  MG_REQUIRE(has_model, label, ": lists no model.safetensors");
  if (m.parallel) c.parallel = *m.parallel;
  MG_REQUIRE(c.release || c.state.iteration == where->iteration, label, " says iteration ",
             c.state.iteration, " but the folder is ", where->dir.filename().string());
  return c;
}

void check_checkpoint_layout(const CheckpointOnDisk& ckpt, const CheckpointRank& rank) {
  if (ckpt.format == "torch_dist") return;  // global tensors: any layout takes its shards
  const CheckpointParallel& c = ckpt.parallel;
  const int ctp = c.tensor_model_parallel_size, cpp = c.pipeline_model_parallel_size;
  const int cvp = c.virtual_pipeline_model_parallel_size;
  const int run_etp = rank.etp_size > 0 ? rank.etp_size : rank.tp_size;
  MG_REQUIRE(ctp != rank.tp_size || c.etp() == run_etp, "the checkpoint ", ckpt.dir.string(),
             " holds experts sharded over ", c.etp(), " expert-tensor-parallel ranks (",
             c.describe(), "); this run has --expert-tensor-parallel-size ", run_etp,
             ": run with --expert-tensor-parallel-size ", c.etp(), ", or convert it (`megatron "
             "checkpoint convert` writes the experts sharded as the dense layers)");
  if (ctp == rank.tp_size && cpp == rank.pp_size && cvp == rank.vp_size) return;
  auto virtual_stages = [](int vp) {
    return vp > 1 ? str(", ", vp, " virtual stages per pipeline rank") : std::string();
  };
  const std::string saved =
      str("TP=", ctp, " PP=", cpp, " (DP=", c.data_parallel_size,
          c.distributed_optimizer ? ", distributed optimizer" : "", virtual_stages(cvp), ")");
  const std::string mine =
      str("TP=", rank.tp_size, " PP=", rank.pp_size,
          rank.vp_size > 1 ? str(" (", rank.vp_size, " virtual stages per pipeline rank)") : "");
  const std::string where = str("the checkpoint ", ckpt.dir.string(), " was saved with ", saved,
                                "; this run has ", mine, ". ");
  if (ctp == rank.tp_size && cpp == rank.pp_size) {  // only the model chunks differ
    int64_t per_chunk = 0;
    const nlohmann::json& args = ckpt.state.args;
    if (args.contains("parallel") && args["parallel"].contains("num_layers_per_virtual_pipeline_stage"))
      per_chunk = args["parallel"]["num_layers_per_virtual_pipeline_stage"].get<int64_t>();
    MG_THROW(where, "Each pipeline rank's file holds the layers of its model chunks, so the virtual "
             "stages must match: run ",
             per_chunk > 0 ? str("with --num-layers-per-virtual-pipeline-stage ", per_chunk)
                           : std::string("without --num-layers-per-virtual-pipeline-stage"));
  }
  const fs::path load_dir = ckpt.dir.parent_path();
  const std::string target = str(load_dir.filename().string(), "_tp", rank.tp_size, "_pp", rank.pp_size);
  MG_THROW(where, "The tensor- and pipeline-parallel sizes must match the checkpoint's (the "
           "data-parallel size may differ): run with --tensor-model-parallel-size ", ctp,
           " --pipeline-model-parallel-size ", cpp, " (world size a multiple of ", ctp * cpp,
           "), or reshard it with `megatron checkpoint convert --load ", load_dir.string(), " --save ",
           (load_dir.parent_path() / target).string(), " --target-tensor-parallel-size ", rank.tp_size,
           " --target-pipeline-parallel-size ", rank.pp_size, "`");
}

void load_model_weights(const CheckpointOnDisk& ckpt, const model::ParameterList& params,
                        bool allow_dtype_conversion, const CheckpointRank& rank) {
  check_checkpoint_layout(ckpt, rank);
  const bool torch = ckpt.format == "torch", torch_dist = ckpt.format == "torch_dist";
  const std::string rel = torch_dist ? std::string(".metadata")
                          : torch    ? rank.rank_dir() + "/" + kTorchCheckpointFile
                                     : model_file(rank);
  SafetensorsContents st;
  std::string label = (ckpt.dir / rel).string();
  bool resharded = false;  // another expert-parallel size: the files hold others' experts too
  std::set<std::string> used;
  auto take = [&](model::Parameter* p, const Tensor& t) {
    MG_REQUIRE(t.shape() == p->value.shape(), label, ": tensor '", p->name, "' has shape ",
               shape_str(t.shape()), " but the model expects ", shape_str(p->value.shape()));
    MG_REQUIRE(t.dtype() == p->value.dtype() || allow_dtype_conversion, label, ": tensor '", p->name,
               "' is ", dtype_name(t.dtype()), " but this run's parameters are ",
               dtype_name(p->value.dtype()), " (--fp16/--bf16 must match the checkpoint)");
    MG_REQUIRE(dtype_is_floating(t.dtype()), label, ": tensor '", p->name, "' is ",
               dtype_name(t.dtype()), ", not a floating-point type");
    p->value.copy_(t);
    used.insert(p->name);
  };
  if (torch_dist) {  // streamed: each shard copied into its parameter as it is read
    std::map<std::string, Shape> wanted;
    std::map<std::string, model::Parameter*> dest;
    for (model::Parameter* p : params)
      if (!p->shared) {
        wanted.emplace(p->name, p->value.shape());
        dest.emplace(p->name, p);
      }
    stream_torch_dist_shards(ckpt, wanted, rank, "", false,
                             [&](const std::string& name, const Tensor& t) { take(dest.at(name), t); });
  }
  if (torch) st = read_torch_rank_for(ckpt, rank, false, &resharded).model;
  if (!torch && !torch_dist) {
    detail::RankTensors rt = detail::read_rank_tensors(ckpt, rank, "model.safetensors");
    st = std::move(rt.contents);
    label = rt.label;
    resharded = rt.resharded;
  }
  for (model::Parameter* p : params) {
    if (p->shared || used.count(p->name)) continue;  // shared: not saved, the caller copies it from its owner
    auto it = st.tensors.find(p->name);
    MG_REQUIRE(it != st.tensors.end(), label, " has no tensor '", p->name,
               "' (the checkpoint was saved from a different model)");
    take(p, it->second);
  }
  for (const auto& [name, t] : st.tensors)
    MG_REQUIRE(used.count(name) || (resharded && detail::is_expert_tensor_name(name)), label,
               " has a tensor '", name,
               "' that the model does not have (the checkpoint was saved from a different model)");
}

optim::LRSchedulerConfig resolve_scheduler_config(const optim::LRSchedulerConfig& from_args,
                                                  const CheckpointOnDisk& ckpt, bool override_args,
                                                  bool use_checkpoint) {
  const optim::LRSchedulerConfig& saved = ckpt.state.scheduler;
  optim::LRSchedulerConfig out = from_args;
  auto pick = [&](const char* flag, auto& field, const auto& stored, auto show) {
    const auto given = field;  // `out` starts as the command line's schedule
    if (override_args) return;
    if (!use_checkpoint)
      MG_REQUIRE(given == stored, flag, ": the checkpoint's LR schedule has ", show(stored),
                 " but this run gives ", show(given),
                 "; pass --override-opt_param-scheduler to use this run's values or "
                 "--use-checkpoint-opt_param-scheduler to keep the checkpoint's");
    field = stored;
  };
  auto num = [](auto v) { return str(v); };
  auto lr_style = [](optim::LRDecayStyle v) { return std::string(optim::lr_decay_style_name(v)); };
  auto wsd_style = [](optim::WSDDecayStyle v) { return std::string(optim::wsd_decay_style_name(v)); };
  auto wd_style = [](optim::WDIncrStyle v) { return std::string(optim::wd_incr_style_name(v)); };
  if (from_args.max_lr < 0 && !override_args)
    out.max_lr = saved.max_lr;  // --lr not given: the checkpoint's
  else
    pick("--lr", out.max_lr, saved.max_lr, num);
  pick("--min-lr", out.min_lr, saved.min_lr, num);
  pick("--lr-warmup-init", out.lr_warmup_init, saved.lr_warmup_init, num);
  pick("--lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction (warmup in samples)",
       out.lr_warmup_steps, saved.lr_warmup_steps, num);
  pick("--lr-decay-iters/--lr-decay-samples/--train-iters (decay in samples)", out.lr_decay_steps,
       saved.lr_decay_steps, num);
  pick("--lr-decay-style", out.decay_style, saved.decay_style, lr_style);
  pick("--lr-wsd-decay-iters/--lr-wsd-decay-samples (in samples)", out.wsd_decay_steps,
       saved.wsd_decay_steps, num);
  pick("--lr-wsd-decay-style", out.wsd_decay_style, saved.wsd_decay_style, wsd_style);
  pick("--weight-decay/--start-weight-decay", out.start_wd, saved.start_wd, num);
  pick("--weight-decay/--end-weight-decay", out.end_wd, saved.end_wd, num);
  if (out.wd_incr_style == optim::WDIncrStyle::Constant &&
      saved.wd_incr_style == optim::WDIncrStyle::Constant)
    out.wd_incr_steps = saved.wd_incr_steps;  // no effect on a constant weight decay
  else
    pick("--train-iters/--train-samples (weight-decay increment steps)", out.wd_incr_steps,
         saved.wd_incr_steps, num);
  pick("--weight-decay-incr-style", out.wd_incr_style, saved.wd_incr_style, wd_style);
  auto dec = [](double v) { return v < 0 ? std::string("none") : str(v); };
  pick("--decoupled-lr", out.decoupled_max_lr, saved.decoupled_max_lr, dec);
  pick("--decoupled-min-lr", out.decoupled_min_lr, saved.decoupled_min_lr, dec);
  return out;
}

}  // namespace megatron::training
