// Megatron's tokenizer flag group (--tokenizer-type, --vocab-file, --merge-file,
// --tokenizer-model, --vocab-size, --vocab-extra-ids, --tiktoken-pattern,
// --tiktoken-num-special-tokens, --tokenizer-special-tokens), added to any subcommand that builds
// a tokenizer, so every command spells and documents them the same way.
#pragma once

#include <CLI/CLI.hpp>

#include "data/tokenizer.h"

namespace megatron::cli {

// Adds the tokenizer flags to `sub`, writing into `o`. None is marked required here: a command
// that always needs a tokenizer marks --tokenizer-type required itself (see the returned option)
// and build_tokenizer() reports whichever file flag the chosen type is missing.
CLI::Option* add_tokenizer_options(CLI::App& sub, megatron::data::TokenizerOptions& o);

}  // namespace megatron::cli
