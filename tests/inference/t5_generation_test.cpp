// T5 generation with the caches (encoder once, the decoder's self-attention KV cache and the
// static cross-attention cache) against recomputing the whole model over the decoder's prefix at
// every step (T5Model::forward_logits, the training forward): the same tokens and log-probs
// within 1e-5, for learned absolute, relative and rotary positions, with encoder inputs of
// different lengths in one batch (padding), rows that finish early (the caches reordered),
// sampled rows and beam search. Also the prompt's sentinels and the filled spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/bert_wordpiece.h"
#include "dataset/bert_test_data.h"
#include "inference/batch_engine.h"
#include "inference/beam_search.h"
#include "inference/generation.h"
#include "inference/t5_engine.h"
#include "inference/t5_generation.h"
#include "model/model_test_util.h"
#include "test_util.h"

namespace megatron::inference {
namespace {

constexpr int32_t kBos = 90, kEos = 91;
constexpr int64_t kVocab = 92;  // real vocabulary; the logits have 96 columns

model::TransformerConfig t5_config(const std::string& positions) {
  model::TransformerConfig c = model::testing::tiny_config();
  c.model_family = "t5";
  c.num_layers = 2;          // encoder
  c.decoder_num_layers = 3;  // decoder
  c.seq_length = 12;
  c.decoder_seq_length = 10;
  c.max_position_embeddings = 20;
  c.position_embedding_type = positions;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 6;  // decoder distances beyond it share the last bucket
  return c;
}

std::unique_ptr<model::T5Model> make_model(const model::TransformerConfig& cfg) {
  model::ModelOptions o;
  o.grad = false;
  auto m = std::make_unique<model::T5Model>(
      cfg, 3, model::TensorParallel::none(), model::ContextParallel::none(),
      model::ChunkPlace{model::PipelineLayout{cfg.num_layers, 1, 1}, 0, 0}, o);
  model::testing::randomise(*m, 11);
  return m;
}

// log_softmax of the last decoder position's logits, the whole model run over the encoder input
// and the decoder's prefix (no cache).
std::vector<double> recomputed_logprobs(model::T5Model& m, const std::vector<int32_t>& input,
                                        const std::vector<int32_t>& prefix) {
  model::Batch b;
  b.encoder_tokens = Tensor::from_vector(input, {1, int64_t(input.size())});
  b.tokens = Tensor::from_vector(prefix, {1, int64_t(prefix.size())});
  const Tensor logits = m.forward_logits(b);
  const int64_t V = logits.size(2);
  const float* row = logits.data<float>() + (int64_t(prefix.size()) - 1) * V;
  double mx = row[0], sum = 0.0;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) out[size_t(v)] = double(row[v]) - mx - std::log(sum);
  return out;
}

std::vector<std::vector<int32_t>> encoder_inputs() {
  std::vector<std::vector<int32_t>> in;
  const Philox rng(5, 0);
  uint64_t k = 0;
  for (int64_t len : {5, 11, 8}) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < len; ++i) ids.push_back(int32_t(1 + rng.u32(k++) % 80));
    in.push_back(ids);
  }
  return in;
}

class T5CachedGeneration : public ::testing::TestWithParam<std::string> {};

TEST_P(T5CachedGeneration, EqualsRecomputingTheDecoderAtEveryStep) {
  const model::TransformerConfig cfg = t5_config(GetParam());
  T5Engine engine(make_model(cfg));
  const auto inputs = encoder_inputs();
  engine.set_encoder_inputs(inputs);
  std::vector<SequenceRequest> rows(3);
  const int64_t lengths[3] = {9, 4, 9};  // row 1 finishes first: the caches drop it
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].prompt = {kBos};
    rows[i].tokens_to_generate = lengths[i];
    rows[i].return_logprobs = true;
    rows[i].sampling.top_k = 1;
  }
  rows[2].sampling.top_k = 0;  // row 2 samples (temperature 1)
  rows[2].seed = 17;
  rows[2].sequence = 2;
  SpecialTokens special;
  special.eod = kEos;
  const auto results = generate(engine, rows, kVocab, special);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = results[i];
    ASSERT_GE(r.tokens.size(), 2u);
    ASSERT_EQ(r.logprobs.size(), r.tokens.size() - 1);
    for (size_t t = 1; t < r.tokens.size(); ++t) {
      const std::vector<int32_t> prefix(r.tokens.begin(), r.tokens.begin() + long(t));
      const std::vector<double> ref = recomputed_logprobs(engine.model(), inputs[i], prefix);
      EXPECT_NEAR(r.logprobs[t - 1], ref[size_t(r.tokens[t])], 1e-5) << "row " << i << " step " << t;
      if (i != 2) {
        const auto best = std::max_element(ref.begin(), ref.begin() + kVocab) - ref.begin();
        EXPECT_EQ(r.tokens[t], best) << "row " << i << " step " << t;
      }
    }
    if (r.finish == FinishReason::Length) {
      EXPECT_EQ(r.generated(), lengths[i]) << "row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Positions, T5CachedGeneration,
                         ::testing::Values("learned_absolute", "relative", "rope"));

