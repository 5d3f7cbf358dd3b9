// `megatron checkpoint convert` and the tokenizer files of a checkpoint's arguments: a relative
// path (relative to where training ran) is found next to --load or in its parent, the tokenizer
// flags replace the recorded files, and when neither finds them the error says which flags to pass.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "test_util.h"
#include "training/checkpoint_files.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(ConvertTokenizerFiles, FoundNextToTheCheckpointOrNamedByFlags) {
  const auto& f = cli_fixture();
  TempDir tmp;
  // The fixture's checkpoint resharded to TP2 (50432 vocabulary rows), with its tokenizer files
  // recorded as a run in another folder records them: by relative name.
  fs::create_directories(tmp / "run");
  const auto tp2 = run_cli("checkpoint convert --load " + f.checkpoint + " --save " +
                           (tmp / "run" / "ckpt").string() + " --target-tensor-parallel-size 2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  const fs::path meta = tmp / "run" / "ckpt" / "iter_0000040" / "metadata.json";
  json j = json::parse(read_file(meta));
  j["args"]["tokenizer"]["vocab_file"] = "gpt2-vocab.json";
  j["args"]["tokenizer"]["merge_file"] = "gpt2-merges.txt";
  training::detail::write_metadata(meta.parent_path(), j.dump());  // with its checksum file
  const std::string cd = "cd '" + tmp.path().string() + "' && '" + cli_path().string() + "' ";
  // TP2 -> TP1: 50432 rows under TP2 hold 50177 to 50432 tokens, which pad to 50304 or 50432
  // rows under TP1: the unpadded size (GPT-2's 50257 -> 50304 rows) is needed.
  auto convert = [&](const std::string& save, const std::string& flags) {
    return run_command(cd + "checkpoint convert --load run/ckpt --save " + save +
                       " --target-tensor-parallel-size 1" + flags);
  };
  auto r = convert("out1", "");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const char* says : {"error: ", "'gpt2-vocab.json'", "target layout (TP=1)", "pass its files with --vocab-file and --merge-file",
                           "--true-vocab-size"})
    EXPECT_NE(r.output.find(says), std::string::npos) << says << "\n" << r.output;
  EXPECT_FALSE(fs::exists(tmp / "out1"));
  // The files given as flags.
  r = convert("out2", " --vocab-file " + f.vocab_file + " --merge-file " + f.merge_file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(tmp / "out2" / "iter_0000040" / "metadata.json"))["args"]["model"]
                ["padded_vocab_size"], 50304);
  // A tokenizer given by flags is checked against the checkpoint's vocabulary.
  r = convert("out3", " --tokenizer-type NullTokenizer --vocab-size 100");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: the tokenizer given here has"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("another tokenizer?"), std::string::npos) << r.output;
  // The files next to the checkpoint's folder (the folder training ran in).
  fs::copy_file(f.vocab_file, tmp / "run" / "gpt2-vocab.json");
  fs::copy_file(f.merge_file, tmp / "run" / "gpt2-merges.txt");
  r = convert("out4", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the tokenizer file gpt2-vocab.json is run/gpt2-vocab.json"),
            std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::testing
