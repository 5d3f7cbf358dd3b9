// Time to build a GPT dataset's indices (document, sample, shuffle) from sequence lengths, the
// work done once per split at start-up. Usage: dataset_index_bench [num_sequences] [seq_length]
// [num_samples]. bench/reference/numpy_index_bench.py times NumPy's shuffles of the same sizes
// (Megatron's Python path; its sample index is C++ in Megatron too).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "data/gpt_indices.h"
#include "data/numpy_random.h"

using namespace megatron::data;

int main(int argc, char** argv) {
  int64_t nseq = argc > 1 ? std::atoll(argv[1]) : 2000000;
  int64_t S = argc > 2 ? std::atoll(argv[2]) : 2048;
  int64_t N = argc > 3 ? std::atoll(argv[3]) : 2000000;
  std::mt19937 gen(1);
  std::vector<int32_t> lengths(static_cast<size_t>(nseq)), ids(static_cast<size_t>(nseq));
  int64_t T = 0;
  for (int64_t i = 0; i < nseq; ++i) {
    lengths[size_t(i)] = int32_t(1 + gen() % 2000);
    ids[size_t(i)] = int32_t(i);
    T += lengths[size_t(i)];
  }
  GPTIndexParams p;
  p.seq_length = S;
  p.num_samples = N;
  auto t0 = std::chrono::steady_clock::now();
  auto I = build_gpt_indices(lengths, ids, p);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sequences %lld tokens %lld seq_length %lld epochs %lld documents %zu samples %lld: %.3f s\n",
              (long long)nseq, (long long)T, (long long)S, (long long)I.num_epochs, I.document_index.size(),
              (long long)I.num_samples(), s);
  // The RNG part alone, sized like the NumPy reference: shuffles of the document index (int32)
  // and the shuffle index (uint32) with one RandomState.
  std::vector<int32_t> doc(I.document_index.size());
  std::vector<uint32_t> shf(size_t(I.num_samples()));
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(i);
  for (size_t i = 0; i < shf.size(); ++i) shf[i] = uint32_t(i);
  NumpyRandomState rng(1234);
  t0 = std::chrono::steady_clock::now();
  rng.shuffle(std::span<int32_t>(doc));
  rng.shuffle(std::span<uint32_t>(shf));
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("shuffles of %zu + %zu entries: %.3f s (compare: bench/reference/numpy_index_bench.py %zu %zu)\n",
              doc.size(), shf.size(), s, doc.size(), shf.size());
  return 0;
}
