#include <gtest/gtest.h>

#include "core/rng.h"
#include "core/tensor.h"

using namespace megatron;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.select(1, 2);  // [2, 4]
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  s.fill_(7.0);
  EXPECT_EQ(t.item_as_double(2 * 4 + 0), 7.0);
  EXPECT_EQ(t.item_as_double(12 + 8 + 3), 7.0);
  EXPECT_EQ(t.item_as_double(0), 0.0);
  Tensor n = t.narrow(2, 1, 2);
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(n.contiguous().shape(), (Shape{2, 3, 2}));
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
}

TEST(Tensor, TransposeAndCopyConvert) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor at = a.transpose(0, 1).contiguous();
  EXPECT_EQ(at.shape(), (Shape{3, 2}));
  EXPECT_EQ(at.to_float_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor b = a.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to_float_vector(), a.to_float_vector());
  Tensor i = a.to(DType::I32);
  EXPECT_EQ(i.data<int32_t>()[5], 6);
}

TEST(Tensor, WrongAccessIsAnInternalError) {
  Tensor a = Tensor::zeros({2}, DType::F32);
  EXPECT_THROW(a.data<int32_t>(), InternalError);
  EXPECT_THROW(a.view({3}), InternalError);
  EXPECT_THROW(a.narrow(0, 1, 2), InternalError);
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123 known-answer test for philox4x32_10: counter and key all zero, and all ones.
  Philox4 r = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r, (Philox4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  r = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r, (Philox4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Rng, StreamsAreIndependentOfOrderAndSplitting) {
  Philox rng(1234, 7);
  std::vector<float> all(1000), part(500);
  rng.fill_normal(all.data(), 1000, 0.0f, 1.0f);
  rng.fill_normal(part.data(), 500, 0.0f, 1.0f, 500);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(all[500 + i], part[i]);
  double mean = 0, var = 0;
  for (float x : all) mean += x;
  mean /= 1000;
  for (float x : all) var += (x - mean) * (x - mean);
  var /= 1000;
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(var, 1.0, 0.15);
  Philox other(1234, 8);
  EXPECT_NE(other.u32(0), rng.u32(0));
}
