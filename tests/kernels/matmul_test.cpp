// The CPU's matrix products in every precision and on every route (kernels/cpu/cpu_matmul.h):
// oneDNN's primitives (dense and strided operands, every transpose, alpha and beta), the
// matrix-vector loops (one output row or column, both orientations), the fp32 widening of a half
// type oneDNN has no kernel for (fp16 here, bf16 on AVX2), calls from inside an OpenMP region,
// batches. Each bf16/fp16 product is checked twice: against the double-precision product of the
// operands' own (rounded) values within fp32 accumulation error, which shows the products are
// accumulated in fp32, and against the fp32 product of the unrounded values at bf16 tolerance.
// CpuMatmulIsa reruns all of it in child processes with oneDNN capped at each ISA
// (DNNL_MAX_CPU_ISA: AMX, AVX512-BF16, AVX-512, AVX2), so every kernel oneDNN has for this CPU,
// and the widening where it has none, is checked wherever the suite runs. CpuThreads: everything
// runs on the one OpenMP pool that OMP_NUM_THREADS sizes.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <oneapi/dnnl/dnnl.h>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace megatron::ops {
namespace {
using testing::randn;

struct Product {
  std::vector<double> exact;  // of the operands' stored values, in double
  std::vector<double> scale;  // sum |a||b| per output: the bound of fp32 accumulation error
};

// alpha op(a) op(b) + beta c0 in double from the stored values of a, b (any dtype) and c0.
Product reference(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c0,
                  float alpha, float beta) {
  const int64_t m = c0.size(0), n = c0.size(1), k = ta ? a.size(0) : a.size(1);
  const Tensor A = a.contiguous().to(DType::F64), B = b.contiguous().to(DType::F64);
  const Tensor C = c0.contiguous().to(DType::F64);
  const double *pa = A.data<double>(), *pb = B.data<double>(), *pc = C.data<double>();
  Product r{std::vector<double>(size_t(m * n)), std::vector<double>(size_t(m * n))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? pa[p * m + i] : pa[i * k + p];
        const double bv = tb ? pb[j * k + p] : pb[p * n + j];
        s += av * bv;
        mag += std::abs(av * bv);
      }
      r.exact[size_t(i * n + j)] = alpha * s + (beta == 0.0f ? 0.0 : beta * pc[i * n + j]);
      r.scale[size_t(i * n + j)] = std::abs(alpha) * mag + std::abs(beta * pc[i * n + j]);
    }
  return r;
}

// Every element within `rel` of its scale (plus a tiny absolute slack).
void expect_within(const std::string& what, const Tensor& got, const Product& want, double rel) {
  const std::vector<float> g = got.contiguous().to_float_vector();
  ASSERT_EQ(g.size(), want.exact.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - want.exact[i]) <= rel * want.scale[i] + 1e-30)) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " off; first " << first
                    << ": got " << (first >= 0 ? g[size_t(first)] : 0.f) << " want "
                    << (first >= 0 ? want.exact[size_t(first)] : 0.0);
}

// fp32 accumulation over k terms: at most k units of 2^-24 of sum |a||b| (plus the alpha/beta
// roundings).
double fp32_error(int64_t k) { return double(k + 4) * std::ldexp(1.0, -24); }

// Checks gemm(op(a), op(b)) in `dtype` with the operands held as `dtype` (column blocks of wider
// matrices when strided), against both references.
void check_product(DType dtype, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha,
                   float beta, bool strided, uint64_t seed) {
  const std::string what = str(dtype_name(dtype), " ", m, "x", k, "x", n, " ta ", ta, " tb ", tb,
                               " alpha ", alpha, " beta ", beta, strided ? " strided" : "");
  SCOPED_TRACE(what);
  const int64_t pad = strided ? 7 : 0;
  const Shape sa = ta ? Shape{k, m + pad} : Shape{m, k + pad};
  const Shape sb = tb ? Shape{n, k + pad} : Shape{k, n + pad};
  const Tensor a32 = randn(sa, seed).narrow(1, 0, ta ? m : k);
  const Tensor b32 = randn(sb, seed + 1).narrow(1, 0, tb ? k : n);
  const Tensor a = dtype == DType::F32 ? a32 : a32.to(dtype), b = dtype == DType::F32 ? b32 : b32.to(dtype);
  const Tensor c0 = randn({m, n + pad}, seed + 2).narrow(1, pad, n);
  Tensor c = c0.clone();
  if (strided) {  // c a column block too
    Tensor wide = randn({m, n + pad}, seed + 2);
    c = wide.narrow(1, pad, n);
  }
  gemm(a, ta, b, tb, c, alpha, beta);
  expect_within("against the exact product of the stored values", c,
                reference(a, ta, b, tb, c0, alpha, beta), fp32_error(k));
  if (dtype != DType::F32)  // and the fp32 product of the unrounded values, at bf16 tolerance
    expect_within("against the fp32 product", c, reference(a32, ta, b32, tb, c0, alpha, beta),
                  dtype == DType::BF16 ? 8e-3 : 2e-3);
}

