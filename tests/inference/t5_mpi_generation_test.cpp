// T5 generation on tensor-parallel ranks (run by the mpi ctest runs: every rank of mpirun -np N
// runs it, N the tensor-parallel size): a tiny T5's random weights saved as a single-rank
// checkpoint and resharded to TP N by `checkpoint convert`'s library; each rank loads its own
// shard (load_t5_model) and all ranks run the same generation. The tokens equal, and the
// log-probs are within 1e-5 of, the whole model's on one process (every rank loads it too):
// greedy and sampled rows of encoder inputs of different lengths, and beam search.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "dataset/bert_test_data.h"
#include "inference/beam_search.h"
#include "inference/generation.h"
#include "inference/t5_generation.h"
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

Generated run(T5Inference& loaded) {
  const data::Tokenizer& tok = *loaded.tokenizer;
  const int32_t bos = *tok.bos();
  std::vector<std::vector<int32_t>> inputs;
  for (const char* p : {"w1 w2 <extra_id_0> w7 w8 w9", "w3 <extra_id_0> w4 ##p1 w5 <extra_id_1> w6 w10 w11",
                        "<extra_id_0> w12"})
    inputs.push_back(encode_t5_prompt(tok, p, 1));
  loaded.model->set_encoder_inputs(inputs);
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
  g.rows = generate(*loaded.model, rows, tok.vocab_size(), SpecialTokens::from_tokenizer(tok));
  BeamSearchRequest beam;
  beam.prompt = {bos};
  beam.encoder_input = inputs[1];
  beam.tokens_to_generate = 4;
  beam.beam_width = 2;
  beam.stop_token = *tok.eos();
  g.beams = beam_search(*loaded.model, beam, tok.vocab_size());
  return g;
}

TEST(MpiT5Generation, TensorParallelRanksGenerateWhatOneProcessGenerates) {
  const auto world = world_communicator();
  const int tp = world->size();
  ASSERT_EQ(t5_config().num_attention_heads % tp, 0) << "run with 1, 2 or 4 ranks";
  // Rank 0's temporary folder for all ranks.
  std::unique_ptr<megatron::testing::TempDir> tmp;
  std::vector<std::string> where;
  if (world->rank() == 0) {
    tmp = std::make_unique<megatron::testing::TempDir>();
    where = {tmp->path().string()};
    write_checkpoints(tmp->path(), tp);
  }
  broadcast_lines(*world, where);
  ASSERT_EQ(where.size(), 1u);
  const fs::path dir = where[0];

  T5Inference whole = load_t5_model(options(dir, "whole", 1));
  EXPECT_FALSE(whole.group);
  const Generated want = run(whole);
  T5Inference shards = load_t5_model(options(dir, str("tp", tp), tp));
  EXPECT_EQ(bool(shards.group), tp > 1);
  EXPECT_EQ(shards.reports, world->rank() == 0);
  const Generated got = run(shards);

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
  world->barrier();  // rank 0 removes the folder after every rank has read it
}

}  // namespace
}  // namespace megatron::inference
