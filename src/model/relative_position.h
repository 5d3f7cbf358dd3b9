// T5's relative position bias (Megatron-Core's RelativePositionEmbedding, itself Hugging Face's
// T5 formula): the score of query position i against key position j gets
// weight[bucket(j - i), head], with
//   bidirectional (the encoder): half the buckets for j > i, half for j <= i, by |j - i|;
//   causal (the decoder): only j <= i, by i - j (j > i falls in bucket 0);
//   of each half, distances below max_exact = half/2 get a bucket each, the rest share the
//   others logarithmically up to max_distance (everything further: the last bucket):
//     max_exact + int(log(d / max_exact) / log(max_distance / max_exact) * (half - max_exact)),
//   computed in float32 as torch does.
// The weight [num_buckets, num_heads] (relative_attention_bias.weight) is whole on every
// tensor-parallel rank, as Megatron keeps it; a rank's bias holds only its own heads (Megatron
// scatters the computed bias over the heads), so its gradient is a partial sum over the
// tensor-parallel group (WeightSpec::sequence_parallel, summed by the trainer).
#pragma once

#include <cstdint>
#include <string>

#include "model/module.h"
#include "model/tensor_parallel.h"

namespace megatron::model {

// The bucket of relative position `relative_position` (key position - query position).
int relative_position_bucket(int64_t relative_position, bool bidirectional, int num_buckets,
                             int max_distance);

class RelativePositionEmbedding : public Module {
 public:
  // prefix: "encoder_relative_pos_emb" or "decoder_relative_pos_emb".
  RelativePositionEmbedding(const std::string& prefix, bool bidirectional, int num_heads,
                            int num_buckets, int max_distance, DType dtype,
                            const TensorParallel& tp = TensorParallel::none(), bool grad = true);
  // This rank's heads' bias [1, heads/T, q_len, k_len] fp32 on `device`.
  Tensor forward(int64_t q_len, int64_t k_len, Device device);
  // Adds the weight's gradient from the bias's (dbias with forward's shape and sizes).
  void backward(const Tensor& dbias);
  Weight weight;  // [num_buckets, num_heads]

 private:
  const Tensor& index(int64_t q_len, int64_t k_len, Device device);
  bool bidirectional_;
  int num_heads_, num_buckets_, max_distance_, heads_, head_offset_;
  Tensor index_;  // cached rows of the flat weight per bias element, for index_q_ x index_k_
  int64_t index_q_ = 0, index_k_ = 0;
};

}  // namespace megatron::model
