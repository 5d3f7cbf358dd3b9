// What every checkpoint reader verifies, end to end with the CLI on one tiny trained checkpoint:
// metadata.json against metadata.json.sha256 (a one-digit edit is refused by pretrain-gpt,
// generate and checkpoint convert; so is a deleted checksum file, unless the checkpoint is older
// than the checksum file), the SHA-256 of the weights in generate, non-finite weights
// refused with the tensor's name, the recorded model settings on resume (with
// --override-checkpoint-model-args for a deliberate change), leftovers of interrupted saves, a
// failed save removing what it wrote, folders 0750 whatever the umask, and clear errors for
// tracker problems.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "model/model_settings.h"
#include "test_util.h"
#include "training/checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const kModel =
    "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
    "--max-position-embeddings 16 --tokenizer-type NullTokenizer --vocab-size 64 "
    "--make-vocab-size-divisible-by 8 ";

// One corpus and one checkpoint (iterations 2 and 4 of 8) for the whole suite; each test
// copies it.
class CheckpointIntegrity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    prefix_ = (*dir_ / "corpus").string();
    data::IndexedDatasetBuilder b(prefix_, data::IndexDType::U16);
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 30; ++i) doc.push_back((d + i * 3) % 63);
      doc.push_back(63);
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
    const auto r = testing::run_cli(train_flags(8) + " --exit-interval 4 --save " +
                                    (*dir_ / "good").string() + " --save-interval 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string train_flags(int iters) {
    return std::string("pretrain-gpt ") + kModel + "--micro-batch-size 2 --global-batch-size 2 "
           "--lr 1e-3 --train-iters " + std::to_string(iters) + " --data-path " + prefix_ +
           " --split 1 --log-interval 1 --eval-interval 100 --eval-iters 0 --hidden-dropout 0 "
           "--attention-dropout 0";
  }
  // A writable copy of the good checkpoint.
  fs::path copy(const std::string& name) const {
    const fs::path to = *dir_ / name;
    fs::remove_all(to);
    fs::copy(*dir_ / "good", to, fs::copy_options::recursive);
    for (const auto& e : fs::recursive_directory_iterator(to))
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    return to;
  }
  static testing::CommandResult resume(const fs::path& ckpt, const std::string& extra = "") {
    return testing::run_cli(train_flags(8) + " --load " + ckpt.string() + " " + extra);
  }
  static testing::CommandResult generate(const fs::path& ckpt) {
    // pretrain-gpt and generate share the default GeLU (Megatron's fused tanh form).
    return testing::run_cli(std::string("generate ") + kModel + "--load " +
                            ckpt.string() + " --prompt '1 2 3' --num-tokens-to-generate 2");
  }
  static testing::TempDir* dir_;
  static std::string prefix_;
};
testing::TempDir* CheckpointIntegrity::dir_ = nullptr;
std::string CheckpointIntegrity::prefix_;

void write_manifest(const fs::path& iter) {
  testing::write_file(iter / "metadata.json.sha256", sha256_file(iter / "metadata.json") + "  metadata.json\n");
}

// Rewrites a model file with `edit` applied to its tensors, and the checksums that describe it,
// as a writer that saved diverged weights would.
template <typename Edit>
void rewrite_model(const fs::path& iter, Edit edit) {
  const fs::path file = iter / "mp_rank_00/model.safetensors";
  auto st = read_safetensors(file);
  edit(st.tensors);
  std::vector<std::pair<std::string, Tensor>> list(st.tensors.begin(), st.tensors.end());
  write_safetensors(file, list, st.metadata);
  json meta = json::parse(testing::read_file(iter / "metadata.json"));
  meta["files"]["mp_rank_00/model.safetensors"] = {{"bytes", fs::file_size(file)}, {"sha256", sha256_file(file)}};
  testing::write_file(iter / "metadata.json", meta.dump(2));
  write_manifest(iter);
}

