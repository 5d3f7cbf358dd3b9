// Generation from tensor- and pipeline-parallel checkpoints without converting them first: a tiny
// GPT's random weights are saved as a single-rank training checkpoint (save_checkpoint), resharded
// with `megatron checkpoint convert`'s library to TP2, PP2 and TP2 x PP2, and each sharded folder
// loaded by load_inference_model (which merges the shards in memory) must generate exactly what
// the single-rank checkpoint generates: the same tokens and bit-identical log-probs, greedy and
// sampled, for a GPT-2-style and a Llama-style model. The vocabulary re-padding (TP2 pads to more rows than TP1) and a corrupted shard are
// covered too.
#include <gtest/gtest.h>

#include <fstream>

#include "inference/checkpoint_weights.h"
#include "inference/generation.h"
#include "inference/model_loader.h"
#include "test_util.h"
#include "tiny_gpt.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;

// Saves `w` as a single-rank training checkpoint (iteration 7) of a model with the NullTokenizer
// of `vocab` tokens padded with `divisor`.
void save_training_checkpoint(const fs::path& dir, const testing::Weights& w, const testing::Config& c,
                              int64_t vocab, int64_t divisor) {
  training::TrainingArgs a;
  a.model = c;  // the architecture too (Llama-style: RMSNorm, SwiGLU, rotary, GQA, untied)
  a.model.seq_length = int(c.max_position_embeddings);
  a.make_vocab_size_divisible_by = divisor;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = vocab;
  training::CheckpointState st;
  st.iteration = 7;
  st.args = training::training_args_to_json(a);
  std::vector<model::Parameter> params(w.size());
  model::ParameterList list;
  const auto specs = training::config_weight_specs(a.model);
  size_t i = 0;
  for (const auto& [name, t] : w) {
    static_cast<model::WeightSpec&>(params[i]) = specs.at(name);
    params[i].value = t;
    list.push_back(&params[i++]);
  }
  training::save_checkpoint(dir, st, list, nullptr);
}

void convert(const fs::path& from, const fs::path& to, int tp, int pp) {
  training::ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.target_pp = pp;
  training::convert_checkpoint(o);
}

InferenceModel load(const fs::path& dir, int64_t vocab, int64_t divisor,
                    const testing::Config& c = testing::gpt2_config()) {
  InferenceModelOptions o;
  o.load = dir.string();
  o.model = c;
  o.make_vocab_size_divisible_by = divisor;
  o.tokenizer.type = "NullTokenizer";
  o.tokenizer.vocab_size = vocab;
  return load_inference_model(o);
}

std::vector<SequenceResult> run(InferenceModel& m, int64_t vocab) {
  std::vector<SequenceRequest> rows(3);
  rows[0].prompt = {1, 2, 3, 4};
  rows[1].prompt = {9, 8};
  rows[2].prompt = {5, 17, 33, 2, 40};
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].tokens_to_generate = 12;
    rows[r].return_logprobs = true;
    rows[r].stop_on_eod = false;
    rows[r].sampling.top_k = r == 2 ? 0 : 1;  // two greedy rows, one sampled
    rows[r].seed = 11;
    rows[r].sequence = r;
  }
  return generate(*m.model, rows, vocab, SpecialTokens{});
}

void expect_same(const std::vector<SequenceResult>& got, const std::vector<SequenceResult>& ref,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t r = 0; r < ref.size(); ++r) {
    EXPECT_EQ(got[r].tokens, ref[r].tokens) << what << " row " << r;
    EXPECT_EQ(got[r].logprobs, ref[r].logprobs) << what << " row " << r;  // bit for bit
    EXPECT_EQ(got[r].generated(), 12) << what;
  }
}

