// oneDNN matrix products with a primitive cache, the fp32 widening of half-precision operands
// oneDNN has no kernel for, and the kernel report (see cpu_matmul.h).
#include "kernels/cpu/cpu_matmul.h"

#include <omp.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/cpu_common.h"

namespace megatron::ops::cpu {
namespace {

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32: return memory::data_type::f32;
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: MG_CHECK(false, "matmul: operands must be float32, bfloat16 or float16, got ",
                      dtype_name(t));
  }
  return memory::data_type::undef;  // not reached
}

// One product shape; alpha and beta are part of it (oneDNN bakes them into the primitive), and so
// is the thread count the primitive plans its work for.
struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha, beta;  // the floats' bits
  int threads;
  DType dtype;
  bool ta, tb;
  auto fields() const { return std::tie(m, n, k, lda, ldb, ldc, alpha, beta, threads, dtype, ta, tb); }
  bool operator==(const Key& o) const { return fields() == o.fields(); }
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = 1469598103934665603ull;
    for (uint64_t v : {uint64_t(key.m), uint64_t(key.n), uint64_t(key.k), uint64_t(key.lda),
                       uint64_t(key.ldb), uint64_t(key.ldc), uint64_t(key.alpha) << 32 | key.beta,
                       uint64_t(key.threads) << 16 | uint64_t(key.dtype) << 2 |
                           uint64_t(key.ta) << 1 | uint64_t(key.tb)})
      h = (h ^ v) * 1099511628211ull;
    return h;
  }
};

Key make_key(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, float alpha,
             float beta, DType dtype, bool ta, bool tb) {
  return {m, n, k, lda, ldb, ldc, std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta),
          omp_get_max_threads(), dtype, ta, tb};
}

// A created primitive, or none (`usable` false: oneDNN has no kernel but its reference code).
struct Primitive {
  bool usable = false;
  dnnl::matmul prim;
  memory::desc a, b, c, scratch;
  std::string impl;
};

std::shared_ptr<const Primitive> create(const Key& key) {
  auto p = std::make_shared<Primitive>();
  const memory::data_type dt = dnnl_type(key.dtype);
  p->a = memory::desc({key.m, key.k}, dt, key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  p->b = memory::desc({key.k, key.n}, dt, key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  p->c = memory::desc({key.m, key.n}, memory::data_type::f32, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per-thread scratch: concurrent calls
  const float alpha = std::bit_cast<float>(key.alpha), beta = std::bit_cast<float>(key.beta);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->a, p->b, p->c), attr, engine());
    p->impl = pd.impl_info_str();
    if (p->impl.rfind("ref", 0) == 0) return p;  // reference code: the caller widens instead
    p->scratch = pd.scratchpad_desc();
    p->prim = dnnl::matmul(pd);
    p->usable = true;
  } catch (const dnnl::error& e) {
    MG_CHECK(e.status == dnnl_unimplemented, "oneDNN matmul for ", key.m, "x", key.k, "x", key.n,
             ": ", e.what());
  }
  return p;
}

constexpr size_t kMaxPrimitives = 2048;

std::shared_ptr<const Primitive> find(const Key& key) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Primitive>, KeyHash> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<const Primitive> p = create(key);  // outside the lock: creation takes a while
  std::lock_guard<std::mutex> lock(mu);
  // Training has a few dozen shapes; a server that sees every prompt length would not stop
  // adding them, so the cache starts over when full (calls in flight hold their primitive).
  if (cache.size() >= kMaxPrimitives) cache.clear();
  return cache.emplace(key, std::move(p)).first->second;
}

// Per-thread scratch memory (64-byte aligned) that grows to the largest request.
struct Scratch {
  std::unique_ptr<unsigned char[]> buf;
  size_t size = 0;
  void* get(size_t bytes) {
    if (bytes + 64 > size) {
      size = bytes + 64;
      buf.reset(new unsigned char[size]);
    }
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(buf.get()) + 63) & ~uintptr_t(63));
  }
};

void run(const Primitive& p, const void* a, const void* b, float* c) {
  thread_local Scratch scratch;
  thread_local dnnl::stream stream(engine());
  dnnl::engine& e = engine();
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, memory(p.a, e, const_cast<void*>(a))},
                                          {DNNL_ARG_WEIGHTS, memory(p.b, e, const_cast<void*>(b))},
                                          {DNNL_ARG_DST, memory(p.c, e, c)}};
  if (const size_t bytes = p.scratch.get_size(); bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratch, e, scratch.get(bytes)));
  try {
    p.prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& err) {
    MG_CHECK(false, "oneDNN matmul (", p.impl, ") failed: ", err.what());
  }
}