#define EXPECT_FAILS_WITH(result, ...)                                                  \
  do {                                                                                  \
    const auto& r_ = (result);                                                          \
    EXPECT_EQ(r_.exit_code, 1) << r_.output;                                            \
    for (const std::string& n_ : std::vector<std::string>{__VA_ARGS__})                 \
      EXPECT_NE(r_.output.find(n_), std::string::npos) << "missing '" << n_ << "' in\n" << r_.output; \
  } while (0)

TEST_F(CheckpointIntegrity, MetadataIsVerifiedByEveryReader) {
  const fs::path ck = copy("meta");
  const fs::path iter = ck / "iter_0000004";
  EXPECT_EQ(testing::read_file(iter / "metadata.json.sha256"),
            sha256_file(iter / "metadata.json") + "  metadata.json\n");
  // One digit of the schedule's step count changed: every reader refuses it.
  std::string text = testing::read_file(iter / "metadata.json");
  const size_t at = text.find("\"num_steps\": 8");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 13] = '9';
  testing::write_file(iter / "metadata.json", text);
  const std::string needle = "metadata.json: SHA-256 checksum mismatch";
  EXPECT_FAILS_WITH(resume(ck), needle);
  EXPECT_FAILS_WITH(generate(ck), needle);
  EXPECT_FAILS_WITH(testing::run_cli("checkpoint convert --load " + ck.string() + " --save " +
                                     (ck.string() + "_tp2") + " --target-tensor-parallel-size 2"),
                    needle);
  // A manifest that is not a checksum is an error too.
  testing::write_file(iter / "metadata.json.sha256", "garbage\n");
  EXPECT_FAILS_WITH(generate(ck), "metadata.json.sha256 is malformed");
}

TEST_F(CheckpointIntegrity, AMissingMetadataChecksumIsAnErrorUnlessTheCheckpointPredatesIt) {
  // metadata.json records that its checksum file was written: deleting that file (with or
  // without an edit of metadata.json) does not pass for an older checkpoint.
  const fs::path ck = copy("nosum");
  const fs::path iter = ck / "iter_0000004";
  const json recorded = json::parse(testing::read_file(iter / "metadata.json"));
  EXPECT_EQ(recorded.value("metadata_checksum_file", ""), "metadata.json.sha256");
  fs::remove(iter / "metadata.json.sha256");
  std::string text = testing::read_file(iter / "metadata.json");
  const size_t at = text.find("\"num_steps\": 8");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 13] = '9';
  testing::write_file(iter / "metadata.json", text);
  const std::vector<std::string> needles = {
      "incomplete checkpoint: " + (iter / "metadata.json.sha256").string() + " is missing",
      "records that it was saved beside it", "Copy metadata.json.sha256 from the original checkpoint",
      "sha256sum metadata.json > metadata.json.sha256"};
  for (const auto& r : {resume(ck), generate(ck),
                        testing::run_cli("checkpoint convert --load " + ck.string() + " --save " +
                                         (ck.string() + "_tp2") + " --target-tensor-parallel-size 2")}) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const std::string& n : needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(ck.string() + "_tp2"));
  // The way out the message gives: the recreated file is accepted again.
  testing::write_file(iter / "metadata.json", recorded.dump(2) + "\n");
  write_manifest(iter);
  const auto back = generate(ck);
  EXPECT_EQ(back.exit_code, 0) << back.output;

  // A checkpoint of an older build has neither the key nor the file: it loads with a warning.
  const fs::path old = copy("nosum_old");
  const fs::path old_iter = old / "iter_0000004";
  json m = json::parse(testing::read_file(old_iter / "metadata.json"));
  m.erase("metadata_checksum_file");
  testing::write_file(old_iter / "metadata.json", m.dump(2));
  fs::remove(old_iter / "metadata.json.sha256");
  const auto g = generate(old);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find("has no metadata.json.sha256"), std::string::npos) << g.output;
  const auto r = resume(old);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(CheckpointIntegrity, GenerateVerifiesTheWeightsChecksum) {
  const fs::path ck = copy("flip");
  const fs::path file = ck / "iter_0000004/mp_rank_00/model.safetensors";
  std::string bytes = testing::read_file(file);
  bytes[bytes.size() - 9] ^= 0x01;
  testing::write_file(file, bytes);
  EXPECT_FAILS_WITH(generate(ck), "model.safetensors: SHA-256 checksum mismatch");
}

