// T5 generation on tensor-parallel ranks (run by the mpi ctest runs: every rank of mpirun -np N
// runs it, N the tensor-parallel size): a tiny T5's random weights saved as a single-rank
// checkpoint and resharded to TP N by `checkpoint convert`'s library; each rank loads its own
// shard (load_t5_model) and all ranks run the same generation. The tokens equal, and the
// log-probs are within 1e-5 of, the whole model's on one process (every rank loads it too):
// greedy and sampled rows of encoder inputs of different lengths, and beam search. And the
// leader and followers of `serve` (t5_leader.h): the leader's calls run on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "dataset/bert_test_data.h"
#include "inference/beam_search.h"
#include "inference/generation.h"
#include "inference/distributed_engine.h"
#include "inference/t5_generation.h"
#include "inference/t5_leader.h"
#include "model/model_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/trainer.h"

namespace megatron::inference {
namespace {

namespace fs = std::filesystem;

model::TransformerConfig t5_config() {
  model::TransformerConfig c = model::testing::tiny_config();
  c.model_family = "t5";
  c.decoder_num_layers = 1;
  c.seq_length = 16;
  c.decoder_seq_length = 10;
  c.position_embedding_type = "relative";
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 6;
  return c;
}

InferenceModelOptions options(const fs::path& dir, const std::string& name, int tp) {
  InferenceModelOptions o;
  o.load = (dir / name).string();
  o.model = t5_config();
  o.make_vocab_size_divisible_by = 8;
  o.tokenizer.type = "BertWordPieceLowerCase";
  o.tokenizer.vocab_file = (dir / "vocab.txt").string();
  o.tokenizer.vocab_extra_ids = 4;
  o.tensor_model_parallel_size = tp;
  return o;
}

// Rank 0 writes the vocabulary and the checkpoints: random weights as "whole", resharded to "tpN".
void write_checkpoints(const fs::path& dir, int tp) {
  megatron::testing::write_bert_vocab(dir / "vocab.txt");
  const InferenceModelOptions o = options(dir, "whole", 1);
  const auto tok = data::build_tokenizer(o.tokenizer);
  training::TrainingArgs a;
  a.model = o.model;
  a.model.padded_vocab_size = data::padded_vocab_size(tok->vocab_size(), o.make_vocab_size_divisible_by, 1);
  a.make_vocab_size_divisible_by = o.make_vocab_size_divisible_by;
  a.tokenizer = o.tokenizer;
  model::T5Model m(a.model, 0, model::TensorParallel::none());
  model::testing::randomise(m, 7);
  training::CheckpointState st;
  st.iteration = 3;
  st.args = training::training_args_to_json(a);
  training::save_checkpoint(dir / "whole", st, m.parameters(), nullptr);
  training::ConvertOptions c;
  c.load = dir / "whole";
  c.save = dir / str("tp", tp);
  c.target_tp = tp;
  training::convert_checkpoint(c);
}

struct Generated {
  std::vector<SequenceResult> rows;
  std::vector<BeamHypothesis> beams;
};

std::vector<std::vector<int32_t>> prompts(const data::Tokenizer& tok) {
  std::vector<std::vector<int32_t>> inputs;
  for (const char* p : {"w1 w2 <extra_id_0> w7 w8 w9", "w3 <extra_id_0> w4 ##p1 w5 <extra_id_1> w6 w10 w11",
                        "<extra_id_0> w12"})
    inputs.push_back(encode_t5_prompt(tok, p, 1));
  return inputs;
}

Generated run(LanguageModel& model, const data::Tokenizer& tok) {
  const int32_t bos = *tok.bos();
  const std::vector<std::vector<int32_t>> inputs = prompts(tok);
  model.set_encoder_inputs(inputs);
  std::vector<SequenceRequest> rows(inputs.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].prompt = {bos};
    rows[i].tokens_to_generate = 6;
    rows[i].return_logprobs = true;
    rows[i].sampling.top_k = i == 2 ? 0 : 1;  // row 2 samples
    rows[i].seed = 5;
    rows[i].sequence = i;
  }
  Generated g;
  g.rows = generate(model, rows, tok.vocab_size(), SpecialTokens::from_tokenizer(tok));
  BeamSearchRequest beam;
  beam.prompt = {bos};
  beam.encoder_input = inputs[1];
  beam.tokens_to_generate = 4;
  beam.beam_width = 2;
  beam.stop_token = *tok.eos();
  g.beams = beam_search(model, beam, tok.vocab_size());
  return g;
}

// The checkpoints in rank 0's temporary folder (`tmp` on rank 0), read by every rank.
fs::path shared_checkpoints(Communicator& world, std::unique_ptr<megatron::testing::TempDir>& tmp) {
  std::vector<std::string> where;
  if (world.rank() == 0) {
    tmp = std::make_unique<megatron::testing::TempDir>();
    where = {tmp->path().string()};
    write_checkpoints(tmp->path(), world.size());
  }
  broadcast_lines(world, where);
  MG_CHECK(where.size() == 1, "no checkpoint folder from rank 0");
  return where[0];
}

void expect_same(const Generated& got, const Generated& want) {
  ASSERT_EQ(got.rows.size(), want.rows.size());
  for (size_t i = 0; i < want.rows.size(); ++i) {
    EXPECT_EQ(got.rows[i].tokens, want.rows[i].tokens) << "row " << i;
    ASSERT_EQ(got.rows[i].logprobs.size(), want.rows[i].logprobs.size()) << "row " << i;
    for (size_t j = 0; j < want.rows[i].logprobs.size(); ++j)
      EXPECT_NEAR(got.rows[i].logprobs[j], want.rows[i].logprobs[j], 1e-5) << "row " << i;
  }
  ASSERT_EQ(got.beams.size(), want.beams.size());
  for (size_t k = 0; k < want.beams.size(); ++k) {
    EXPECT_EQ(got.beams[k].tokens, want.beams[k].tokens) << "beam " << k;
    EXPECT_NEAR(got.beams[k].score, want.beams[k].score, 1e-5) << "beam " << k;
  }
}

TEST(MpiT5Generation, TensorParallelRanksGenerateWhatOneProcessGenerates) {
  const auto world = world_communicator();
  const int tp = world->size();
  ASSERT_EQ(t5_config().num_attention_heads % tp, 0) << "run with 1, 2 or 4 ranks";
  std::unique_ptr<megatron::testing::TempDir> tmp;
  const fs::path dir = shared_checkpoints(*world, tmp);

  T5Inference whole = load_t5_model(options(dir, "whole", 1));
  EXPECT_FALSE(whole.group);
  const Generated want = run(*whole.model, *whole.tokenizer);
  T5Inference shards = load_t5_model(options(dir, str("tp", tp), tp));
  EXPECT_EQ(bool(shards.group), tp > 1);
  EXPECT_EQ(shards.reports, world->rank() == 0);
  expect_same(run(*shards.model, *shards.tokenizer), want);
  world->barrier();  // rank 0 removes the folder after every rank has read it
}

// Continuous batching as the server runs it: slots started, given their encoder inputs one by
// one, fed side by side at their own positions, one cleared and reused, the cache grown. The
// logits of every call, [calls, 1, V].
std::vector<Tensor> run_slots(LanguageModel& model, const data::Tokenizer& tok) {
  const int32_t bos = *tok.bos();
  const auto inputs = prompts(tok);
  std::vector<Tensor> out;
  auto step = [&](std::vector<int64_t> slots, std::vector<int32_t> tokens) {
    const std::vector<int64_t> counts(slots.size(), 1);
    out.push_back(model.forward_slots(slots, tokens, counts, false).contiguous());
  };
  model.start_slots(2, 4);
  model.set_slot_encoder_input(0, inputs[0]);
  step({0}, {bos});
  model.set_slot_encoder_input(1, inputs[1]);
  step({0, 1}, {7, bos});
  model.grow_slots(8);
  step({1, 0}, {9, 11});
  model.clear_slot(0);
  model.set_slot_encoder_input(0, inputs[2]);
  step({0, 1}, {bos, 12});
  return out;
}

// `megatron serve` on tensor-parallel ranks: rank 0 leads through a T5LeaderEngine (the server's
// calls: lockstep generation, beam search, cache slots), the other ranks follow its calls on their
// shards until it finishes. The leader's results equal the whole model's on one process; a call
// the leader refuses (a token outside the vocabulary) reaches no follower, and the ranks stay in
// step after it.
TEST(MpiT5Generation, FollowersRunTheLeadersCalls) {
  const auto world = world_communicator();
  const int tp = world->size();
  std::unique_ptr<megatron::testing::TempDir> tmp;
  const fs::path dir = shared_checkpoints(*world, tmp);
  T5Inference whole = load_t5_model(options(dir, "whole", 1));
  const Generated want = run(*whole.model, *whole.tokenizer);
  const std::vector<Tensor> want_slots = run_slots(*whole.model, *whole.tokenizer);

  T5Inference shards = load_t5_model(options(dir, str("tp", tp), tp));
  EXPECT_EQ(bool(shards.group), tp > 1);
  // One rank: a leader without followers, over the world of one.
  const std::shared_ptr<Communicator> group = shards.group ? shards.group : world;
  if (group->rank() != 0) {
    follow_leader(*shards.model, *group);  // returns when the leader finishes
  } else {
    T5LeaderEngine leader(std::move(shards.model), group);
    const int32_t outside = int32_t(leader.vocab_size());
    EXPECT_THROW(leader.set_encoder_inputs({{3, outside}}), megatron::Error);
    expect_same(run(leader, *shards.tokenizer), want);
    const std::vector<Tensor> got_slots = run_slots(leader, *shards.tokenizer);
    ASSERT_EQ(got_slots.size(), want_slots.size());
    for (size_t i = 0; i < want_slots.size(); ++i) {
      ASSERT_EQ(got_slots[i].shape(), want_slots[i].shape()) << "call " << i;
      const float* g = got_slots[i].data<float>();
      const float* w = want_slots[i].data<float>();
      for (int64_t j = 0; j < want_slots[i].numel(); ++j)
        ASSERT_NEAR(g[j], w[j], 1e-4) << "call " << i << " logit " << j;
    }
    EXPECT_THROW(leader.forward_slots(std::vector<int64_t>{1}, std::vector<int32_t>{outside},
                                      std::vector<int64_t>{1}, false),
                 megatron::Error);
    leader.finish();
  }
  world->barrier();
}

}  // namespace
}  // namespace megatron::inference
