// T5 prompts, outputs and checkpoints (see t5_generation.h).
#include "inference/t5_generation.h"

#include <regex>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "data/bert_wordpiece.h"
#include "inference/checkpoint_weights.h"

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

T5Inference load_t5_model(const InferenceModelOptions& options) {
  MG_REQUIRE(!options.load.empty(), "--load is required: the checkpoint folder to generate with");
  MG_REQUIRE(!options.tokenizer.type.empty(), "--tokenizer-type is required");
  MG_CHECK(options.model.family_id() == model::ModelFamilyId::t5, "load_t5_model: not a T5 configuration");
  if (options.tensor_model_parallel_size * options.pipeline_model_parallel_size > 1)
    MG_REQUIRE(world_communicator()->size() == 1, "T5 generation runs on one process: run "
               "`megatron generate` without launch/mpirun (a sharded checkpoint's shards are "
               "merged in memory)");
  T5Inference out;
  out.tokenizer = data::build_tokenizer(options.tokenizer);
  t5_sentinels(*out.tokenizer);  // the tokenizer's kind
  MG_REQUIRE(out.tokenizer->bos() && out.tokenizer->eos(), "T5 generation needs [BOS] and [EOS] "
             "in the tokenizer");
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