TEST_F(CheckpointIntegrity, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const fs::path ck = copy("nan");
  rewrite_model(ck / "iter_0000004", [](std::map<std::string, Tensor>& t) {
    t.at("decoder.final_layernorm.weight").data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  });
  for (const auto& r : {resume(ck), generate(ck)})
    EXPECT_FAILS_WITH(r, "tensor 'decoder.final_layernorm.weight' holds NaN (element 3 of 16)",
                      "model.safetensors");
  const fs::path inf = copy("inf");
  rewrite_model(inf / "iter_0000004", [](std::map<std::string, Tensor>& t) {
    t.at("embedding.word_embeddings.weight").data<float>()[0] = -std::numeric_limits<float>::infinity();
  });
  EXPECT_FAILS_WITH(generate(inf), "tensor 'embedding.word_embeddings.weight' holds an infinity");
}

TEST_F(CheckpointIntegrity, ResumeChecksTheRecordedModelSettings) {
  const fs::path ck = copy("settings");
  const std::string meta = (ck / "iter_0000004/metadata.json").string();
  // Trained with the tanh GeLU (the default); resumed with the exact (erf) form.
  EXPECT_FAILS_WITH(resume(ck, "--no-bias-gelu-fusion"), "error: --no-bias-gelu-fusion",
                    "activation = GeLU (tanh form)", "this run gives GeLU (exact erf form)", meta,
                    "--override-checkpoint-model-args");
  EXPECT_FAILS_WITH(resume(ck, "--layernorm-epsilon 1e-6"), "error: --norm-epsilon / --layernorm-epsilon",
                    "layernorm_epsilon", meta);
  // A deliberate change: a warning, and training goes on.
  const auto r = resume(ck, "--no-bias-gelu-fusion --override-checkpoint-model-args");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--override-checkpoint-model-args: --no-bias-gelu-fusion"), std::string::npos) << r.output;
  // A key an older checkpoint did not record means its default then.
  const fs::path old = copy("settings_old");
  const fs::path iter = old / "iter_0000004";
  json m = json::parse(testing::read_file(iter / "metadata.json"));
  m["args"]["model"].erase("layernorm_epsilon");
  testing::write_file(iter / "metadata.json", m.dump(2));
  write_manifest(iter);
  EXPECT_FAILS_WITH(resume(old, "--layernorm-epsilon 1e-6"), "not recorded: the default then");
  EXPECT_EQ(resume(old).exit_code, 0);
  // Every setting of the table appears once; its flags (none for the ones the model type
  // fixes, such as the attention mask) are Megatron's.
  std::set<std::string> keys;
  for (const auto& k : model::model_settings()) {
    EXPECT_TRUE(keys.insert(k.key).second) << k.key;
    for (const char* f : k.flags) EXPECT_EQ(std::string(f).rfind("--", 0), 0u) << f;
  }
}

TEST_F(CheckpointIntegrity, LeftoversOfInterruptedSavesAreNamedAndCleaned) {
  const fs::path ck = copy("leftovers");
  fs::create_directories(ck / ".tmp_iter_0000006/mp_rank_00");
  testing::write_file(ck / ".tmp_iter_0000006/mp_rank_00/model.safetensors", "partial");
  auto g = generate(ck);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find(".tmp_iter_0000006: incomplete checkpoint folders left by interrupted saves"),
            std::string::npos) << g.output;
  // A re-save of iteration 4 stopped between its two renames: the complete copy is aside.
  fs::rename(ck / "iter_0000004", ck / ".old_iter_0000004");
  EXPECT_FAILS_WITH(generate(ck), ".old_iter_0000004 holds it", "rename it back to iter_0000004");
  // The next save into the folder restores it and removes the partial one.
  const auto r = testing::run_cli(train_flags(2) + " --save " + ck.string() + " --save-interval 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restored " + (ck / "iter_0000004").string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("removed " + (ck / ".tmp_iter_0000006").string()), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(ck / "iter_0000004/metadata.json"));
  EXPECT_FALSE(fs::exists(ck / ".tmp_iter_0000006"));
  EXPECT_FALSE(fs::exists(ck / ".old_iter_0000004"));
}

