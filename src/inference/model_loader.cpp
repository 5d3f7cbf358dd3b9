// Tokenizer + checkpoint weights -> the generation engine over the model's own layers.
#include "inference/model_loader.h"

#include "comm/parallel_state.h"
#include "core/error.h"
#include "core/log.h"
#include "inference/checkpoint_weights.h"
#include "inference/distributed_engine.h"
#include "model/gpt_model.h"
#include "training/checkpoint.h"

namespace megatron::inference {

std::map<std::string, Tensor> with_local_norm_names(std::map<std::string, Tensor> w) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : w) {
    std::string n = name;
    for (const auto& [fused, local] :
         {std::pair<std::string, std::string>{".self_attention.linear_qkv.layer_norm_", ".input_layernorm."},
          {".mlp.linear_fc1.layer_norm_", ".pre_mlp_layernorm."}}) {
      const size_t at = n.find(fused);
      if (at != std::string::npos) n = n.substr(0, at) + local + n.substr(at + fused.size());
    }
    MG_REQUIRE(!out.count(n), "the checkpoint has both ", name, " and ", n,
               " (the same norm under two names)");
    out.emplace(n, std::move(t));
  }
  return out;
}

void InferenceModel::follow() {
  MG_CHECK(follower && group, "InferenceModel::follow on a leader");
  follow_leader(*follower, *group);
}

void InferenceModel::finish() {
  if (auto* d = dynamic_cast<DistributedEngine*>(model.get())) d->finish();
}

namespace {

// The parallel state of T x P model-parallel ranks over `world` (the rest data parallel).
ParallelState model_parallel_state(const std::shared_ptr<Communicator>& world, int tp, int pp) {
  ParallelConfig pc;
  pc.world_size = world->size();
  pc.tensor_model_parallel_size = tp;
  pc.pipeline_model_parallel_size = pp;
  return ParallelState::create(world, pc);
}

// The checkpoint --load names, with this rank's place in it; an error unless the checkpoint has
// this layout (its mp_rank_TT[_PPP] folders). `purpose` ends the error of a missing checkpoint.
std::pair<training::CheckpointOnDisk, training::CheckpointRank> rank_checkpoint(
    const InferenceModelOptions& options, const ParallelState& ps, const char* purpose) {
  const auto ckpt = training::find_checkpoint(options.load, options.ckpt_step);
  MG_REQUIRE(ckpt.has_value(), "--load ", options.load, " holds no checkpoint ", purpose);
  const training::CheckpointRank crank = training::CheckpointRank::from(ps);
  training::check_checkpoint_layout(*ckpt, crank);
  return {*ckpt, crank};
}

// Every rank builds its own stage (its tensor-parallel shard of its pipeline stage's layers)
// and reads only its own files of the checkpoint.
InferenceModel load_model_parallel(const InferenceModelOptions& options,
                                   const std::shared_ptr<Communicator>& world) {
  const int tp = options.tensor_model_parallel_size, pp = options.pipeline_model_parallel_size;
  MG_REQUIRE(world->size() % (tp * pp) == 0, "--tensor-model-parallel-size ", tp,
             " x --pipeline-model-parallel-size ", pp, " does not divide the ", world->size(),
             " ranks launched: launch a multiple of ", tp * pp, " ranks");
  const ParallelState ps = model_parallel_state(world, tp, pp);
  InferenceModel out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  model::TransformerConfig cfg = inference_config(options.model);
  // Megatron pads the vocabulary to a multiple of the divisor times the tensor-parallel size.
  cfg.padded_vocab_size =
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, tp);
  const auto [ckpt, crank] = rank_checkpoint(options, ps, "to generate with");
  model::ModelOptions mo;
  mo.grad = false;
  mo.init_weights = false;
  const model::PipelineLayout layout = model::PipelineLayout::make(cfg.num_layers, pp, 0);
  auto stage = std::make_unique<model::GPTModel>(
      cfg, 0, model::TensorParallel::make(ps.group_ptr(GroupKind::TP), false),
      model::ContextParallel::none(), model::ChunkPlace{layout, ps.pp_rank(), 0}, mo);
  // The MoE layers' expert biases (aux-loss-free balancing) route as in training: they are read
  // with the weights.
  model::ParameterList params = stage->parameters();
  for (model::MoELayer* m : stage->moe_layers())
    if (model::Parameter* p = m->expert_bias_state()) params.push_back(p);
  training::load_model_weights(ckpt, params, /*allow_dtype_conversion=*/true, crank);
  for (model::MoELayer* m : stage->moe_layers()) m->load_expert_bias_state();
  // Tied embeddings: the last stage's output layer is the first stage's table (not saved).
  if (pp > 1 && (ps.pp_rank() == 0 || ps.pp_rank() == pp - 1))
    if (model::Parameter* p = stage->word_embedding())
      ps.group(GroupKind::EMBEDDING).broadcast(p->value, 0);
  const size_t bytes = stage->weight_bytes();
  auto engine = std::make_unique<GPTEngine>(cfg, std::move(stage), ps.group_ptr(GroupKind::PP));
  out.iteration = ckpt.state.iteration;
  out.group = ps.group_ptr(GroupKind::MP);
  out.data_parallel_rank = ps.dp_rank();
  out.data_parallel_size = ps.dp_size();
  const bool leads = ps.tp_rank() == 0 && ps.pp_rank() == 0;
  MG_CHECK(leads == (out.group->rank() == 0), "model-parallel group rank 0 is not TP 0, PP 0");
  if (!leads) {
    out.follower = std::move(engine);
    return out;
  }
  log_info("loaded checkpoint ", ckpt.dir.string(), " (iteration ", out.iteration, ") on ", tp,
           " x ", pp, " model-parallel ranks", ps.dp_size() > 1 ? str(" x ", ps.dp_size(), " replicas") : "",
           ": ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", vocab ",
           cfg.padded_vocab_size, "; weights in ", dtype_name(cfg.params_dtype), ", ", bytes,
           " bytes on this rank");
  out.model = std::make_unique<DistributedEngine>(
      std::move(engine), out.group,
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1));
  return out;
}

}  // namespace