// bf16 weights on the CPU: the decoder's self-attention KV cache is bf16 (the bf16 attention
// kernel reads it, with the relative position bias in fp32), and cached greedy decoding follows
// recomputing the whole bf16 model at every step at bf16 tolerance.
TEST(T5CachedGenerationBf16, FollowsRecomputationAtBf16Tolerance) {
  model::TransformerConfig cfg = t5_config("relative");
  cfg.params_dtype = DType::BF16;
  T5Engine engine(make_model(cfg));
  const auto inputs = encoder_inputs();
  engine.set_encoder_inputs(inputs);
  std::vector<SequenceRequest> rows(3);
  for (auto& r : rows) {
    r.prompt = {kBos};
    r.tokens_to_generate = 6;
    r.return_logprobs = true;
    r.sampling.top_k = 1;
  }
  const auto results = generate(engine, rows, kVocab, SpecialTokens{});
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = results[i];
    ASSERT_EQ(r.logprobs.size(), r.tokens.size() - 1);
    for (size_t t = 1; t < r.tokens.size(); ++t) {
      const std::vector<int32_t> prefix(r.tokens.begin(), r.tokens.begin() + long(t));
      const std::vector<double> ref = recomputed_logprobs(engine.model(), inputs[i], prefix);
      EXPECT_NEAR(r.logprobs[t - 1], ref[size_t(r.tokens[t])], 2e-2) << "row " << i << " step " << t;
    }
  }
}

// Continuous batching (the server's BatchEngine): each slot holds its own encoder input, sequences
// join while others decode and a finished one's slot takes the next; every token and log-prob is
// the whole model's over that sequence's encoder input and decoder prefix.
TEST_P(T5CachedGeneration, SlotsDecodeEachSequenceOverItsOwnInput) {
  const model::TransformerConfig cfg = t5_config(GetParam());
  T5Engine engine(make_model(cfg));
  auto inputs = encoder_inputs();
  inputs.push_back({7, 3, 9});
  SpecialTokens special;
  special.eod = kEos;
  BatchEngine batch(engine, kVocab, special, 2);  // two slots for four sequences
  const int64_t lengths[4] = {6, 3, 5, 4};
  std::map<uint64_t, SequenceResult> results;
  size_t next = 0;
  while (results.size() < inputs.size()) {
    while (next < inputs.size() && batch.free_slots() > 0) {
      SequenceRequest r;
      r.prompt = {kBos};
      r.encoder_input = inputs[next];
      r.tokens_to_generate = lengths[next];
      r.return_logprobs = true;
      r.sampling.top_k = 1;
      batch.admit(std::move(r), next, int64_t(next));
      ++next;
    }
    for (auto& f : batch.step()) results.emplace(f.id, std::move(f.result));
  }
  for (uint64_t i = 0; i < inputs.size(); ++i) {
    const auto& r = results.at(i);
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.logprobs.size(), r.tokens.size() - 1);
    for (size_t t = 1; t < r.tokens.size(); ++t) {
      const std::vector<int32_t> prefix(r.tokens.begin(), r.tokens.begin() + long(t));
      const std::vector<double> ref = recomputed_logprobs(engine.model(), inputs[i], prefix);
      EXPECT_NEAR(r.logprobs[t - 1], ref[size_t(r.tokens[t])], 1e-5) << "sequence " << i << " step " << t;
      const auto best = std::max_element(ref.begin(), ref.begin() + kVocab) - ref.begin();
      EXPECT_EQ(r.tokens[t], best) << "sequence " << i << " step " << t;
    }
  }
  // A sequence without an encoder input is refused before it takes a slot.
  SequenceRequest bare;
  bare.prompt = {kBos};
  bare.tokens_to_generate = 2;
  try {
    batch.admit(std::move(bare), 9, 4);
    ADD_FAILURE() << "a T5 sequence without an encoder input was admitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 4 has no encoder input"), std::string::npos) << e.what();
  }
  EXPECT_EQ(batch.free_slots(), 2);
}

