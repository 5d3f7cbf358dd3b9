// A small rule-based sentence splitter for `preprocess-data --split-sentences` (Megatron uses
// NLTK punkt; this is a deterministic stand-in with documented rules, no model files).
//
// Rules. A sentence ends after a run of terminators (. ! ? or U+2026 …), optionally followed by
// closing quotes or brackets ( " ' ) ] ” ’ » ), when whitespace follows and the next
// non-space character can start a sentence (an uppercase ASCII letter, a digit, an opening
// quote or bracket, or any non-ASCII character). A '.' does not end a sentence when the word
// before it is a single letter (an initial: "J. Smith"), contains another '.' ("e.g.", "U.S."),
// or is a common abbreviation (Mr Mrs Ms Dr Prof Sr Jr St vs etc Inc Ltd Co Corp Fig No Vol Jan
// Feb ... Dec, case-insensitive). Leading and trailing whitespace of each sentence is dropped;
// empty sentences are dropped. With keep_newlines, the newlines that follow a sentence (up to
// the last newline before the next sentence) stay attached to it, as Megatron's
// --keep-newlines does, so they reach the tokenizer.
#pragma once

#include <string_view>
#include <vector>

namespace megatron::data {

std::vector<std::string_view> split_sentences(std::string_view text, bool keep_newlines);

}  // namespace megatron::data
