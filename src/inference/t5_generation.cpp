// T5 prompts, outputs and checkpoints (see t5_generation.h).
#include "inference/t5_generation.h"

#include <regex>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "core/error.h"
#include "core/log.h"
#include "data/bert_wordpiece.h"
#include "inference/checkpoint_weights.h"
#include "inference/gpt_engine.h"
#include "training/checkpoint.h"

namespace megatron::inference {

const std::vector<int32_t>& t5_sentinels(const data::Tokenizer& tokenizer) {
  const auto* wp = dynamic_cast<const data::BertWordPieceTokenizer*>(&tokenizer);
  MG_REQUIRE(wp != nullptr, "T5 generation needs the tokenizer T5 is trained with "
             "(--tokenizer-type BertWordPieceLowerCase or BertWordPieceCase with "
             "--vocab-extra-ids, as pretrain-t5), not ", tokenizer.type());
  return wp->extra_ids();
}

std::vector<int32_t> encode_t5_prompt(const data::Tokenizer& tokenizer, std::string_view text,
                                      int64_t index) {
  static const std::regex sentinel(R"(<extra_id_(\d{1,9})>)");
  const std::vector<int32_t>& ids = t5_sentinels(tokenizer);
  std::vector<int32_t> out;
  const std::string s(text);
  size_t at = 0;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), sentinel); it != std::sregex_iterator();
       ++it) {
    tokenizer.encode(std::string_view(s).substr(at, size_t(it->position()) - at), out);
    const long n = std::stol((*it)[1].str());
    MG_REQUIRE(n < long(ids.size()), "prompt ", index, " has <extra_id_", n, "> but the tokenizer has ",
               ids.size(), " sentinels (--vocab-extra-ids ", ids.size(), "); pass the "
               "--vocab-extra-ids the model was trained with (or --use-checkpoint-args)");
    out.push_back(ids[size_t(n)]);
    at = size_t(it->position() + it->length());
  }
  tokenizer.encode(std::string_view(s).substr(at), out);
  return out;
}

T5Output read_t5_output(const data::Tokenizer& tokenizer, std::span<const int32_t> encoder_input,
                        std::span<const int32_t> generated) {
  const std::vector<int32_t>& ids = t5_sentinels(tokenizer);
  std::map<int32_t, int> number;
  for (size_t i = 0; i < ids.size(); ++i) number.emplace(ids[i], int(i));
  const std::optional<int32_t> eos = tokenizer.eos();
  T5Output out;
  size_t end = generated.size();
  if (end > 0 && eos && generated[end - 1] == *eos) --end;
  out.text = tokenizer.decode(generated.first(end));
  // Each sentinel the decoder writes opens its span (a repeated sentinel keeps its first span).
  std::vector<int32_t>* span = nullptr;
  for (size_t i = 0; i < end; ++i) {
    auto it = number.find(generated[i]);
    if (it != number.end()) {
      auto [slot, fresh] = out.spans.try_emplace(it->second);
      span = fresh ? &slot->second : nullptr;
    } else if (span) {
      span->push_back(generated[i]);
    }
  }
  // The prompt again, each sentinel replaced by its span.
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    out.filled += (out.filled.empty() ? "" : " ") + tokenizer.decode(run);
    run.clear();
  };
  for (int32_t t : encoder_input) {
    auto it = number.find(t);
    if (it == number.end()) {
      run.push_back(t);
      continue;
    }
    flush();
    auto s = out.spans.find(it->second);
    const std::string piece = s != out.spans.end() ? "[" + tokenizer.decode(s->second) + "]"
                                                   : tokenizer.decode(std::span(&t, 1));
    out.filled += (out.filled.empty() ? "" : " ") + piece;
  }
  flush();
  return out;
}

void broadcast_lines(Communicator& group, std::vector<std::string>& lines) {
  std::vector<int64_t> packed = {int64_t(lines.size())};
  for (const std::string& l : lines) {
    packed.push_back(int64_t(l.size()));
    for (char c : l) packed.push_back(int64_t(uint8_t(c)));
  }
  Tensor size = Tensor::from_vector<int64_t>({int64_t(packed.size())}, {1});
  group.broadcast(size, 0);
  Tensor all = group.rank() == 0 ? Tensor::from_vector(packed, {int64_t(packed.size())})
                                 : Tensor::zeros({size.data<int64_t>()[0]}, DType::I64);
  group.broadcast(all, 0);
  const int64_t* v = all.data<int64_t>();
  lines.assign(size_t(v[0]), std::string());
  int64_t at = 1;
  for (std::string& l : lines) {
    const int64_t n = v[at++];
    for (int64_t i = 0; i < n; ++i) l.push_back(char(uint8_t(v[at++])));
  }
}