// Beam search reads one encoder input in every beam; the best hypothesis' score is its
// recomputed log-prob over its length (length penalty 1).
TEST(T5BeamSearch, ScoresAreRecomputedLogProbs) {
  const model::TransformerConfig cfg = t5_config("relative");
  T5Engine engine(make_model(cfg));
  const auto input = encoder_inputs()[1];
  engine.set_encoder_inputs({input});
  BeamSearchRequest req;
  req.prompt = {kBos};
  req.tokens_to_generate = 5;
  req.beam_width = 3;
  req.stop_token = kEos;
  const auto hyps = beam_search(engine, req, kVocab);
  ASSERT_FALSE(hyps.empty());
  for (const auto& h : hyps) {
    double sum = 0.0;
    for (size_t t = 1; t < h.tokens.size(); ++t) {
      const std::vector<int32_t> prefix(h.tokens.begin(), h.tokens.begin() + long(t));
      sum += recomputed_logprobs(engine.model(), input, prefix)[size_t(h.tokens[t])];
    }
    ASSERT_EQ(h.tokens.size(), 6u);  // no stop token within 5 steps on this model
    EXPECT_NEAR(h.score, sum / 5.0, 1e-5);
  }
}

TEST(T5Engine, ClearErrors) {
  T5Engine engine(make_model(t5_config("learned_absolute")));
  auto fails_with = [](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails_with([&] { engine.start(1, 4); }, "set the encoder inputs");
  fails_with([&] { engine.set_encoder_inputs({{1, 2}, {}}); }, "encoder input 1 has no tokens");
  fails_with([&] { engine.set_encoder_inputs({{1, 200}}); }, "outside the vocabulary");
  fails_with([&] { engine.set_encoder_inputs({std::vector<int32_t>(21, 1)}); },
             "--max-position-embeddings 20");
  engine.set_encoder_inputs({{1, 2}, {3}});
  fails_with([&] { engine.start(3, 4); }, "3 rows but 2 encoder inputs");
  fails_with([&] { engine.start(2, 21); }, "exceeds max_position_embeddings 20");
}

struct WordPiece {
  megatron::testing::TempDir dir;
  std::unique_ptr<data::BertWordPieceTokenizer> tok;
  WordPiece() {
    megatron::testing::write_bert_vocab(dir / "vocab.txt");
    tok = std::make_unique<data::BertWordPieceTokenizer>((dir / "vocab.txt").string(), true, 4);
  }
};

TEST(T5Prompt, SentinelsAreTheExtraIds) {
  WordPiece wp;
  const auto& s = wp.tok->extra_ids();
  ASSERT_EQ(s.size(), 4u);
  const auto ids = encode_t5_prompt(*wp.tok, "w1 w2p <extra_id_0> w3 w4<extra_id_1>", 1);
  std::vector<int32_t> want = wp.tok->encode("w1 w2p");
  want.push_back(s[0]);
  for (int32_t t : wp.tok->encode("w3 w4")) want.push_back(t);
  want.push_back(s[1]);
  EXPECT_EQ(ids, want);
  try {
    encode_t5_prompt(*wp.tok, "a <extra_id_4> b", 3);
    ADD_FAILURE() << "no error for a sentinel the tokenizer lacks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 3 has <extra_id_4> but the tokenizer has 4 "
                                         "sentinels (--vocab-extra-ids 4)"),
              std::string::npos) << e.what();
  }
  data::NullTokenizer null(100);
  EXPECT_THROW(encode_t5_prompt(null, "1 2", 1), Error);
}

TEST(T5Prompt, SpansGoBackIntoThePrompt) {
  WordPiece wp;
  const auto& s = wp.tok->extra_ids();
  const auto input = encode_t5_prompt(*wp.tok, "w1 <extra_id_0> w2 w3 <extra_id_1> w4", 1);
  std::vector<int32_t> out = {s[0]};
  for (int32_t t : wp.tok->encode("w5")) out.push_back(t);
  out.push_back(s[1]);
  for (int32_t t : wp.tok->encode("w6 w7")) out.push_back(t);
  out.push_back(*wp.tok->eos());
  const T5Output o = read_t5_output(*wp.tok, input, out);
  EXPECT_EQ(o.filled, "w1 [w5] w2 w3 [w6 w7] w4");
  EXPECT_EQ(o.text, "<extra_id_0> w5 <extra_id_1> w6 w7");
  ASSERT_EQ(o.spans.size(), 2u);
  EXPECT_EQ(wp.tok->decode(o.spans.at(1)), "w6 w7");
  // A sentinel the decoder did not write stays in the prompt.
  const T5Output partial = read_t5_output(*wp.tok, input, std::vector<int32_t>(out.begin(), out.begin() + 2));
  EXPECT_EQ(partial.filled, "w1 [w5] w2 w3 <extra_id_1> w4");
}

}  // namespace
}  // namespace megatron::inference
