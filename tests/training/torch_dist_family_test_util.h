// The BERT and T5 runs the torch_dist family tests train: a BERT model on a small WordPiece
// sentence corpus (BertRun), and the T5 model of tests/reference/write_torch_dist_t5.py's fixture on
// mock data (t5_args); and the checks of the distributed optimizer's dp_reshardable state of such
// models: a fixture's state merged against its writer's values, a folder we wrote against the
// buckets of Megatron-Core's module trees (tests/reference/torch_dist_tree_buckets.py), and a
// resume under another layout.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "dataset/bert_test_data.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::testing {

// The BERT training data in a folder every rank sees (sentence-split, 107-token vocabulary), and
// the fixture's model (4 layers, hidden 32, 4 heads, 32 positions, vocabulary padded to 128)
// trained on it for `iters` iterations.
struct BertRun {
  training::parallel_test::SharedDir dir;
  BertRun() {
    if (training::parallel_test::world()->rank() == 0) {
      write_bert_vocab(dir / "vocab.txt");
      SentenceDataOptions o;
      o.documents = 200;
      o.long_sentence_rate = 0;
      o.max_sentence_length = 12;
      write_sentence_dataset(dir / "sentences", o);
    }
    training::parallel_test::world()->barrier();
  }
  training::TrainingArgs args(int64_t iters) const {
    training::TrainingArgs a = training::parallel_test::tiny_training_args(32, dir / "sentences", dir / "cache", iters);
    a.model.num_layers = 4;
    a.model.model_family = "bert";
    a.model.attention_mask_type = "bidirectional";
    a.model.bert_binary_head = true;
    a.make_vocab_size_divisible_by = 32;
    a.tokenizer.type = "BertWordPieceLowerCase";
    a.tokenizer.vocab_file = dir / "vocab.txt";
    return a;
  }
};

inline training::TrainingArgs t5_args(const std::filesystem::path& dir, int64_t iters) {
  training::TrainingArgs a = training::parallel_test::tiny_gpt_args(dir, iters);
  a.data.data_path.clear();
  a.mock_data = true;
  a.model.model_family = "t5";
  a.model.num_layers = 2;
  a.model.decoder_num_layers = 3;
  a.model.ffn_hidden_size = 64;
  a.model.seq_length = 12;
  a.model.decoder_seq_length = 8;
  a.model.max_position_embeddings = 12;
  a.model.position_embedding_type = "relative";
  a.model.relative_attention_num_buckets = 8;
  a.model.relative_attention_max_distance = 6;
  a.tokenizer.vocab_size = 60;
  a.tokenizer.vocab_extra_ids = 10;
  a.make_vocab_size_divisible_by = 16;  // the fixture's 64 rows under TP 1 and 2
  return a;
}

// A dp_reshardable fixture merged to one rank: its model and optimizer state equal the writer's
// values bit for bit (`ref`: optimizer.json's kinds, each over config.json's params in order, as
// float32 in optimizer.bin; "param", an fp32 model's main weights, against the merged weights).
inline void expect_writers_optimizer_state(const std::filesystem::path& folder, const std::filesystem::path& ref) {
  const nlohmann::json cfg = nlohmann::json::parse(read_file(ref / "config.json"));
  const nlohmann::json opt = nlohmann::json::parse(read_file(ref / "optimizer.json"));
  const std::string raw = read_file(ref / "optimizer.bin");
  const auto ckpt = training::find_checkpoint(folder, std::nullopt);
  ASSERT_TRUE(ckpt.has_value()) << folder;
  EXPECT_TRUE(ckpt->parallel.distributed_optimizer);
  EXPECT_EQ(ckpt->parallel.data_parallel_size, 2);
  const training::MergedCheckpoint m = training::merge_checkpoint(*ckpt, true);
  EXPECT_EQ(m.optimizer_step, opt["step"].get<int64_t>());
  size_t at = 0, compared = 0;
  for (const nlohmann::json& kind : opt["kinds"])
    for (const nlohmann::json& p : cfg["params"]) {
      const std::string name = p["name"], k = kind;
      int64_t n = 1;
      for (const nlohmann::json& d : p["shape"]) n *= d.get<int64_t>();
      ASSERT_LE((at + size_t(n)) * 4, raw.size());
      const float* want = reinterpret_cast<const float*>(raw.data()) + at;
      at += size_t(n);
      const auto kind_it = m.optimizer.find(k);
      const Tensor* got = k == "param" ? (m.model.count(name) ? &m.model.at(name) : nullptr)
                          : kind_it != m.optimizer.end() && kind_it->second.count(name) ? &kind_it->second.at(name)
                                                                                      : nullptr;
      ASSERT_NE(got, nullptr) << k << " " << name;
      const Tensor g = got->to(DType::F32).contiguous();
      ASSERT_EQ(g.numel(), n) << k << " " << name;
      EXPECT_EQ(std::memcmp(g.data<float>(), want, size_t(n) * 4), 0) << k << " " << name;
      ++compared;
    }
  EXPECT_EQ(at * 4, raw.size());
  EXPECT_GT(compared, 0u);
}

