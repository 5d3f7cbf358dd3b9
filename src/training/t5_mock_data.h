// --mock-data for pretrain-t5: synthetic span-corruption samples in the shape of Megatron's T5
// batch (T5MaskedWordPieceDataset's keys, pretrain_t5.py's get_batch), made from no files, so
// the encoder-decoder trains end to end before real data is at hand. It is not Megatron's data
// (Megatron-LM has no mock T5 dataset): each sample is an arithmetic progression of ordinary
// token ids (random start and step, deterministic per seed and sample index) in which spans of
// 1 to 3 tokens, each started with probability --mask-prob, are replaced in the encoder's input
// by the sentinels <extra_id_0>, <extra_id_1>, ... (the last --vocab-extra-ids ids of the
// vocabulary); the decoder reads BOS then each sentinel and its span, and predicts each sentinel
// and its span then EOS. Padding: the tokenizer's pad id, encoder mask 0, labels -1 outside the
// loss mask.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "data/tokenizer.h"
#include "training/training_data.h"

namespace megatron::training {

struct T5MockConfig {
  int64_t encoder_seq_length = 0, decoder_seq_length = 0;
  int64_t vocab_size = 0;  // the tokenizer's (before padding)
  int vocab_extra_ids = 0;
  int32_t pad = 0, bos = 0, eos = 0;
  double mask_prob = 0.15;
  uint64_t seed = 1234;
};

// The config of `args` and its tokenizer (an Error naming the flag when T5 cannot be mocked).
T5MockConfig t5_mock_config(const TrainingArgs& args, const data::Tokenizer& tokenizer);

// num_samples per split (a negative count: 1000 samples).
std::unique_ptr<TrainingData> build_t5_mock_data(const T5MockConfig& config,
                                                 std::array<int64_t, 3> num_samples);

}  // namespace megatron::training
