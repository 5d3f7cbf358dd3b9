// Megatron-LM's rng_state for a seed, as its _set_random_seed leaves the generators: Python's
// random.seed, NumPy's np.random.seed, torch.manual_seed (CPU, CUDA) and the tensor-parallel
// CUDA tracker; see torch_checkpoint.h. The byte layouts are PyTorch's: the CPU generator state
// is CPUGeneratorImplState (5056 bytes: the legacy THGeneratorState with the MT19937 words widened
// to 64 bits, then the float normal cache), the CUDA (Philox) state is the seed and the offset.
#include <cstring>

#include "core/error.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_rng {

namespace {

constexpr int kN = 624;

// MT19937's init_genrand.
std::vector<uint32_t> init_genrand(uint32_t s) {
  std::vector<uint32_t> mt(kN);
  mt[0] = s;
  for (int i = 1; i < kN; ++i) mt[size_t(i)] = 1812433253u * (mt[size_t(i - 1)] ^ (mt[size_t(i - 1)] >> 30)) + uint32_t(i);
  return mt;
}

// MT19937's init_by_array (how Python's random.seed(int) seeds: the integer's 32-bit words).
std::vector<uint32_t> init_by_array(const std::vector<uint32_t>& key) {
  std::vector<uint32_t> mt = init_genrand(19650218u);
  size_t i = 1, j = 0;
  const size_t n = kN, len = key.size();
  for (size_t k = std::max(n, len); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
    if (++j >= len) j = 0;
  }
  for (size_t k = n - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000u;
  return mt;
}

Tensor bytes_tensor(const std::vector<uint8_t>& b) {
  Tensor t = Tensor::empty({int64_t(b.size())}, DType::U8);
  std::memcpy(t.raw_data(), b.data(), b.size());
  return t;
}

}  // namespace

std::vector<uint8_t> torch_cpu_state(uint64_t seed) {
  const std::vector<uint32_t> mt = init_genrand(uint32_t(seed));
  std::vector<uint8_t> b(5056, 0);
  auto put = [&](size_t at, const void* p, size_t n) { std::memcpy(b.data() + at, p, n); };
  const int32_t left = 1, seeded = 1;
  const uint64_t next = 0;
  put(0, &seed, 8);
  put(8, &left, 4);
  put(12, &seeded, 4);
  put(16, &next, 8);
  for (int i = 0; i < kN; ++i) {
    const uint64_t w = mt[size_t(i)];
    put(24 + 8 * size_t(i), &w, 8);
  }
  // normal_x, normal_y, normal_rho, normal_is_valid, the float normal cache: all zero
  return b;
}

std::vector<uint8_t> torch_cuda_state(uint64_t seed) {
  std::vector<uint8_t> b(16, 0);
  std::memcpy(b.data(), &seed, 8);  // then the Philox offset, 0
  return b;
}

pickle::Value* megatron_rng_state(pickle::Document& doc, uint64_t seed, int tp_rank, int pp_rank,
                                  uint64_t dropout_seed, uint64_t dropout_offset) {
  // _set_random_seed: seed + 100 * pipeline rank for every generator; the tracker's
  // model-parallel stream seeds with that + 2718 + the tensor-parallel rank.
  const uint64_t s = seed + 100 * uint64_t(pp_rank);
  pickle::Value* st = doc.dict();
  // random.getstate(): (3, (624 words..., index 624), None)
  std::vector<uint32_t> key;
  for (uint64_t v = s; v > 0; v >>= 32) key.push_back(uint32_t(v));
  if (key.empty()) key.push_back(0);
  const std::vector<uint32_t> py = init_by_array(key);
  std::vector<pickle::Value*> words;
  for (uint32_t w : py) words.push_back(doc.integer(w));
  words.push_back(doc.integer(kN));
  doc.set(st, "random_rng_state", doc.tuple({doc.integer(3), doc.tuple(words), doc.none()}));
  // np.random.get_state(): ('MT19937', uint32[624], 624, 0, 0.0); NumPy seeds with the low 32 bits
  const std::vector<uint32_t> np = init_genrand(uint32_t(s));
  std::string raw(kN * 4, '\0');
  std::memcpy(raw.data(), np.data(), raw.size());
  doc.set(st, "np_rng_state", doc.tuple({doc.str("MT19937"), doc.ndarray(raw, "<u4", {kN}),
                                         doc.integer(kN), doc.integer(0), doc.real(0.0)}));
  doc.set(st, "torch_rng_state", doc.tensor(bytes_tensor(torch_cpu_state(s))));
  doc.set(st, "cuda_rng_state", doc.tensor(bytes_tensor(torch_cuda_state(s))));
  pickle::Value* tracker = doc.dict();
  doc.set(tracker, "model-parallel-rng",
          doc.tensor(bytes_tensor(torch_cuda_state(s + 2718 + uint64_t(tp_rank)))));
  doc.set(st, "rng_tracker_states", tracker);
  // This build's counter-based dropout generator, so that a checkpoint read back resumes exactly.
  pickle::Value* ours = doc.dict();
  doc.set(ours, "generator", doc.str("philox4x32-10"));
  doc.set(ours, "seed", doc.integer(int64_t(dropout_seed)));
  doc.set(ours, "offset", doc.integer(int64_t(dropout_offset)));
  doc.set(st, "dropout_rng_state", ours);
  return doc.list({st});
}

}  // namespace megatron::training::torch_rng
