// Host collectives: the MPI Communicator (non-blocking + polled deadline) against plain blocking
// MPI_Allreduce on the same buffers, for fp32 and bf16 (reduced in fp32) all-reduce, and fp32
// all-gather / reduce-scatter. Run under mpirun, e.g.
//   mpirun --oversubscribe --allow-run-as-root -np 2 build/bench/comm_bench [max elements]
// Prints per-call time (median of repetitions) and bus bandwidth (NCCL's convention:
// all-reduce 2(n-1)/n * bytes, all-gather / reduce-scatter (n-1)/n * bytes of the full buffer).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "comm/communicator.h"

#ifdef MEGATRON_HAVE_MPI
#include <mpi.h>

using namespace megatron;

namespace {

double median_seconds(Communicator& w, int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    w.barrier();
    const auto s = std::chrono::steady_clock::now();
    fn();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    Tensor x = Tensor::full({1}, dt, DType::F64);
    w.all_reduce(x, ReduceOp::Max);
    t.push_back(x.item_as_double(0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // Optional argument: the largest buffer in elements (default 2^23).
  const int64_t max_elems = argc > 1 ? std::atoll(argv[1]) : int64_t(1) << 23;
  auto w = world_communicator();
  const int n = w->size();
  if (w->rank() == 0) {
    std::printf("ranks: %d\n\n| op | elements | MB | megatron.cpp us | GB/s (bus) | plain MPI us |\n"
                "|---|---|---|---|---|---|\n", n);
  }
  for (int64_t elems : {int64_t(1) << 10, int64_t(1) << 16, int64_t(1) << 20, int64_t(1) << 23}) {
    if (elems > max_elems) break;
    const int reps = elems >= (1 << 20) ? 10 : 50;
    Tensor f = Tensor::full({elems}, 1.0, DType::F32);
    Tensor b = f.to(DType::BF16);
    const double mb = double(elems) * 4 / 1e6;
    const double ar = median_seconds(*w, reps, [&] { w->all_reduce(f); });
    const double plain = median_seconds(*w, reps, [&] {
      MPI_Allreduce(MPI_IN_PLACE, f.raw_data(), int(elems), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double arb = median_seconds(*w, reps, [&] { w->all_reduce(b); });
    Tensor out = Tensor::empty({elems * n}, DType::F32);
    const double ag = median_seconds(*w, reps, [&] { w->all_gather(f, out); });
    const double rs = median_seconds(*w, reps, [&] { w->reduce_scatter(out, f); });
    const double plain_ag = median_seconds(*w, reps, [&] {
      MPI_Allgather(f.raw_data(), int(elems), MPI_FLOAT, out.raw_data(), int(elems), MPI_FLOAT,
                    MPI_COMM_WORLD);
    });
    const double plain_rs = median_seconds(*w, reps, [&] {
      MPI_Reduce_scatter_block(out.raw_data(), f.raw_data(), int(elems), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    });
    if (w->rank() == 0) {
      const double bus_ar = 2.0 * (n - 1) / n * mb / 1e3;
      const double bus_full = double(n - 1) / n * mb * n / 1e3;
      std::printf("| all_reduce fp32 | %lld | %.3f | %.1f | %.2f | %.1f |\n", (long long)elems, mb,
                  ar * 1e6, bus_ar / ar, plain * 1e6);
      std::printf("| all_reduce bf16 (fp32 math) | %lld | %.3f | %.1f | %.2f | - |\n",
                  (long long)elems, mb / 2, arb * 1e6, bus_ar / 2 / arb);
      std::printf("| all_gather fp32 | %lld | %.3f | %.1f | %.2f | %.1f |\n", (long long)elems, mb,
                  ag * 1e6, bus_full / ag, plain_ag * 1e6);
      std::printf("| reduce_scatter fp32 | %lld | %.3f | %.1f | %.2f | %.1f |\n", (long long)elems,
                  mb, rs * 1e6, bus_full / rs, plain_rs * 1e6);
    }
  }
  return 0;
}
#else
int main() {
  std::printf("comm_bench: built without MPI (-DMEGATRON_MPI=OFF)\n");
  return 0;
}
#endif