// A save whose writes fail (the file-size limit of `ulimit -f` fails them as a full disk does,
// through the same write path; no root or special filesystem needed) removes its partial folder
// and says what it removed and how much space it needs; later runs find nothing to clean up.
TEST_F(CheckpointIntegrity, AFailedSaveRemovesItsPartialFolderAndSaysWhatItNeeds) {
  const fs::path ck = *dir_ / "full";
  const uint64_t model_bytes = fs::file_size(*dir_ / "good/iter_0000002/mp_rank_00/model.safetensors");
  ASSERT_GT(model_bytes, 16u << 10);  // the limit below stops the first tensor file
  const auto r = testing::run_command("bash -c \"trap '' XFSZ; ulimit -f 16; exec '" +
                                      testing::cli_path().string() + "' " + train_flags(2) +
                                      " --save " + ck.string() + " --save-interval 2\" 2>&1");
  EXPECT_FAILS_WITH(r, "write failed: " + (ck / ".tmp_iter_0000002").string(), "File too large",
                    "removed the partial save " + (ck / ".tmp_iter_0000002").string() + " (",
                    "this rank's part of the save needs about ", ck.string() + " has ");
  EXPECT_FALSE(fs::exists(ck / ".tmp_iter_0000002"));
  EXPECT_FALSE(fs::exists(ck / "iter_0000002"));
  EXPECT_FALSE(fs::exists(ck / "latest_checkpointed_iteration.txt"));
  EXPECT_FALSE(fs::exists(ck / "latest_checkpointed_iteration.txt.tmp"));
  // With room, the same save succeeds and finds no leftovers to warn about or remove.
  const auto again = testing::run_cli(train_flags(2) + " --save " + ck.string() + " --save-interval 2");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output.find("interrupted"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("removed"), std::string::npos) << again.output;
  EXPECT_TRUE(fs::exists(ck / "iter_0000002/metadata.json"));
}

TEST_F(CheckpointIntegrity, SaveFoldersAre0750WhateverTheUmask) {
  for (const char* mask : {"000", "077"}) {
    const fs::path root = *dir_ / (std::string("umask") + mask);
    const auto r = testing::run_command("umask " + std::string(mask) + " && '" + testing::cli_path().string() +
                                        "' " + train_flags(2) + " --save " + (root / "a/b").string() +
                                        " --save-interval 2 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rwx_rx = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec;
    for (const fs::path& p : {root, root / "a", root / "a/b", root / "a/b/iter_0000002",
                              root / "a/b/iter_0000002/mp_rank_00"})
      EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, rwx_rx) << p << " umask " << mask;
    for (const char* f : {"iter_0000002/metadata.json", "iter_0000002/metadata.json.sha256",
                          "iter_0000002/mp_rank_00/model.safetensors", "latest_checkpointed_iteration.txt"})
      EXPECT_EQ(fs::status(root / "a/b" / f).permissions() & fs::perms::all,
                fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read)
          << f << " umask " << mask;
  }
}

TEST_F(CheckpointIntegrity, TrackerProblemsAreClearErrors) {
  const fs::path ck = copy("tracker");
  fs::remove(ck / "latest_checkpointed_iteration.txt");
  // Iteration folders without a tracker: not a silent start from random weights.
  // Training and generation resolve the folder by the same rules (locate_checkpoint).
  for (const auto& r : {resume(ck), generate(ck)})
    EXPECT_FAILS_WITH(r, "has 2 checkpoint folders (iter_0000002 ... iter_0000004)",
                      "but no latest_checkpointed_iteration.txt: pass --ckpt-step 4");
  fs::create_directory(ck / "latest_checkpointed_iteration.txt");
  for (const auto& r : {resume(ck), generate(ck)})
    EXPECT_FAILS_WITH(r, "latest_checkpointed_iteration.txt is not a file");
}

