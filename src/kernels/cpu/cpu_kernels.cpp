// The CPU kernel report (cpu_kernels.h).
#include "kernels/cpu/cpu_kernels.h"

#include <omp.h>

#include <fstream>
#include <set>
#include <sstream>

#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_common.h"

namespace megatron::ops::cpu {
namespace {

// The value of the first "key : value" line of /proc/cpuinfo, or "".
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    if (k == key) return colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
  }
  return {};
}

// OpenBLAS cores by the vector ISA of their kernels (0.3.21's x86-64 DYNAMIC_ARCH list).
bool openblas_core_has_avx512(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return true;
  return false;
}
bool openblas_core_has_avx2(const std::string& core) {
  for (const char* c : {"Haswell", "Zen"})
    if (core == c) return true;
  return openblas_core_has_avx512(core);
}

}  // namespace

const CpuKernelReport& cpu_kernel_report() {
  static const CpuKernelReport report = [] {
    CpuKernelReport r;
    r.cpu_model = cpuinfo("model name");
    if (r.cpu_model.empty()) r.cpu_model = "unknown";
    std::istringstream flags(cpuinfo("flags"));
    std::set<std::string> have;
    for (std::string f; flags >> f;) have.insert(f);
    for (const char* f : {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})
      if (have.count(f)) r.cpu_flags += (r.cpu_flags.empty() ? "" : " ") + std::string(f);
    if (r.cpu_flags.empty()) r.cpu_flags = "none of avx2 avx512f avx512_bf16 avx512_fp16 amx";
    cpu::blas_single_threaded();
    r.openblas_core = openblas_get_corename();
    r.openblas_fallback = have.count("avx512f") ? !openblas_core_has_avx512(r.openblas_core)
                          : have.count("avx2")  ? !openblas_core_has_avx2(r.openblas_core)
                                                : false;
    r.matmul = matmul_kernels();
    r.threads = omp_get_max_threads();
    return r;
  }();
  return report;
}

std::vector<std::string> cpu_kernel_lines() {
  const CpuKernelReport& r = cpu_kernel_report();
  const MatmulKernels& m = r.matmul;
  return {
      "cpu: " + r.cpu_model + " (" + r.cpu_flags + "), " + std::to_string(r.threads) +
          " OpenMP thread" + (r.threads == 1 ? "" : "s"),
      "cpu products: oneDNN " + m.onednn_version + " (ISA " + m.onednn_isa + "): fp32 " + m.f32 +
          "; bf16 " + m.bf16 + "; fp16 " + m.f16 + "; one row or column: matrix-vector loops" +
          "; bf16 attention: " + bf16_unit_name(bf16_tile_unit()),
      "openblas: core " + r.openblas_core +
          (r.openblas_fallback ? " (a fallback: older than this CPU's vector unit), not used"
                               : ", not used (oneDNN runs every product)"),
  };
}

std::string cpu_kernel_summary() {
  const CpuKernelReport& r = cpu_kernel_report();
  const MatmulKernels& m = r.matmul;
  return "CPU kernels: " + r.cpu_model + " (" + r.cpu_flags + "), " + std::to_string(r.threads) +
         " threads; products: oneDNN " + m.onednn_version + " " + m.onednn_isa + " (fp32 " + m.f32 +
         ", bf16 " + m.bf16 + "; bf16 attention " + bf16_unit_name(bf16_tile_unit()) +
         "); OpenBLAS core " + r.openblas_core +
         (r.openblas_fallback ? " (fallback)" : "") + " not used";
}

bool computes_in(DType dtype) {
  if (dtype == DType::F32 || dtype == DType::BF16) return true;
  if (dtype == DType::F16)
    return matmul_kernels().f16_native &&
           cpu_kernel_report().cpu_flags.find("avx512_fp16") != std::string::npos;
  return false;
}

}  // namespace megatron::ops::cpu
