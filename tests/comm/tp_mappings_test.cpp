// Tensor-parallel mappings with known answers: each rank contributes its rank id (as Megatron's
// test_mappings does). Mpi* tests run at world size 1 (identity) and under mpirun -np 2 / 4.
#include <gtest/gtest.h>

#include "comm/tp_mappings.h"

namespace megatron {
namespace {

using namespace megatron::tp;

Communicator& group() {
  static auto w = world_communicator();
  return *w;
}

void expect_all(const Tensor& t, double v, const char* what) {
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.item_as_double(i), v) << what << " @" << i;
}

// Tensor of shape with element (i0, ..., last) = base + flat index.
Tensor iota(const Shape& s, double base, DType dt = DType::F32) {
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(base + double(i));
  return t.to(dt);
}

TEST(MpiTpMappings, CopyAndReduce) {
  Communicator& g = group();
  const int r = g.rank(), n = g.size();
  const double sum = n * (n - 1) / 2.0;
  Tensor x = Tensor::full({3, 4}, double(r), DType::F32);
  expect_all(CopyToTensorParallelRegion::forward(g, x), r, "copy fwd");
  expect_all(CopyToTensorParallelRegion::backward(g, x), sum, "copy bwd");
  expect_all(ReduceFromTensorParallelRegion::forward(g, x), sum, "reduce fwd");
  expect_all(ReduceFromTensorParallelRegion::backward(g, x), r, "reduce bwd");
  expect_all(x, r, "input untouched");
  Tensor xb = x.to(DType::BF16);
  expect_all(reduce_from_tensor_model_parallel_region(g, xb), sum, "reduce bf16");
}

TEST(MpiTpMappings, ScatterAndGatherLastDim) {
  Communicator& g = group();
  const int r = g.rank(), n = g.size();
  // Full tensor [2, 3, 2n] identical on all ranks; rank r keeps columns [2r, 2r+2).
  Tensor full = iota({2, 3, 2 * n}, 0);
  for (auto fwd_split : {true, false}) {
    Tensor part = fwd_split ? ScatterToTensorParallelRegion::forward(g, full)
                            : GatherFromTensorParallelRegion::backward(g, full);
    ASSERT_EQ(part.shape(), Shape({2, 3, 2}));
    for (int64_t i = 0; i < 6; ++i)
      for (int c = 0; c < 2; ++c) EXPECT_EQ(part.item_as_double(i * 2 + c), i * 2 * n + 2 * r + c);
  }
  // Each rank contributes its rank id; the gathered last dim is [0,0,1,1,...].
  Tensor mine = Tensor::full({3, 2}, double(r), DType::F32);
  for (auto fwd_gather : {true, false}) {
    Tensor all = fwd_gather ? GatherFromTensorParallelRegion::forward(g, mine)
                            : ScatterToTensorParallelRegion::backward(g, mine);
    ASSERT_EQ(all.shape(), Shape({3, 2 * n}));
    for (int row = 0; row < 3; ++row)
      for (int c = 0; c < 2 * n; ++c) EXPECT_EQ(all.item_as_double(row * 2 * n + c), c / 2);
  }
  if (n > 1) {
    EXPECT_THROW(scatter_to_tensor_model_parallel_region(g, Tensor::zeros({2, 2 * n + 1}, DType::F32)),
                 Error);
  }
}

TEST(MpiTpMappings, SequenceParallelScatterGather) {
  Communicator& g = group();
  const int r = g.rank(), n = g.size();
  Tensor full = iota({2 * n, 3}, 0, DType::BF16);
  Tensor part = ScatterToSequenceParallelRegion::forward(g, full);
  ASSERT_EQ(part.shape(), Shape({2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(part.item_as_double(i), 6 * r + i);
  Tensor mine = Tensor::full({2, 3}, double(r), DType::F32);
  for (auto which : {0, 1, 2}) {
    Tensor all = which == 0   ? ScatterToSequenceParallelRegion::backward(g, mine)
                 : which == 1 ? GatherFromSequenceParallelRegion::forward(g, mine)
                              : ReduceScatterToSequenceParallelRegion::backward(g, mine);
    ASSERT_EQ(all.shape(), Shape({2 * n, 3}));
    for (int i = 0; i < 6 * n; ++i) EXPECT_EQ(all.item_as_double(i), i / 6);
  }
}

TEST(MpiTpMappings, ReduceScatterAlongSequence) {
  Communicator& g = group();
  const int r = g.rank(), n = g.size();
  // Rank r holds rows with value r + row; rank q receives rows [2q, 2q+2) summed over ranks.
  Tensor x = Tensor::empty({2 * n, 3}, DType::F32);
  for (int row = 0; row < 2 * n; ++row) x[row].fill_(double(r + row));
  const double sum = n * (n - 1) / 2.0;
  for (auto fwd : {true, false}) {
    Tensor y = fwd ? ReduceScatterToSequenceParallelRegion::forward(g, x)
                   : GatherFromSequenceParallelRegion::backward(g, x);
    ASSERT_EQ(y.shape(), Shape({2, 3}));
    for (int row = 0; row < 2; ++row)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(y.item_as_double(row * 3 + c), sum + n * (2 * r + row));
  }
  if (n > 1) {
    EXPECT_THROW(reduce_scatter_to_sequence_parallel_region(g, Tensor::zeros({2 * n + 1, 3}, DType::F32)),
                 Error);
  }
}

TEST(MpiTpMappings, ConjugatePairsRoundTrip) {
  // scatter then gather (and gather then split) returns the original tensor.
  Communicator& g = group();
  Tensor full = iota({4, 2 * g.size()}, 3);
  Tensor back = gather_from_tensor_model_parallel_region(g, scatter_to_tensor_model_parallel_region(g, full));
  for (int64_t i = 0; i < full.numel(); ++i) EXPECT_EQ(back.item_as_double(i), full.item_as_double(i));
  Tensor seq = iota({2 * g.size(), 5}, 1);
  Tensor back2 = gather_from_sequence_parallel_region(g, scatter_to_sequence_parallel_region(g, seq));
  for (int64_t i = 0; i < seq.numel(); ++i) EXPECT_EQ(back2.item_as_double(i), seq.item_as_double(i));
}

}  // namespace
}  // namespace megatron