InferenceModel load_inference_model(const InferenceModelOptions& options,
                                    std::shared_ptr<Communicator> world) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to generate with");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  if (options.tensor_model_parallel_size * options.pipeline_model_parallel_size > 1) {
    if (!world) world = world_communicator();
    if (world->size() > 1) return load_model_parallel(options, world);
  }
  InferenceModel out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  model::TransformerConfig cfg = options.model;
  const int64_t padded =
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1);
  cfg.padded_vocab_size = padded;
  const auto weights = CheckpointWeights::open(options.load, options.ckpt_step, padded);
  out.iteration = weights.iteration();
  const Tensor emb = weights.get("embedding.word_embeddings.weight");
  MG_REQUIRE(emb.defined(), "checkpoint ", weights.directory().string(),
             " has no embedding.word_embeddings.weight; is it a GPT checkpoint?");
  MG_REQUIRE(emb.dim() == 2 && emb.size(0) == padded, "the checkpoint's vocabulary has ",
             emb.size(0), " rows but the tokenizer (", out.tokenizer->vocab_size(),
             " tokens, --make-vocab-size-divisible-by ", options.make_vocab_size_divisible_by,
             ") pads to ", padded, "; use the tokenizer flags the model was trained with");
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : weights.names()) tensors.emplace(n, weights.get(n));
  auto engine = std::make_unique<GPTEngine>(cfg, with_local_norm_names(std::move(tensors)),
                                            options.device);
  log_info("loaded checkpoint ", weights.directory().string(), " (iteration ", out.iteration,
           "): ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", vocab ", padded,
           "; weights in ", dtype_name(cfg.params_dtype), ", ", engine->model().weight_bytes(),
           " bytes");
  out.model = std::move(engine);
  return out;
}

BertInference load_bert_model(const InferenceModelOptions& options,
                              std::shared_ptr<Communicator> world) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to evaluate");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  MG_CHECK(options.model.family_id() == model::ModelFamilyId::bert, "load_bert_model: not a BERT configuration");
  if (!world) world = world_communicator();
  const int tp = options.tensor_model_parallel_size, pp = options.pipeline_model_parallel_size;
  const bool model_parallel = world->size() > 1 && tp * pp > 1;
  MG_REQUIRE(!model_parallel || pp == 1, "--pipeline-model-parallel-size ", pp, ": evaluating a "
             "BERT checkpoint runs its pipeline stages merged on each rank; launch with "
             "--pipeline-model-parallel-size 1 (the stages are merged in memory), or with "
             "--tensor-model-parallel-size alone for a tensor-parallel checkpoint");
  BertInference out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  model::TransformerConfig cfg = inference_config(options.model);
  model::ModelOptions mo;
  mo.grad = false;
  mo.init_weights = false;
  mo.device = options.device;
  const model::ChunkPlace whole{model::PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0};
  if (!model_parallel) {
    cfg.padded_vocab_size =
        data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1);
    const auto weights = CheckpointWeights::open(options.load, options.ckpt_step, cfg.padded_vocab_size);
    out.iteration = weights.iteration();
    std::map<std::string, Tensor> tensors;
    for (const std::string& n : weights.names()) tensors.emplace(n, weights.get(n));
    out.model = std::make_unique<model::BertModel>(cfg, 0, model::TensorParallel::none(),
                                                   model::ContextParallel::none(), whole, mo);
    load_weights_into(out.model->parameters(), with_local_norm_names(std::move(tensors)),
                      cfg.params_dtype);
    out.data_parallel_rank = world->rank();
    out.data_parallel_size = world->size();
  } else {
    MG_REQUIRE(world->size() % tp == 0, "--tensor-model-parallel-size ", tp, " does not divide the ",
               world->size(), " ranks launched: launch a multiple of ", tp, " ranks");
    const ParallelState ps = model_parallel_state(world, tp, 1);
    cfg.padded_vocab_size =
        data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, tp);
    const auto [ckpt, crank] = rank_checkpoint(options, ps, "to evaluate");
    out.model = std::make_unique<model::BertModel>(
        cfg, 0, model::TensorParallel::make(ps.group_ptr(GroupKind::TP), false),
        model::ContextParallel::none(), whole, mo);
    training::load_model_weights(ckpt, out.model->parameters(), /*allow_dtype_conversion=*/true, crank);
    out.iteration = ckpt.state.iteration;
    out.data_parallel_rank = ps.dp_rank();
    out.data_parallel_size = ps.dp_size();
    out.reports = ps.tp_rank() == 0;
  }
  if (out.reports && out.data_parallel_rank == 0)
    log_info("loaded BERT checkpoint ", options.load, " (iteration ", out.iteration, ")",
             model_parallel ? str(" on ", tp, " tensor-parallel ranks") : "", ": ", cfg.num_layers,
             " layers, hidden ", cfg.hidden_size, ", vocab ", cfg.padded_vocab_size,
             cfg.bert_binary_head ? ", binary head" : ", no binary head", "; weights in ",
             dtype_name(cfg.params_dtype));
  return out;
}

}  // namespace megatron::inference
