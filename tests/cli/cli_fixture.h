// Shared inputs of the command-line tests: a GPT-2 BPE dataset of the demo corpus (its last 2000
// documents, preprocessed with `megatron preprocess-data`) and a small GPT trained on it with
// `megatron pretrain-gpt`. ctest runs every test case in its own process, so both are built once
// into a cache folder of the build tree (named after the megatron binary's modification time, so
// a rebuilt binary builds them again) and reused; the folder is written under a temporary name
// and renamed, so concurrent test processes never see half of it.
#pragma once

#include <filesystem>
#include <string>

namespace megatron::testing {

struct CliFixture {
  std::filesystem::path dir;          // the cache folder
  std::string data_prefix;            // DIR/corpus_text_document (.bin/.idx)
  std::string checkpoint;             // DIR/ckpt: 1 layer, hidden 32, 4 heads, seq 32, 40 iterations
  std::string tokenizer_flags;        // --tokenizer-type GPT2BPETokenizer --vocab-file ... --merge-file ...
  std::string vocab_file, merge_file;
};

// Builds the cache on first use (fails the calling test with the command's output if a step fails).
const CliFixture& cli_fixture();

// The model flags of the trained checkpoint (as pretrain-gpt got them).
inline const char* kFixtureModelFlags =
    " --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
    " --max-position-embeddings 32";

}  // namespace megatron::testing