TEST(CpuMatmul, DenseAndStridedProductsInEveryPrecision) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool strided : {false, true}) {
          check_product(dt, 67, 45, 129, ta, tb, 1.0f, 0.0f, strided, 10);
          check_product(dt, 33, 70, 64, ta, tb, 0.5f, 0.25f, strided, 20);
        }
}

TEST(CpuMatmul, MatrixVectorProductsInEveryPrecision) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_product(dt, 1, 77, 300, ta, tb, 1.0f, 0.0f, false, 30);     // one output row
        check_product(dt, 77, 1, 300, ta, tb, 0.5f, 0.5f, false, 40);     // one output column
        check_product(dt, 1, 1500, 96, ta, tb, 1.0f, 1.0f, true, 50);     // threads split it
        check_product(dt, 1800, 1, 80, ta, tb, 2.0f, 0.0f, false, 60);
      }
}

TEST(CpuMatmul, InsideAnOpenMpRegionEachThreadMultipliesAlone) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor a = randn({40, 50}, 70).to(dt), b = randn({60, 50}, 71).to(dt);
    const Tensor c0 = Tensor::zeros({40, 60}, DType::F32);
    const Product want = reference(a, false, b, true, c0, 1.0f, 0.0f);
    std::vector<Tensor> out(4);
    for (Tensor& t : out) t = Tensor::zeros({40, 60}, DType::F32);
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 4; ++i) gemm(a, false, b, true, out[size_t(i)]);
    for (const Tensor& t : out) expect_within(dtype_name(dt), t, want, fp32_error(50));
  }
}

TEST(CpuMatmul, BatchedProducts) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor a = randn({3, 16, 32}, 80).to(dt);
    const Tensor b = randn({3, 24, 32}, 81).to(dt);
    Tensor c = randn({3, 16, 24}, 82);
    const Tensor c0 = c.clone();
    gemm_batched(a, false, b, true, c, 1.0f, 0.5f);
    for (int64_t z = 0; z < 3; ++z)
      expect_within(str(dtype_name(dt), " batch ", z), c.select(0, z),
                    reference(a.select(0, z), false, b.select(0, z), true, c0.select(0, z), 1.0f,
                              0.5f),
                    fp32_error(32));
  }
}

TEST(CpuMatmul, BetaZeroIgnoresNaNsAndAnEmptySumScalesC) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t m : {1, 20}) {
      const Tensor a = randn({m, 30}, 90).to(dt), b = randn({30, 25}, 91).to(dt);
      Tensor c = Tensor::full({m, 25}, std::numeric_limits<double>::quiet_NaN(), DType::F32);
      gemm(a, false, b, false, c);
      for (float v : c.to_float_vector()) ASSERT_TRUE(std::isfinite(v)) << dtype_name(dt);
    }
  Tensor c = Tensor::full({4, 5}, 2.0, DType::F32);
  gemm(Tensor::zeros({4, 0}, DType::BF16), false, Tensor::zeros({0, 5}, DType::BF16), false, c,
       1.0f, 0.5f);
  for (float v : c.to_float_vector()) EXPECT_EQ(v, 1.0f);
}

// The message of the exception f throws (a misuse of the op by a caller: an internal error).
std::string thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

TEST(CpuMatmul, MixedOrWrongDtypesAreRefusedByName) {
  Tensor c = Tensor::zeros({4, 5}, DType::F32);
  const Tensor a32 = randn({4, 3}, 1), b16 = randn({3, 5}, 2).to(DType::BF16);
  EXPECT_NE(thrown_by([&] { gemm(a32, false, b16, false, c); }).find("same dtype"),
            std::string::npos);
  Tensor cb = Tensor::zeros({4, 5}, DType::BF16);
  EXPECT_NE(thrown_by([&] { gemm(a32.to(DType::BF16), false, b16, false, cb); })
                .find("c must be float32"),
            std::string::npos);
  const Tensor ai = Tensor::zeros({4, 3}, DType::I32), bi = Tensor::zeros({3, 5}, DType::I32);
  EXPECT_NE(thrown_by([&] { gemm(ai, false, bi, false, c); }).find("float32, bfloat16 or float16"),
            std::string::npos);
}