// The half-precision operand `m` widened to a dense fp32 matrix in `buf`.
MatRef widen(const MatRef& m, std::vector<float>& buf) {
  buf.resize(size_t(m.rows * m.cols));
  auto rows = [&](const auto* in) {
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) buf[size_t(i * m.cols + j)] = to_f32(in[i * m.ld + j]);
  };
  if (m.dtype == DType::BF16)
    rows(static_cast<const bf16*>(m.p));
  else
    rows(static_cast<const fp16*>(m.p));
  return {buf.data(), DType::F32, m.rows, m.cols, m.cols};
}

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "isa 0x" + [&] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%x", unsigned(isa));
      return std::string(buf);
    }();
  }
}

// The leading dimension oneDNN is given: any value is valid for a single row, oneDNN wants one
// at least as wide as the row.
int64_t lead(const MatRef& m) { return m.rows <= 1 ? std::max<int64_t>(m.cols, 1) : m.ld; }

}  // namespace

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                      ldb, beta, c, ldc);
  MG_CHECK(st == dnnl_success, "dnnl_sgemm failed (status ", int(st), ") for ", m, "x", k, "x", n,
           " lda ", lda, " ldb ", ldb, " ldc ", ldc);
}

void matmul(const MatRef& a, bool ta, const MatRef& b, bool tb, float* c, int64_t ldc,
            float alpha, float beta) {
  const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const int64_t n = tb ? b.rows : b.cols;
  MG_CHECK(a.dtype == b.dtype, "matmul: operands of different dtypes (", dtype_name(a.dtype),
           ", ", dtype_name(b.dtype), ")");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (m == 1) {  // c row = op(b)^T (a's one row or column)
    matvec(!tb, b, a.p, ta ? lead(a) : 1, alpha, beta, c, 1);
    return;
  }
  if (n == 1) {  // c column = op(a) (b's one column or row)
    matvec(ta, a, b.p, tb ? 1 : lead(b), alpha, beta, c, ldc);
    return;
  }
  const MatRef A{a.p, a.dtype, a.rows, a.cols, lead(a)}, B{b.p, b.dtype, b.rows, b.cols, lead(b)};
  const bool nested = omp_in_parallel();
  if (a.dtype == DType::F32 && nested) {
    sgemm(ta, tb, m, n, k, alpha, static_cast<const float*>(A.p), A.ld,
          static_cast<const float*>(B.p), B.ld, beta, c, ldc);
    return;
  }
  if (!nested) {
    const auto p = find(make_key(m, n, k, A.ld, B.ld, ldc, alpha, beta, a.dtype, ta, tb));
    if (p->usable) {
      run(*p, A.p, B.p, c);
      return;
    }
  }
  if (a.dtype == DType::F32) {  // no oneDNN primitive for this layout: its sgemm takes any
    sgemm(ta, tb, m, n, k, alpha, static_cast<const float*>(A.p), A.ld,
          static_cast<const float*>(B.p), B.ld, beta, c, ldc);
    return;
  }
  thread_local std::vector<float> wa, wb;  // no kernel for this half type here: widen to fp32
  matmul(widen(A, wa), ta, widen(B, wb), tb, c, ldc, alpha, beta);
}

const MatmulKernels& matmul_kernels() {
  static const MatmulKernels k = [] {
    MatmulKernels r;
    const dnnl_version_t* v = dnnl_version();
    r.onednn_version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                       std::to_string(v->patch);
    r.onednn_isa = isa_name(dnnl_get_effective_cpu_isa());
    // The kernel of a large dense product (as the linear layers run) per dtype.
    auto kernel = [](DType dt, bool* native) {
      const auto p = find(make_key(256, 256, 256, 256, 256, 256, 1.0f, 0.0f, dt, false, false));
      if (native) *native = p->usable;
      if (p->usable) return "oneDNN " + p->impl;
      return std::string("widened to fp32 (oneDNN has no ") + dtype_name(dt) +
             " kernel for this CPU)";
    };
    r.f32 = kernel(DType::F32, nullptr);
    r.bf16 = kernel(DType::BF16, &r.bf16_native);
    r.f16 = kernel(DType::F16, &r.f16_native);
    return r;
  }();
  return k;
}

}  // namespace megatron::ops::cpu
