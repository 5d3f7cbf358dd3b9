// Megatron-LM T5 checkpoints in torch_dist (tests/reference/write_torch_dist_t5.py writes one as
// Megatron-Core's T5Model saves it under TP2: the encoder and decoder blocks each on a layer axis
// of its own depth, the decoder's cross-attention, the relative position biases, the TP-chunked
// head bias under lm_head.output_layer.bias alone, its output_layer alias not saved again): read as a T5 model
// whose merged weights equal the writer's, this run's TP2 shards equal the writer's tensors cut by
// the weights' shard rules, `checkpoint convert` takes it to this build's format and to Megatron's
// .pt with the same weights and writes it back as torch_dist bit for bit as the fixture (read by
// the independent Python reader; under Transformer Engine's names it reads back as the same
// weights), pretrain-t5 --ckpt-format torch_dist saves and resumes bit-exact (tied, and untied with
// the head's weight and its state under lm_head.output_layer only), generate from such a folder equals generate from this
// build's format (one process, and TP 2 under launch), and pretrain-t5 fine-tunes from the fixture
// under TP2 (with DP over the other ranks: np 2 and 4) on the loss curve of the same run on one rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli/sentence_corpus.h"
#include "core/error.h"
#include "parallel_test_util.h"
#include "torch_dist_family_test_util.h"
#include "torch_dist_test_util.h"
#include "model/transformer_config.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const std::string kWriter = "tests/reference/write_torch_dist_t5.py";

const fs::path& fixtures() { return mt::python_fixtures(kWriter); }

// The writer's merged weights under our names.
std::map<std::string, Tensor> reference() { return mt::reference_weights(fixtures() / "t5.ref"); }

TEST(TorchDistT5, ReadsMegatronsT5KeysAsAT5Model) {
  const auto ckpt = training::find_checkpoint(fixtures() / "t5", std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->format, "torch_dist");
  const model::TransformerConfig cfg = training::training_args_from_json(ckpt->state.args).model;
  EXPECT_EQ(cfg.model_family, "t5");
  EXPECT_EQ(cfg.num_layers, 2);       // the encoder's depth
  EXPECT_EQ(cfg.decoder_layers(), 3);  // the decoder's layer axis
  EXPECT_EQ(cfg.position_embedding_type, "relative");
  const std::map<std::string, Tensor> want = reference();
  ASSERT_TRUE(want.count("output_layer.bias") && want.count("decoder.layers.2.cross_attention.linear_kv.weight") &&
              want.count("encoder_relative_pos_emb.relative_attention_bias.weight") &&
              want.count("decoder.layers.1.pre_cross_attn_layernorm.weight"));
  mt::expect_same_weights(training::read_torch_dist_model(*ckpt), want, "merged");

  // This run's TP2 shards, streamed from the chunks, against the reference cut by the shard rules.
  mt::expect_tp_shards(*ckpt, want, 2);
}

TEST(TorchDistT5, ConvertsToOursAndToMegatronsPtWithTheSameWeights) {
  mt::TempDir tmp;
  const fs::path src = fixtures() / "t5";
  auto r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (tmp.path() / "ours").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (tmp.path() / "pt").string() +
                  " --save-format torch --target-tensor-parallel-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::map<std::string, Tensor> want = reference();
  for (const char* which : {"ours", "pt"}) {
    const auto ckpt = training::find_checkpoint(tmp.path() / which, std::nullopt);
    ASSERT_TRUE(ckpt.has_value()) << which;
    const training::MergedCheckpoint m = training::merge_checkpoint(*ckpt, false);
    const model::TransformerConfig cfg = training::training_args_from_json(m.metadata.at("args")).model;
    EXPECT_EQ(cfg.model_family, "t5") << which;
    EXPECT_EQ(cfg.decoder_layers(), 3) << which;
    mt::expect_same_weights(m.model, want, which);
  }
}

