// preprocess-data: text (JSONL, plain text or Parquet; one file or a glob of files, read in
// order) -> tokenized indexed datasets, as Megatron's tools/preprocess_data.py, but streamed and
// multi-threaded:
//   reader thread (fixed-size chunks, never the whole file) -> bounded queue of record batches
//   -> N worker threads (UTF-8 check, JSON parse, sentence split, tokenize)
//   -> ordered reassembly on the calling thread -> one IndexedDatasetBuilder per JSON key.
// At most ~4 batches per worker are in flight, so memory stays constant for any input size
// (a single very long line costs a few times its own size).
//
// Megatron's per-document rule: each value (a string, or a list of strings = pre-split
// sentences) is tokenized sentence by sentence, sentences that tokenize to nothing are dropped,
// and with append_eod the EOD id is appended to non-empty documents (counted in the last
// sentence's length). A document that tokenizes to nothing is written as an empty document.
// An empty input file gives an empty dataset (0 documents) and a warning, as Megatron does.
// Outputs are written under temporary names and renamed only when everything succeeded.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace megatron::data {

enum class InputFormat {
  Auto,            // *.txt -> TextLines, anything else -> Jsonl
  Jsonl,           // one JSON object per line
  TextLines,       // one document per line (trailing '\r' dropped)
  TextParagraphs,  // one document per block of lines separated by blank lines
  Parquet,         // Parquet files: one document per row, --json-keys name string columns
};
// auto|jsonl|text-lines|text-paragraphs|parquet
InputFormat input_format_from_name(const std::string& name);

struct PreprocessOptions {
  std::string input;                          // --input (a file or a glob of files)
  std::vector<std::string> json_keys{"text"};  // --json-keys (text inputs: one name for outputs)
  std::string output_prefix;                  // --output-prefix
  InputFormat input_format = InputFormat::Auto;
  bool append_eod = false;       // --append-eod
  bool split_sentences = false;  // --split-sentences (output level "sentence")
  bool keep_newlines = false;    // --keep-newlines
  int workers = 1;               // --workers (tokenizing threads)
  int64_t log_interval = 1000;   // --log-interval (documents)
  bool skip_errors = false;      // --on-error skip
  bool progress = true;          // progress lines on stderr
  // Checked between batches; when it becomes true the run stops with an error and writes nothing.
  const std::atomic<bool>* stop_requested = nullptr;
};

struct PreprocessStats {
  int64_t documents = 0;  // written (incl. empty ones)
  int64_t empty = 0;      // written but with no tokens in any key
  int64_t skipped = 0;    // bad records dropped under --on-error skip
  int64_t tokens = 0;     // over all keys
  int64_t input_bytes = 0;
  double seconds = 0;
  std::vector<std::string> output_prefixes;  // one per key: PREFIX_KEY_document|sentence
};

// The files --input names: itself, or the sorted matches of a glob pattern (*, ?, [...]).
std::vector<std::string> expand_input(const std::string& input);

// "{output_prefix}_{key}_{document|sentence}" for each key.
std::vector<std::string> preprocess_output_prefixes(const PreprocessOptions& options);

// Runs the whole pipeline. Throws megatron::Error on the first bad record (naming file:line)
// unless skip_errors; on any error no output file is left behind.
PreprocessStats preprocess_data(const PreprocessOptions& options, const Tokenizer& tokenizer);

// Checks that `s` is valid UTF-8; returns the byte offset of the first invalid byte or npos.
size_t find_invalid_utf8(std::string_view s);

// One JSONL record (a line, valid UTF-8): for each of `keys`, its text (a string) or its
// sentences (a list of strings), viewing into `storage`. Returns what is wrong, for the caller to
// prefix with file:line (malformed JSON, not an object, a missing key, a value of another type),
// or an empty string.
struct JsonlValue {
  std::vector<std::string_view> sentences;  // one element for a string value
  bool list = false;                        // the value was a list (already split)
};
std::string parse_jsonl_record(std::string_view line, const std::vector<std::string>& keys,
                               nlohmann::json& storage, std::vector<JsonlValue>& values);

}  // namespace megatron::data