namespace {

// Launched on --tensor-model-parallel-size ranks: each rank's shard of the model from its own
// mp_rank_TT files (see load_t5_model).
T5Inference load_t5_tensor_parallel(const InferenceModelOptions& options,
                                    const std::shared_ptr<Communicator>& world,
                                    std::unique_ptr<data::Tokenizer> tokenizer) {
  const int tp = options.tensor_model_parallel_size;
  MG_REQUIRE(options.pipeline_model_parallel_size == 1, "--pipeline-model-parallel-size ",
             options.pipeline_model_parallel_size, ": T5 has no pipeline parallelism (Megatron-LM's "
             "pretrain_t5.py refuses it); launch --tensor-model-parallel-size ranks");
  MG_REQUIRE(world->size() == tp, "a T5 checkpoint runs on --tensor-model-parallel-size ", tp,
             " ranks, but ", world->size(), " were launched: launch exactly ", tp);
  ParallelConfig pc;
  pc.world_size = world->size();
  pc.tensor_model_parallel_size = tp;
  const ParallelState ps = ParallelState::create(world, pc);
  T5Inference out;
  out.tokenizer = std::move(tokenizer);
  model::TransformerConfig cfg = inference_config(options.model);
  // Megatron pads the vocabulary to a multiple of the divisor times the tensor-parallel size.
  cfg.padded_vocab_size =
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, tp);
  const auto ckpt = training::find_checkpoint(options.load, options.ckpt_step);
  MG_REQUIRE(ckpt.has_value(), "--load ", options.load, " holds no checkpoint to generate with");
  const training::CheckpointRank crank = training::CheckpointRank::from(ps);
  training::check_checkpoint_layout(*ckpt, crank);
  model::ModelOptions mo;
  mo.grad = false;
  mo.init_weights = false;
  mo.device = options.device;
  auto m = std::make_unique<model::T5Model>(
      cfg, 0, model::TensorParallel::make(ps.group_ptr(GroupKind::TP), false),
      model::ContextParallel::none(),
      model::ChunkPlace{model::PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}, mo);
  training::load_model_weights(*ckpt, m->parameters(), /*allow_dtype_conversion=*/true, crank);
  out.iteration = ckpt->state.iteration;
  out.group = ps.group_ptr(GroupKind::TP);
  out.reports = ps.tp_rank() == 0;
  out.model = std::make_unique<T5Engine>(
      std::move(m),
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1));
  if (out.reports)
    log_info("loaded T5 checkpoint ", ckpt->dir.string(), " (iteration ", out.iteration, ") on ",
             tp, " tensor-parallel ranks: encoder ", cfg.num_layers, " and decoder ",
             cfg.decoder_layers(), " layers, hidden ", cfg.hidden_size, ", vocab ",
             cfg.padded_vocab_size, "; weights in ", dtype_name(cfg.params_dtype));
  return out;
}

}  // namespace

T5Inference load_t5_model(const InferenceModelOptions& options) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to generate with");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  MG_CHECK(options.model.family_id() == model::ModelFamilyId::t5, "load_t5_model: not a T5 configuration");
  // The tokenizer first: its kind and its [BOS] / [EOS] are checked before any weight is read.
  std::unique_ptr<data::Tokenizer> tokenizer = data::build_tokenizer(options.tokenizer);
  t5_sentinels(*tokenizer);
  MG_REQUIRE(tokenizer->bos() && tokenizer->eos(), "T5 generation needs [BOS] and [EOS] in the "
             "tokenizer");
  if (options.tensor_model_parallel_size * options.pipeline_model_parallel_size > 1)
    if (const auto world = world_communicator(); world->size() > 1)
      return load_t5_tensor_parallel(options, world, std::move(tokenizer));
  T5Inference out;
  out.tokenizer = std::move(tokenizer);
  model::TransformerConfig cfg = options.model;
  cfg.padded_vocab_size =
      data::padded_vocab_size(out.tokenizer->vocab_size(), options.make_vocab_size_divisible_by, 1);
  const auto weights = CheckpointWeights::open(options.load, options.ckpt_step, cfg.padded_vocab_size);
  out.iteration = weights.iteration();
  const Tensor emb = weights.get("embedding.word_embeddings.weight");
  MG_REQUIRE(emb.defined() && emb.dim() == 2 && emb.size(0) == cfg.padded_vocab_size,
             "the checkpoint's word table (", weights.directory().string(), ") does not have the ",
             cfg.padded_vocab_size, " rows the tokenizer (", out.tokenizer->vocab_size(),
             " tokens with --vocab-extra-ids ", options.tokenizer.vocab_extra_ids,
             ", --make-vocab-size-divisible-by ", options.make_vocab_size_divisible_by,
             ") pads to; use the tokenizer flags the model was trained with");
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : weights.names()) tensors.emplace(n, weights.get(n));
  out.model = std::make_unique<T5Engine>(cfg, with_local_norm_names(std::move(tensors)),
                                         options.device);
  log_info("loaded T5 checkpoint ", weights.directory().string(), " (iteration ", out.iteration,
           "): encoder ", cfg.num_layers, " and decoder ", cfg.decoder_layers(),
           " layers, hidden ", cfg.hidden_size, ", vocab ", cfg.padded_vocab_size, ", ",
           t5_sentinels(*out.tokenizer).size(), " sentinels; weights in ",
           dtype_name(cfg.params_dtype), ", ", out.model->model().weight_bytes(), " bytes");
  return out;
}

}  // namespace megatron::inference