TEST(TorchDistT5, WritesWhatAnIndependentReaderReadsAsMegatronsLayout) {
  // The fixture taken to this build's format and written back as torch_dist under TP2: Megatron's
  // keys (the head's bias under lm_head.output_layer only), chunks, shapes and bytes, as the Python
  // reader reads them.
  mt::TempDir tmp;
  auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / "t5").string() + " --save " +
                       (tmp.path() / "ours").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("checkpoint convert --load " + (tmp.path() / "ours").string() + " --save " +
                  (tmp.path() / "td").string() + " --save-format torch_dist --transformer-impl local "
                  "--target-tensor-parallel-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto check = mt::run_command("/usr/bin/python3 " + (mt::source_dir() / kWriter).string() + " check " +
                                     (tmp.path() / "td/iter_0000007").string() + " " +
                                     (fixtures() / "t5/iter_0000007").string() + " 2>&1");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("ok: 40 tensor keys"), std::string::npos) << check.output;
  // Under Transformer Engine's names (the norms fused into linear_qkv and linear_fc1, the decoder's
  // pre_cross_attn_layernorm a module of its own) it reads back as the same weights.
  r = mt::run_cli("checkpoint convert --load " + (tmp.path() / "ours").string() + " --save " +
                  (tmp.path() / "te").string() + " --save-format torch_dist --target-tensor-parallel-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto te = training::find_checkpoint(tmp.path() / "te", std::nullopt);
  ASSERT_TRUE(te.has_value());
  const auto shapes = training::torch_dist_model_shapes(*te);
  EXPECT_TRUE(shapes.count("decoder.layers.1.pre_cross_attn_layernorm.weight"));
  mt::expect_same_weights(training::read_torch_dist_model(*te), reference(), "transformer_engine names");
  // T5 has no pipeline stages here: a torch_dist T5 of two is refused by name.
  r = mt::run_cli("checkpoint convert --load " + (tmp.path() / "ours").string() + " --save " +
                  (tmp.path() / "pp").string() + " --save-format torch_dist --target-pipeline-parallel-size 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("T5"), std::string::npos) << r.output;
}

TEST(TorchDistT5, PretrainT5SavesTorchDistAndResumesBitExact) {
  // 4 iterations in this build's format against 2 saved in torch_dist and 2 resumed from it: the
  // resumed curve continues bit for bit, and the torch_dist folder reads back (as a T5 model,
  // Megatron's keys) as the same weights.
  using namespace training::parallel_test;
  SharedDir dir;
  const std::string ours = dir / "t5_full";
  save_in_format_and_resume(dir, mt::t5_args(dir.path(), 4), "t5", "torch_dist", "dist", [&](const fs::path& it) {
    mt::expect_saved_torch_dist(it, "t5", ours);
  });
  // Untied: the head's own weight and its state under lm_head.output_layer.weight only.
  training::TrainingArgs untied = mt::t5_args(dir.path(), 4);
  untied.model.untie_embeddings_and_output_weights = true;
  const std::string untied_ours = dir / "t5u_full";
  save_in_format_and_resume(dir, untied, "t5u", "torch_dist", "dist", [&](const fs::path& it) {
    mt::expect_saved_torch_dist(it, "t5", untied_ours);
    const auto keys = mt::run_command("/usr/bin/python3 -c \"import sys; sys.path.insert(0, '" +
                                      (mt::source_dir() / "tests/reference").string() +
                                      "'); import read_torch_dist as r; print(sorted(r.read('" + it.string() +
                                      "')[2]))\" 2>&1");
    EXPECT_NE(keys.output.find("'lm_head.output_layer.weight'"), std::string::npos) << keys.output;
    EXPECT_EQ(keys.output.find(" 'output_layer.weight'"), std::string::npos) << keys.output;
    EXPECT_NE(keys.output.find("'optimizer.state.exp_avg.lm_head.output_layer.weight'"), std::string::npos)
        << keys.output;
  });
}

TEST(MpiTorchDistT5, FineTunesUnderTp2OnTheSingleRankCurve) {
  using namespace training::parallel_test;
  SKIP_ON_ONE_RANK();
  SharedDir dir;
  training::TrainingArgs a = mt::t5_args(dir.path(), 4);
  a.load = (fixtures() / "t5").string();
  a.finetune = true;
  const training::TrainingSummary ref = reference_curve(a, dir / "ref");
  ASSERT_EQ(ref.losses.size(), 4u);
  training::TrainingArgs tp2 = a;
  tp2.parallel.tensor_model_parallel_size = 2;
  tp2.save = dir / "tp2";
  tp2.save_interval = 1000;
  const training::TrainingSummary got = training::pretrain(tp2, world());
  expect_same_curve(got, ref, 1e-5, "tp2");
}

// The last JSON line of generate's jsonl output.
std::string json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string line, out;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] == '{') out = line;
  return out;
}

TEST(TorchDistT5, GeneratesFromATorchDistCheckpointAsFromOurs) {
  // pretrain-t5 on a WordPiece corpus saved in torch_dist and in this build's format (the same run
  // twice): generate fills the same spans with the same log-probs from both, and under launch with
  // TP 2 from the torch_dist folder the same greedy tokens.
  mt::TempDir tmp;
  const std::string tok = mt::write_sentence_corpus(tmp.path());
  const std::string model =
      tok + " --vocab-extra-ids 10 --num-layers 2 --decoder-num-layers 2 --hidden-size 32 --num-attention-heads 4"
            " --encoder-seq-length 32 --max-position-embeddings 32 --position-embedding-type relative";
  for (const char* format : {"", " --ckpt-format torch_dist"}) {
    const std::string save = (tmp.path() / (*format ? "td" : "ours")).string();
    const auto r = mt::run_command(
        mt::cli_path().string() + " pretrain-t5" + model + " --decoder-seq-length 16 --micro-batch-size 2"
        " --global-batch-size 4 --lr 1e-3 --train-iters 4 --eval-iters 0 --split 90,10,0 --data-path '" +
        (tmp.path() / "corpus_text_sentence").string() + "' --data-cache-path '" + (tmp.path() / "cache").string() +
        "' --save '" + save + "' --save-interval 4" + format + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  ASSERT_TRUE(fs::exists(tmp.path() / "td/iter_0000004/.metadata"));
  auto generate = [&](const std::string& which, const std::string& how, const std::string& extra = "") {
    const auto r = mt::run_command("timeout 120 " + mt::cli_path().string() + how + " generate --load '" +
                                   (tmp.path() / which).string() + "'" + tok + " --use-checkpoint-args" + extra +
                                   " --prompt 'the cat <extra_id_0> on the mat .' --num-tokens-to-generate 5"
                                   " --return-log-probs --output-format jsonl 2>&1");
    EXPECT_EQ(r.exit_code, 0) << which << how << ": " << r.output;
    return json::parse(json_line(r.output).empty() ? std::string("{}") : json_line(r.output));
  };
  const json ours = generate("ours", " "), td = generate("td", " ");
  ASSERT_TRUE(ours.contains("text")) << ours.dump();
  EXPECT_EQ(td, ours);
  const json tp2 = generate("td", " launch --nproc-per-node 2 --", " --tensor-model-parallel-size 2");
  EXPECT_EQ(tp2.value("text", json()), ours["text"]) << tp2.dump();
}

}  // namespace
}  // namespace megatron
