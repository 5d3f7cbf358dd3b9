// The relative position bias (see relative_position.h).
#include "model/relative_position.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace megatron::model {

int relative_position_bucket(int64_t relative_position, bool bidirectional, int num_buckets,
                             int max_distance) {
  int buckets = 0, n = num_buckets;
  int64_t d = relative_position;
  if (bidirectional) {
    n /= 2;
    if (d > 0) buckets += n;
    d = d < 0 ? -d : d;
  } else {
    d = d < 0 ? -d : 0;
  }
  const int max_exact = n / 2;
  if (d < max_exact) return buckets + int(d);
  // torch: max_exact + (log(d.float() / max_exact) / math.log(max_distance / max_exact)
  //        * (n - max_exact)).to(long), in float32 (the Python scalars become float32).
  float v = std::log(float(d) / float(max_exact));
  v = v / float(std::log(double(max_distance) / double(max_exact)));
  v = v * float(n - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + int64_t(v), n - 1);
  return buckets + int(large);
}

RelativePositionEmbedding::RelativePositionEmbedding(const std::string& prefix, bool bidirectional,
                                                     int num_heads, int num_buckets,
                                                     int max_distance, DType dtype,
                                                     const TensorParallel& tp, bool grad)
    : bidirectional_(bidirectional), num_heads_(num_heads), num_buckets_(num_buckets),
      max_distance_(max_distance) {
  MG_REQUIRE(num_buckets >= 4, "--relative-attention-num-buckets ", num_buckets,
             " must be at least 4 (half for each direction, half of those exact)");
  MG_REQUIRE(max_distance > num_buckets / 2, "--relative-attention-max-distance ", max_distance,
             " must exceed half of --relative-attention-num-buckets (", num_buckets,
             "): the causal buckets are exact up to there");
  MG_REQUIRE(num_heads % tp.size() == 0, "relative position bias: ", num_heads,
             " heads cannot be split across ", tp.size(), " tensor-parallel ranks");
  heads_ = num_heads / tp.size();
  head_offset_ = tp.rank() * heads_;
  WeightSpec spec;
  spec.name = prefix + ".relative_attention_bias.weight";
  spec.init = InitMethod::normal;
  spec.sequence_parallel = tp.size() > 1;  // each rank differentiates only its own heads
  weight.init(spec, {num_buckets, num_heads}, dtype, grad);
  register_weight(weight);
}

// Row (bucket * num_heads + global head) of the flat weight for element (h, i, j) of the bias.
const Tensor& RelativePositionEmbedding::index(int64_t q, int64_t k, Device device) {
  if (index_.defined() && index_q_ == q && index_k_ == k && index_.device() == device)
    return index_;
  std::vector<int32_t> idx(size_t(heads_ * q * k));
  for (int64_t i = 0; i < q; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int b = relative_position_bucket(j - i, bidirectional_, num_buckets_, max_distance_);
      for (int h = 0; h < heads_; ++h)
        idx[size_t((h * q + i) * k + j)] = int32_t(b * num_heads_ + head_offset_ + h);
    }
  index_ = Tensor::from_vector(idx, {int64_t(idx.size())}, device);
  index_q_ = q;
  index_k_ = k;
  return index_;
}

Tensor RelativePositionEmbedding::forward(int64_t q, int64_t k, Device device) {
  const Tensor& idx = index(q, k, device);
  Tensor out = Tensor::empty({heads_ * q * k, 1}, DType::F32, device);
  ops::index_select_rows(out, weight.f32.view({int64_t(num_buckets_) * num_heads_, 1}), idx);
  return out.view({1, heads_, q, k});
}

void RelativePositionEmbedding::backward(const Tensor& dbias) {
  const int64_t q = dbias.size(2), k = dbias.size(3);
  const Tensor& idx = index(q, k, dbias.device());
  ops::index_copy_rows(weight.param.grad.view({int64_t(num_buckets_) * num_heads_, 1}),
                       dbias.contiguous().view({heads_ * q * k, 1}), idx, /*accumulate=*/true);
}

}  // namespace megatron::model