// serve and evaluate read checkpoints through the same verification as generate: an edited
// metadata.json, a flipped byte of the weights or a NaN weight is an error naming the file or
// tensor, the exit status is 1, and nothing is served (the server never binds).
class InferenceCheckpointIntegrity : public CheckpointIntegrity {
 protected:
  static testing::CommandResult serve(const fs::path& ckpt, int seconds = 60) {
    // A server that starts would run until killed: `timeout` ends it (exit 124).
    return testing::run_command("timeout " + std::to_string(seconds) + " '" +
                                testing::cli_path().string() + "' serve " +
                                kModel + "--load " + ckpt.string() + " --port 0 2>&1");
  }
  static testing::CommandResult evaluate(const fs::path& ckpt) {
    const fs::path data = ckpt / "lambada.jsonl";
    testing::write_file(data, "{\"text\": \"1 4 7 10 13 16\"}\n{\"text\": \"2 5 8 11\"}\n");
    return testing::run_cli(std::string("evaluate --task LAMBADA --valid-data ") + data.string() +
                            " " + kModel + "--load " + ckpt.string());
  }
  static void expect_refused(const testing::CommandResult& r, const std::string& says,
                             const std::string& names) {
    EXPECT_FAILS_WITH(r, says, names);
    EXPECT_EQ(r.output.find("serving on"), std::string::npos) << r.output;
  }
};

TEST_F(InferenceCheckpointIntegrity, ServeAndEvaluateLoadTheGoodCheckpoint) {
  const fs::path ck = copy("inference_good");
  const auto e = evaluate(ck);
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("number correct:"), std::string::npos) << e.output;
  // The server comes up (and `timeout` stops it after 5 s).
  const auto s = serve(ck, 5);
  EXPECT_EQ(s.exit_code, 124) << s.output;
  EXPECT_NE(s.output.find("serving on http://127.0.0.1:"), std::string::npos) << s.output;
}

TEST_F(InferenceCheckpointIntegrity, EditedMetadataIsRefused) {
  const fs::path ck = copy("inference_meta");
  const fs::path iter = ck / "iter_0000004";
  std::string text = testing::read_file(iter / "metadata.json");
  const size_t at = text.find("\"num_steps\": 8");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 13] = '9';
  testing::write_file(iter / "metadata.json", text);
  for (const auto& r : {serve(ck), evaluate(ck)})
    expect_refused(r, "metadata.json: SHA-256 checksum mismatch", (iter / "metadata.json").string());
}

TEST_F(InferenceCheckpointIntegrity, AFlippedByteOfTheWeightsIsRefused) {
  const fs::path ck = copy("inference_flip");
  const fs::path file = ck / "iter_0000004/mp_rank_00/model.safetensors";
  std::string bytes = testing::read_file(file);
  bytes[bytes.size() - 9] ^= 0x01;
  testing::write_file(file, bytes);
  for (const auto& r : {serve(ck), evaluate(ck)})
    expect_refused(r, "model.safetensors: SHA-256 checksum mismatch", file.string());
}

TEST_F(InferenceCheckpointIntegrity, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const fs::path ck = copy("inference_nan");
  rewrite_model(ck / "iter_0000004", [](std::map<std::string, Tensor>& t) {
    t.at("decoder.layers.0.mlp.linear_fc1.weight").data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  });
  for (const auto& r : {serve(ck), evaluate(ck)})
    expect_refused(r, "tensor 'decoder.layers.0.mlp.linear_fc1.weight' holds NaN (element 7 of",
                   "model.safetensors");
}

}  // namespace
}  // namespace megatron::training
