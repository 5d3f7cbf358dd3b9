// Megatron-LM BERT checkpoints in torch_dist (tests/reference/write_torch_dist_bert.py writes one
// as Megatron-Core's BertModel saves it under TP2 x PP2: the encoder block's stacked layers, the
// tokentype embedding, lm_head, the TP-chunked output bias, pooler and binary head): read as a
// BERT model whose merged weights equal the writer's, this run's TP2 shards equal the writer's
// tensors cut by the weights' shard rules, `checkpoint convert` takes it to this build's format and
// to Megatron's .pt and back with the same weights and writes it back as torch_dist bit for bit
// as the fixture (read by the independent Python reader), pretrain-bert --ckpt-format torch_dist
// saves and resumes bit-exact, and pretrain-bert fine-tunes from the fixture under TP2 (with DP
// over the other ranks: np 2 and 4) on the loss curve of the same run on one rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

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

const fs::path& fixtures() { return mt::python_fixtures("tests/reference/write_torch_dist_bert.py"); }

// The writer's merged weights under our names.
std::map<std::string, Tensor> reference() { return mt::reference_weights(fixtures() / "bert.ref"); }

TEST(TorchDistBert, ReadsMegatronsBertKeysAsABertModel) {
  const auto ckpt = training::find_checkpoint(fixtures() / "bert", std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->format, "torch_dist");
  const model::TransformerConfig cfg = training::training_args_from_json(ckpt->state.args).model;
  EXPECT_EQ(cfg.model_family, "bert");
  EXPECT_TRUE(cfg.bert_binary_head);
  EXPECT_EQ(cfg.num_layers, 4);
  const std::map<std::string, Tensor> want = reference();
  ASSERT_TRUE(want.count("embedding.tokentype_embeddings.weight") && want.count("output_layer.bias") &&
              want.count("binary_head.weight") && want.count("encoder.layers.3.self_attention.linear_qkv.weight"));
  mt::expect_same_weights(training::read_torch_dist_model(*ckpt), want, "merged");

  // This run's TP2 shards, streamed from the chunks, against the reference cut by the shard rules.
  const auto specs = training::checkpoint_weight_specs(*ckpt, json());
  const Tensor& bias = want.at("output_layer.bias");
  EXPECT_EQ(training::split_shard(bias, training::shard_rule(specs.at("output_layer.bias")), 0, 2).size(0) * 2,
            bias.size(0));
  mt::expect_tp_shards(*ckpt, want, 2);
}

TEST(TorchDistBert, ConvertsToOursAndToMegatronsPtWithTheSameWeights) {
  mt::TempDir tmp;
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 107";
  const fs::path src = fixtures() / "bert";
  auto r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (tmp.path() / "ours").string() + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (tmp.path() / "pt").string() +
                  " --save-format torch --target-tensor-parallel-size 2" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::map<std::string, Tensor> want = reference();
  for (const char* which : {"ours", "pt"}) {
    const auto ckpt = training::find_checkpoint(tmp.path() / which, std::nullopt);
    ASSERT_TRUE(ckpt.has_value()) << which;
    const training::MergedCheckpoint m = training::merge_checkpoint(*ckpt, false);
    EXPECT_EQ(training::training_args_from_json(m.metadata.at("args")).model.model_family, "bert") << which;
    std::map<std::string, Tensor> got = m.model;
    got.erase("output_layer.weight");  // tied: a copy of the word embedding in some formats
    mt::expect_same_weights(got, want, which);
  }
}

TEST(TorchDistBert, WritesWhatAnIndependentReaderReadsAsMegatronsLayout) {
  // The fixture taken to this build's format and written back as torch_dist under the same
  // layout: Megatron's keys, chunks, shapes and bytes, as the Python reader reads them.
  mt::TempDir tmp;
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 107";
  auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / "bert").string() + " --save " +
                       (tmp.path() / "ours").string() + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mt::run_cli("checkpoint convert --load " + (tmp.path() / "ours").string() + " --save " +
                  (tmp.path() / "td").string() + " --save-format torch_dist --transformer-impl local "
                  "--target-tensor-parallel-size 2 --target-pipeline-parallel-size 2" + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto check = mt::run_command("/usr/bin/python3 " +
                                     (mt::source_dir() / "tests/reference/write_torch_dist_bert.py").string() +
                                     " check " + (tmp.path() / "td/iter_0000007").string() + " " +
                                     (fixtures() / "bert/iter_0000007").string() + " 2>&1");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("ok: 26 tensor keys"), std::string::npos) << check.output;
}

TEST(TorchDistBert, PretrainBertSavesTorchDistAndResumesBitExact) {
  // 4 iterations in this build's format against 2 saved in torch_dist and 2 resumed from it: the
  // resumed curve (losses, grad norms, the sentence-order loss) continues bit for bit, and the
  // torch_dist folder reads back (as a BERT model, Megatron's keys) as the same weights.
  using namespace training::parallel_test;
  mt::BertRun run;
  const std::string ours = run.dir / "bert_full";
  save_in_format_and_resume(run.dir, run.args(4), "bert", "torch_dist", "dist", [&](const fs::path& it) {
    mt::expect_saved_torch_dist(it, "bert", ours);
  });
}

TEST(MpiTorchDistBert, FineTunesUnderTp2OnTheSingleRankCurve) {
  using namespace training::parallel_test;
  SKIP_ON_ONE_RANK();
  mt::BertRun run;
  training::TrainingArgs a = run.args(4);
  a.load = (fixtures() / "bert").string();
  a.finetune = true;
  const training::TrainingSummary ref = reference_curve(a, run.dir / "ref");
  ASSERT_EQ(ref.losses.size(), 4u);
  training::TrainingArgs tp2 = a;
  tp2.parallel.tensor_model_parallel_size = 2;
  tp2.save = run.dir / "tp2";
  tp2.save_interval = 1000;
  const training::TrainingSummary got = training::pretrain(tp2, world());
  expect_same_curve(got, ref, 1e-5, "tp2");
}

}  // namespace
}  // namespace megatron
