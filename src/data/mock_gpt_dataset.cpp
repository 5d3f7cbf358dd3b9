// See mock_gpt_dataset.h. The generator follows NumPy's bit_generator.pyx (SeedSequence),
// pcg64.h and distributions.c (buffered_bounded_lemire_uint32).
#include "data/mock_gpt_dataset.h"

#include <array>

#include "core/error.h"

namespace megatron::data {

namespace {

// SeedSequence(seed).generate_state(4, uint64): pool of 4 words from the entropy, then 8 hashed
// 32-bit words read as 4 little-endian 64-bit ones.
std::array<uint64_t, 4> seed_sequence_state(uint64_t seed) {
  constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd,
                     kMultB = 0x58f38ded, kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
  std::vector<uint32_t> entropy{uint32_t(seed)};
  if (seed >> 32) entropy.push_back(uint32_t(seed >> 32));
  uint32_t hash_const = kInitA;
  auto hashmix = [&](uint32_t v) {
    v ^= hash_const;
    hash_const *= kMultA;
    v *= hash_const;
    return v ^ (v >> 16);
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t r = kMixMultL * x - kMixMultR * y;
    return r ^ (r >> 16);
  };
  std::array<uint32_t, 4> pool{};
  for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0);
  for (size_t src = 0; src < 4; ++src)
    for (size_t dst = 0; dst < 4; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (size_t src = 4; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < 4; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  uint32_t words[8];
  hash_const = kInitB;
  for (size_t i = 0; i < 8; ++i) {
    uint32_t v = pool[i % 4];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    words[i] = v ^ (v >> 16);
  }
  std::array<uint64_t, 4> out{};
  for (size_t k = 0; k < 4; ++k) out[k] = uint64_t(words[2 * k]) | (uint64_t(words[2 * k + 1]) << 32);
  return out;
}

}  // namespace

NumpyPCG64::NumpyPCG64(uint64_t seed) {
  const auto w = seed_sequence_state(seed);
  const u128 initstate = (u128(w[0]) << 64) | w[1];
  const u128 initseq = (u128(w[2]) << 64) | w[3];
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  next_uint64();
  state_ += initstate;
  next_uint64();
  has_uint32_ = false;
}

uint64_t NumpyPCG64::next_uint64() {
  const u128 mult = (u128(2549297995355413924ULL) << 64) | 4865540595714422341ULL;
  state_ = state_ * mult + inc_;
  const uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyPCG64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = uint32_t(next >> 32);
  return uint32_t(next & 0xffffffffu);
}

int32_t NumpyPCG64::integers_int32(int32_t low, int32_t high) {
  MG_CHECK(low < high, "integers: empty range");
  const uint32_t rng = uint32_t(int64_t(high) - 1 - low);  // closed interval [low, high - 1]
  if (rng == 0) return low;
  const uint32_t rng_excl = rng + 1;
  uint64_t m = uint64_t(next_uint32()) * rng_excl;
  uint32_t leftover = uint32_t(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = uint64_t(next_uint32()) * rng_excl;
      leftover = uint32_t(m);
    }
  }
  return int32_t(uint32_t(low) + uint32_t(m >> 32));
}

MockGPTLowLevelDataset::MockGPTLowLevelDataset(int32_t eod_id) : eod_(eod_id) {
  NumpyPCG64 rng(0);  // Megatron's hard-coded seed
  lengths_.resize(size_t(kSize));
  for (auto& l : lengths_) l = rng.integers_int32(1, kMaxSequenceLength);
}

int64_t MockGPTLowLevelDataset::sequence_length(int64_t i) const {
  MG_CHECK(i >= 0 && i < kSize, "mock document ", i, " out of range");
  return lengths_[size_t(i)];
}

void MockGPTLowLevelDataset::read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const {
  const int64_t n = sequence_length(i);
  MG_REQUIRE(offset >= 0 && length >= 0 && offset + length <= n, "mock document ", i, ": tokens [", offset,
           ", ", offset + length, ") outside its ", n);
  for (int64_t k = offset; k < offset + length; ++k) out.push_back(k < n - 1 ? int32_t(k + 1) : eod_);
}

}  // namespace megatron::data