// GPT-2 style (2 layers, h 32, 4 heads, vocab 64) and Llama style (the same sizes with RMSNorm,
// SwiGLU, rotary on half of each head, 2 query groups, no biases, untied output layer).
class ShardedCheckpointGeneration : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardedCheckpointGeneration, TensorAndPipelineShardsGenerateLikeTheSingleRankCheckpoint) {
  megatron::testing::TempDir tmp;
  const bool llama = std::string(GetParam()) == "llama";
  const testing::Config c = llama ? testing::llama_config() : testing::gpt2_config();
  const testing::Weights w = testing::random_weights(c);
  save_training_checkpoint(tmp / "tp1", w, c, 64, 16);
  InferenceModel ref_model = load(tmp / "tp1", 64, 16, c);
  const auto ref = run(ref_model, 64);
  std::vector<std::pair<int, int>> layouts = {{2, 1}, {1, 2}, {2, 2}};
  if (!llama) layouts.push_back({4, 1});  // 2 query groups do not split over 4 ranks
  for (auto [tp, pp] : layouts) {
    const std::string name = "tp" + std::to_string(tp) + "pp" + std::to_string(pp);
    SCOPED_TRACE(name);
    convert(tmp / "tp1", tmp / name, tp, pp);
    char last[32];  // the last rank's folder
    if (pp > 1)
      std::snprintf(last, sizeof last, "mp_rank_%02d_%03d", tp - 1, pp - 1);
    else
      std::snprintf(last, sizeof last, "mp_rank_%02d", tp - 1);
    ASSERT_TRUE(fs::exists(tmp / name / "iter_0000007" / last / "model.safetensors")) << last;
    InferenceModel m = load(tmp / name, 64, 16, c);
    EXPECT_EQ(m.iteration, 7);
    expect_same(run(m, 64), ref, name);
    // The merged tensors are the saved ones, bit for bit.
    const auto merged = CheckpointWeights::open(tmp / name);
    for (const auto& [n, t] : w) {
      const Tensor got = merged.get(n);
      ASSERT_TRUE(got.defined()) << n;
      EXPECT_EQ(got.to_float_vector(), t.to_float_vector()) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, ShardedCheckpointGeneration,
                         ::testing::Values("gpt2", "llama"));

// 60 tokens padded by 64: 64 rows under TP1, 128 under TP2. The TP2 checkpoint's extra rows are
// cut off again when generating (the tokenizer's TP1 padding), which gives the TP1 model.
TEST(ShardedCheckpointGenerationVocabulary, TheVocabularyIsRepaddedForOneRank) {
  megatron::testing::TempDir tmp;
  const testing::Config c = testing::gpt2_config();
  const testing::Weights w = testing::random_weights(c);
  save_training_checkpoint(tmp / "tp1", w, c, 60, 64);
  convert(tmp / "tp1", tmp / "tp2", 2, 1);
  const auto tp2 = training::find_checkpoint(tmp / "tp2", std::nullopt);
  ASSERT_TRUE(tp2.has_value());
  EXPECT_EQ(tp2->state.args["model"]["padded_vocab_size"], 128);
  const Tensor shard1 = training::read_single_rank_model(*tp2, 0).at("embedding.word_embeddings.weight");
  ASSERT_EQ(shard1.size(0), 128);
  const Tensor orig = w.at("embedding.word_embeddings.weight");
  EXPECT_EQ(shard1.narrow(0, 100, 1).to_float_vector(), orig.narrow(0, 63, 1).to_float_vector());
  InferenceModel ref_model = load(tmp / "tp1", 60, 64);
  InferenceModel m = load(tmp / "tp2", 60, 64);
  expect_same(run(m, 60), run(ref_model, 60), "tp2 re-padded");
}

TEST(ShardedCheckpointGenerationErrors, ACorruptedShardIsAnErrorNamingTheFile) {
  megatron::testing::TempDir tmp;
  const testing::Config c = testing::gpt2_config();
  save_training_checkpoint(tmp / "tp1", testing::random_weights(c), c, 64, 16);
  convert(tmp / "tp1", tmp / "tp2", 2, 1);
  const fs::path shard = tmp / "tp2" / "iter_0000007" / "mp_rank_01" / "model.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  try {
    load(tmp / "tp2", 64, 16);
    ADD_FAILURE() << "a corrupted shard must not load";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(shard.string()), std::string::npos) << m;
    EXPECT_NE(m.find("SHA-256"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace megatron::inference