// The ISA oneDNN was capped at (DNNL_MAX_CPU_ISA), as its enum value; 0 when not set.
unsigned forced_isa() {
  const char* env = std::getenv("DNNL_MAX_CPU_ISA");
  if (env == nullptr) return 0;
  const std::string s = env;
  if (s == "AVX2") return dnnl_cpu_isa_avx2;
  if (s == "AVX512_CORE") return dnnl_cpu_isa_avx512_core;
  if (s == "AVX512_CORE_BF16") return dnnl_cpu_isa_avx512_core_bf16;
  if (s == "AVX512_CORE_AMX") return dnnl_cpu_isa_avx512_core_amx;
  return 0;
}

// The report names the kernels of the ISA oneDNN runs: never above a cap, and bf16 products on a
// bf16 kernel wherever the ISA has AVX-512, widened to fp32 below it.
TEST(CpuMatmul, ReportNamesTheKernelsOfTheIsaInUse) {
  const cpu::MatmulKernels& k = cpu::matmul_kernels();
  const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
  if (const unsigned cap = forced_isa(); cap != 0) {
    EXPECT_EQ(isa & cap, isa) << k.onednn_isa;
  }
  EXPECT_NE(k.f32.find("oneDNN"), std::string::npos) << k.f32;
  const bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == unsigned(dnnl_cpu_isa_avx512_core);
  EXPECT_EQ(k.bf16_native, avx512) << k.bf16;
  EXPECT_EQ(k.bf16.find("widened") != std::string::npos, !avx512) << k.bf16;
  if ((isa & dnnl_cpu_isa_avx512_core_amx) == unsigned(dnnl_cpu_isa_avx512_core_amx)) {
    EXPECT_NE(k.bf16.find("amx"), std::string::npos) << k.bf16;
  }
  const std::vector<std::string> lines = cpu::cpu_kernel_lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find(k.onednn_isa), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find(cpu::cpu_kernel_report().openblas_core), std::string::npos) << lines[2];
}

// `megatron version` names the kernels this machine runs.
TEST(CpuMatmul, VersionNamesTheKernels) {
  const megatron::testing::CommandResult r = megatron::testing::run_cli("version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& line : cpu::cpu_kernel_lines())
    EXPECT_NE(r.output.find(line.substr(0, line.find(','))), std::string::npos)
        << line << "\nnot in:\n" << r.output;
  EXPECT_NE(r.output.find("cpu products: oneDNN " + cpu::matmul_kernels().onednn_version),
            std::string::npos) << r.output;
}

// The threads of this process (Linux).
int64_t thread_count() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// oneDNN's products (fp32, bf16), the matrix-vector loops and the element-wise kernels run on one
// pool of OpenMP threads of OMP_NUM_THREADS: the process gains at most that many threads minus
// the caller, whatever it runs.
TEST(CpuThreads, ProductsAndLoopsShareOneOpenMpPool) {
  const int threads = omp_get_max_threads();
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    EXPECT_EQ(threads, std::atoi(env));
  }
  const int64_t before = thread_count();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor a = randn({512, 384}, 1).to(dt), b = randn({384, 640}, 2).to(dt);
    Tensor c = Tensor::zeros({512, 640}, DType::F32);
    gemm(a, false, b, false, c);
    Tensor y = Tensor::zeros({1, 640}, DType::F32);
    gemm(a.narrow(0, 0, 1), false, b, false, y);
  }
  Tensor x = randn({1 << 20}, 3);
  scale(x, 0.5f);
  EXPECT_TRUE(all_finite(x));
  EXPECT_LE(thread_count() - before, int64_t(threads - 1)) << threads << " OpenMP threads";
}

// The test above in child processes with 1 and 3 threads.
TEST(CpuThreadsEnv, OmpNumThreadsIsHonoured) {
  for (int threads : {1, 3}) {
    const megatron::testing::CommandResult r = megatron::testing::run_command(
        str("OMP_NUM_THREADS=", threads, " /proc/", getpid(),
            "/exe --gtest_filter='CpuThreads.*'"));
    EXPECT_EQ(r.exit_code, 0) << "with OMP_NUM_THREADS=" << threads << ":\n" << r.output;
  }
}

// Every test above, in a child process per ISA cap (a cap above the CPU's own ISA changes
// nothing; oneDNN reads the cap once, before its first kernel, hence the processes).
TEST(CpuMatmulIsa, EveryFallbackIsaPassesTheProductTests) {
  for (const char* isa : {"AVX512_CORE_AMX", "AVX512_CORE_BF16", "AVX512_CORE", "AVX2"}) {
    const megatron::testing::CommandResult r = megatron::testing::run_command(
        str("DNNL_MAX_CPU_ISA=", isa, " /proc/", getpid(), "/exe --gtest_filter='CpuMatmul.*'"));
    EXPECT_EQ(r.exit_code, 0) << "with DNNL_MAX_CPU_ISA=" << isa << ":\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron::ops
