// Zero-shot evaluation of a language model as Megatron-LM's tasks/zeroshot_gpt (tasks/main.py
// --task LAMBADA | WIKITEXT103), step for step:
//   - LAMBADA (cloze accuracy): one sample per JSON line's "text". Plain: the text's tokens, the
//     last token the target. --strict-lambada: the last whitespace-separated word is the target,
//     tokenized as " " + word (possibly several tokens), the context is the text before it,
//     stripped. A sample is correct when the argmax of every target position is the target token.
//     No detokenization is applied (Megatron's lambada detokenizer is the identity, and the
//     LAMBADA dataset does not call it).
//   - WIKITEXT103 (perplexity): the whole file, detokenized by the detokenizer its path names
//     ("ptb", "wiki" or "lambada", first match; datasets.py's get_detokenizer), tokenized at once
//     and cut into windows of seq-length + 1 tokens that start every --overlapping-eval tokens;
//     after the first window only the last overlapping-eval targets of each count, so every
//     token is scored once with at least seq-length - overlapping-eval tokens of context. The
//     loss is the summed cross entropy (over the padded vocabulary) / (tokens - 1); adjusted
//     perplexity rescales it by (tokens - 1) / (original words - 1), the words being the
//     stripped text split at single spaces.
// Positions after the last target of a sample do not change its scores (causal attention), so
// samples are not padded to seq-length as in Megatron, only to the longest row of a micro-batch;
// the result is the same.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "inference/language_model.h"

namespace megatron::inference {

// Megatron's detokenizers (tasks/zeroshot_gpt/detokenizer.py).
std::string ptb_detokenize(const std::string& text);
std::string wikitext_detokenize(const std::string& text);
// get_detokenizer(path): the first of "ptb", "wiki", "lambada" contained in the path; nullopt
// when none is (Megatron then fails).
enum class Detokenizer { Ptb, Wiki, Lambada };
std::optional<Detokenizer> detokenizer_for_path(const std::string& path);
std::string detokenize(Detokenizer d, const std::string& text);

// Python's str.strip() and str.split() on UTF-8 text (Unicode whitespace, as str.isspace).
std::string python_strip(const std::string& text);
std::vector<std::string> python_split(const std::string& text);

// One evaluation sample: tokens (context + targets), and for each label position (tokens[1:])
// whether it is scored.
struct ZeroShotSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // tokens.size() - 1 entries
};

// LAMBADA samples of a JSONL file ("text" per line; blank lines skipped). Errors name the file
// and line: malformed JSON, no "text", no token, more than seq_length + 1 tokens.
std::vector<ZeroShotSample> build_lambada_samples(const std::filesystem::path& file,
                                                  const data::Tokenizer& tokenizer, bool strict,
                                                  int64_t seq_length);

// The WikiText windows (Megatron's _LMDataset over the tokenized, detokenized file).
class LMWindows {
 public:
  LMWindows(std::vector<int32_t> tokens, int64_t seq_length, int32_t pad_id,
            int64_t overlapping_eval, int64_t num_original_tokens);
  int64_t size() const { return num_windows_; }
  ZeroShotSample get(int64_t index) const;
  int64_t num_tokenized_tokens() const { return int64_t(tokens_.size()); }
  int64_t num_original_tokens() const { return num_original_tokens_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_length_, overlapping_eval_, num_windows_, num_original_tokens_;
  int32_t pad_id_;
};

// The WikiText data of a raw file (e.g. wiki.test.tokens): read (UTF-8), counted, detokenized
// (`detokenizer`, default: the one the path names; a path naming none is an error saying so),
// tokenized.
LMWindows build_wikitext_windows(const std::filesystem::path& file, const data::Tokenizer& tokenizer,
                                 int64_t seq_length, int64_t overlapping_eval,
                                 std::optional<Detokenizer> detokenizer = std::nullopt);

struct ZeroShotTotals {
  double loss_sum = 0;   // summed cross entropy of the scored positions (nats)
  int64_t correct = 0;   // samples whose every scored position's argmax is its label
  int64_t samples = 0;
  int64_t scored = 0;    // scored positions
};

struct ZeroShotOptions {
  int64_t micro_batch_size = 1;
  int32_t pad_id = 0;  // fills rows shorter than the longest of their micro-batch
  // Called before each micro-batch (Megatron's "> working on iteration" every --log-interval).
  std::function<void(int64_t iteration, int64_t samples_done, int64_t samples_total)> progress;
};

// Scores `count` samples (sample(i) gives the i-th) in micro-batches through the model.
ZeroShotTotals score_samples(LanguageModel& model, int64_t count,
                             const std::function<ZeroShotSample(int64_t)>& sample,
                             const ZeroShotOptions& options);

// Megatron's result line (without the dashes around it).
std::string lambada_result_line(const std::string& task, int64_t correct, int64_t total);
std::string wikitext_result_line(const std::string& task, double loss_sum,
                                 int64_t num_tokenized_tokens, int64_t num_original_tokens);

// Python's repr of a float ("1.0", "0.1", "1e-05"), as Megatron prints the token ratio.
std::string python_float_repr(double v);

}  // namespace megatron::inference