// `/usr/bin/python3 tests/reference/torch_dist_tree_buckets.py check-dp IT`: the dp_reshardable
// buckets we wrote in iteration folder `it` are those Megatron-Core's module trees lay out.
inline void expect_megatrons_buckets(const std::filesystem::path& it) {
  const auto r = run_command("/usr/bin/python3 " + (source_dir() / "tests/reference/torch_dist_tree_buckets.py").string() +
                             " check-dp " + it.string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ok: "), std::string::npos) << r.output;
}

// Rank 0 (the caller's): one rank with the plain optimizer resumes from iteration 2 of the
// torch_dist folder `dist` exactly as from iteration 2 of this build's format in `ours` (converted
// to one rank first when `a` ran under several model-parallel ranks), `a` giving the model and data.
inline void expect_same_resume_on_one_rank(training::TrainingArgs a, const std::filesystem::path& dist,
                                           const std::filesystem::path& ours, const std::filesystem::path& tmp) {
  using namespace training::parallel_test;
  const bool convert = a.parallel.tensor_model_parallel_size > 1 || a.parallel.pipeline_model_parallel_size > 1;
  a.parallel = training::TrainingArgs().parallel;
  a.save = "";
  a.save_interval = 1000;
  a.exit_interval = 0;
  a.ckpt_format = training::TrainingArgs().ckpt_format;
  a.ckpt_step = 2;
  a.load = dist;
  const training::TrainingSummary from_dist = run_single(a);
  a.load = ours;
  if (convert) {
    training::ConvertOptions o;
    o.load = ours;
    o.save = tmp;
    o.ckpt_step = 2;
    training::convert_checkpoint(o);
    a.load = tmp;
  }
  const training::TrainingSummary from_ours = run_single(a);
  EXPECT_EQ(from_dist.start_iteration, 2);
  EXPECT_EQ(from_dist.losses.size(), 2u);
  EXPECT_EQ(from_dist.losses, from_ours.losses);
  EXPECT_EQ(from_dist.grad_norms, from_ours.grad_norms);
}

// `a` with --use-distributed-optimizer (in the order of its --transformer-impl) saves 2 iterations
// as torch_dist and resumes for 2 more on the uninterrupted curve (save_in_format_and_resume); the
// buckets are Megatron's (expect_megatrons_buckets); saved by several ranks, rank 0 then resumes on
// one rank as from our format.
inline void save_dp_and_resume(const training::parallel_test::SharedDir& dir, training::TrainingArgs a,
                               const std::string& name) {
  using namespace training::parallel_test;
  a.parallel.use_distributed_optimizer = true;
  const FormatResume r = save_in_format_and_resume(dir, a, name, "torch_dist", "dist", [&](const std::filesystem::path& it) {
    expect_megatrons_buckets(it);
  });
  if (world()->size() > 1 && world()->rank() == 0)
    expect_same_resume_on_one_rank(a, r.saved.save, dir / (name + "_full"), dir / (name + "_tp1"));
  world()->barrier();
}

}  // namespace megatron::testing
