// Span filling with a T5 checkpoint (`megatron generate` on pretrain-t5's checkpoints).
// A prompt is the encoder's input as Megatron's T5 dataset builds it (text_enc): text in which
// each <extra_id_N> stands for a span to fill, tokenized by the WordPiece tokenizer the model was
// trained with (BertWordPieceLowerCase/BertWordPieceCase with --vocab-extra-ids, whose extra ids
// are the sentinels). The text between sentinels is tokenized as WordPiece tokenizes any text
// (the sentinels are cut out first: WordPiece itself would split "<extra_id_0>" on its
// punctuation). The decoder starts from [BOS] (text_dec) and, as trained (labels), writes each
// sentinel followed by its span, then [EOS]: generation stops there or at the token limit. The
// output puts each span back into the prompt.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "inference/model_loader.h"
#include "inference/t5_engine.h"

namespace megatron::inference {

// The sentinel ids <extra_id_0>, <extra_id_1>, ... of a T5 tokenizer (empty without
// --vocab-extra-ids). Throws megatron::Error for a tokenizer T5 is not trained with.
const std::vector<int32_t>& t5_sentinels(const data::Tokenizer& tokenizer);

// The encoder input of `text`: its tokens, with <extra_id_N> as sentinel N. An N the tokenizer
// lacks is an error naming prompt `index` and --vocab-extra-ids.
std::vector<int32_t> encode_t5_prompt(const data::Tokenizer& tokenizer, std::string_view text,
                                      int64_t index);

struct T5Output {
  std::string text;                               // the decoder's tokens after [BOS], decoded
  std::map<int, std::vector<int32_t>> spans;       // sentinel N -> the tokens written after it
  std::string filled;  // the prompt with each <extra_id_N> replaced by "[span N]" (kept if none)
};
// Reads the decoder's output (the tokens after [BOS], with the [EOS] that ended it, if any)
// against the encoder input it answered.
T5Output read_t5_output(const data::Tokenizer& tokenizer, std::span<const int32_t> encoder_input,
                        std::span<const int32_t> generated);

struct T5Inference {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<T5Engine> model;
  int64_t iteration = 0;
  // Launched with --tensor-model-parallel-size T (T ranks): the tensor-parallel group, whose
  // ranks all run the same generation (the logits are gathered over the vocabulary shards on
  // every rank, so every rank samples the same tokens); rank 0 reports. Null on one process.
  std::shared_ptr<Communicator> group;
  bool reports = true;
};
// A T5 checkpoint (options.model: model family "t5"): the tokenizer and the engine with the
// checkpoint's weights. One process: tensor-parallel shards merged in memory. Launched on T ranks
// with --tensor-model-parallel-size T (the checkpoint's): every rank builds its shard of the model
// from its own mp_rank_TT files. Throws megatron::Error naming the flag or file at fault.
T5Inference load_t5_model(const InferenceModelOptions& options);

// Several ranks: rank 0's `lines` on every rank of `group` (only rank 0 reads the prompts).
void broadcast_lines(Communicator& group, std::vector<std::string>& lines);

}  // namespace megatron::inference
