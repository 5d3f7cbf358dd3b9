// What the CPU backend runs on this machine, decided at run time from the CPU's own flags: the
// CPU model and the flags that pick kernels, oneDNN's ISA and the kernel of each precision's
// matrix products, OpenBLAS's core (checked, never used for a product: oneDNN runs them all, see
// cpu_matmul.h) and the OpenMP threads. `megatron version` prints it and pretrain-gpt logs it at
// start-up.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_matmul.h"

namespace megatron::ops::cpu {

struct CpuKernelReport {
  std::string cpu_model;  // /proc/cpuinfo's model name ("unknown" elsewhere)
  std::string cpu_flags;  // of avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16: those present
  MatmulKernels matmul;
  std::string openblas_core;  // openblas_get_corename()
  // Whether OpenBLAS picked that core by falling back (a core for an older vector ISA than the
  // CPU's: Debian's OpenBLAS 0.3.21 gives newer CPUs Haswell or Prescott kernels).
  bool openblas_fallback = false;
  int threads = 1;  // OpenMP threads (OMP_NUM_THREADS): oneDNN and the element-wise kernels
};
const CpuKernelReport& cpu_kernel_report();

// The report as lines for `megatron version`, and as one line for a log.
std::vector<std::string> cpu_kernel_lines();
std::string cpu_kernel_summary();

// Whether a model with weights of `dtype` multiplies in that dtype on this CPU: bf16 always (a
// bf16 kernel of oneDNN, or the same products widened to fp32 where the CPU has none); fp16 only
// where oneDNN has an fp16 kernel (AVX512-FP16), else the model computes in fp32 from fp32
// working copies of its weights.
bool computes_in(DType dtype);

}  // namespace megatron::ops::cpu
