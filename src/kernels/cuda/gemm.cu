// Matrix products through cuBLASLt. Our operands are row-major; cuBLASLt is column-major, so
// C = op(A) op(B) (row-major, M x N) is computed as C^T = op(B)^T op(A)^T in column-major terms:
// the row-major buffers are passed as they are, with A and B swapped.
#include <cublasLt.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

#define MG_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t mg_st_ = (expr);                                                           \
    if (mg_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      MG_THROW("cuBLASLt error ", int(mg_st_), " in ", #expr, " (", __FILE__, ":", __LINE__, \
               ")");                                                                          \
  } while (0)

namespace megatron::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// What cuBLASLt's algorithm choice depends on: the operation, the shapes, strides and types, and
// how far the buffers are aligned (up to the 256 bytes the heuristic assumes by default).
using AlgoKey = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                           int, int64_t, int64_t, int64_t, int64_t, int, int, int, int>;

struct LtState {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  bool tf32 = false;
  // The heuristic's first choice per problem: asking cuBLASLt costs far more host time than a
  // small product takes on the GPU, and a training step repeats the same few shapes.
  std::mutex algo_mu;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
};

// The alignment of a buffer address: its lowest set bit, capped at 256.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = a & (~a + 1);
  return uint32_t(low == 0 || low > 256 ? 256 : low);
}

LtState& lt() {
  static LtState* s = [] {
    auto* st = new LtState();
    MG_CUBLAS_CHECK(cublasLtCreate(&st->handle));
    return st;
  }();
  return *s;
}

struct Operand {
  int64_t rows, cols, ld, batch_stride;
  cudaDataType_t type;
};

// rows x cols row-major view of a 2-D or 3-D tensor (the last two dims), unit inner stride.
Operand operand(const char* op, const char* name, const Tensor& t, int expected_dim) {
  MG_CHECK(t.defined() && t.device().is_cuda(), op, ": ", name, " must be a CUDA tensor");
  const DType dt = t.dtype();
  MG_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, op, ": ", name,
           " must be float32, bfloat16 or float16, got ", dtype_name(dt));
  MG_CHECK(t.dim() == expected_dim, op, ": ", name, " must be ", expected_dim, "-D");
  MG_CHECK(t.stride(-1) == 1, op, ": ", name, " needs unit inner stride");
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t ld = rows > 1 ? t.stride(-2) : cols;
  MG_CHECK(ld >= cols, op, ": ", name, " row stride smaller than its width");
  const cudaDataType_t type =
      dt == DType::F32 ? CUDA_R_32F : (dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F);
  return {rows, cols, ld, expected_dim == 3 ? t.stride(0) : 0, type};
}

void matmul(const char* op, const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
            float alpha, float beta, int dim) {
  const Operand A = operand(op, "a", a, dim), B = operand(op, "b", b, dim),
                C = operand(op, "c", c, dim);
  // As the CPU: both operands of one dtype, fp32 output; half-precision products accumulate in
  // fp32 (CUBLAS_COMPUTE_32F).
  MG_CHECK(a.dtype() == b.dtype(), op, ": a is ", dtype_name(a.dtype()), " and b ",
           dtype_name(b.dtype()), "; cast one so both have the same dtype");
  MG_CHECK(c.dtype() == DType::F32, op, ": c must be float32, got ", dtype_name(c.dtype()));
  const int64_t M = ta ? A.cols : A.rows, K = ta ? A.rows : A.cols;
  const int64_t Kb = tb ? B.cols : B.rows, N = tb ? B.rows : B.cols;
  MG_CHECK(K == Kb && C.rows == M && C.cols == N, op, ": shapes do not match (", M, "x", K, " @ ",
           Kb, "x", N, " -> ", C.rows, "x", C.cols, ")");
  const int64_t batch = dim == 3 ? c.size(0) : 1;
  if (dim == 3)
    MG_CHECK((a.size(0) == batch || A.batch_stride == 0) && (b.size(0) == batch || B.batch_stride == 0),
             op, ": batch sizes differ");
  if (M == 0 || N == 0) return;
  LtState& s = lt();
  if (!s.workspace.defined()) s.workspace = Tensor::empty({int64_t(kWorkspaceBytes)}, DType::U8, c.device());

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasComputeType_t compute =
      s.tf32 && A.type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  // Column-major: first operand = B's buffer (N x K after op), second = A's buffer.
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Column-major shapes of the stored buffers: B stored row-major rows x cols = col-major cols x rows.
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, B.type, uint64_t(B.cols), uint64_t(B.rows), B.ld));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, A.type, uint64_t(A.cols), uint64_t(A.rows), A.ld));
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, uint64_t(C.cols), uint64_t(C.rows), C.ld));
  if (batch > 1) {
    const int32_t bc = int32_t(batch);
    for (auto [layout, stride] : {std::pair{la, B.batch_stride}, {lb, A.batch_stride}, {lc, C.batch_stride}}) {
      MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      MG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  // The buffers as cuBLASLt sees them: first operand b, second a (column-major, above).
  const uint32_t align_first = alignment(b.raw_data()), align_second = alignment(a.raw_data()),
                 align_c = alignment(c.raw_data());
  const AlgoKey key{int(opa), int(opb), M, N, K, A.ld, B.ld, C.ld, int(A.type), int(compute),
                    batch, A.batch_stride, B.batch_stride, C.batch_stride, int(align_first),
                    int(align_second), int(align_c), int(B.type)};
  cublasLtMatmulAlgo_t algo;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(s.algo_mu);
    const auto it = s.algos.find(key);
    if (it != s.algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first},
                               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
                               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}})
      MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    MG_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(s.handle, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    MG_CHECK(found > 0, op, ": cuBLASLt found no algorithm for ", M, "x", K, "x", N);
    algo = heur.algo;
    std::lock_guard<std::mutex> lock(s.algo_mu);
    s.algos.emplace(key, algo);
  }
  MG_CUBLAS_CHECK(cublasLtMatmul(s.handle, desc, &alpha, b.raw_data(), la, a.raw_data(), lb, &beta,
                                 c.raw_data(), lc, c.raw_data(), lc, &algo,
                                 s.workspace.raw_data(), kWorkspaceBytes, detail::stream()));
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
          float beta) {
  matmul("cuda::gemm", a, trans_a, b, trans_b, c, alpha, beta, 2);
}

void gemm_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha, float beta) {
  matmul("cuda::gemm_batched", a, trans_a, b, trans_b, c, alpha, beta, 3);
}

void allow_tf32(bool on) { lt().tf32 = on; }

}  // namespace megatron::cuda
