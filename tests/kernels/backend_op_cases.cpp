// The op cases (see backend_ops.h): every op of ops.h with a few shapes, dtypes and flags. Output
// tensors start from fixed values, so elements an op leaves alone compare equal too. CUDA
// tolerances are those the CUDA kernels were written against (fp32 ~1e-5 relative).
#include <cmath>

#include "op_case_util.h"

namespace megatron::ops::testing {
namespace {

// |N(0, stddev)|^2: second moments for AdamW.
Tensor squares(Device d, const Shape& s, uint64_t stream, float stddev) {
  std::vector<float> v = rnd(Device::cpu(), s, stream, stddev).to_float_vector();
  for (float& x : v) x *= x;
  return Tensor::from_vector(v, s, d);
}

// n ids in [lo, hi) from a fixed stream.
Tensor ids(Device d, int64_t n, int64_t lo, int64_t hi, uint64_t stream) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  const Philox r(4343, stream);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(lo + int64_t(r.u32(uint64_t(i)) % uint64_t(hi - lo)));
  return Tensor::from_vector(v, {n}, d);
}

Tensor scalar(double v) { return Tensor::from_vector<double>({v}, {1}); }
Tensor doubles(const std::vector<double>& v) {
  return Tensor::from_vector<double>(v, {int64_t(v.size())});
}

void matmul_cases(Table& t) {
  const Tolerance gemm_tol{1e-4, 1e-4};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      t.add("gemm", str("67x129 @ 129x45, trans_a ", ta, ", trans_b ", tb, ", alpha .5, beta .25"),
            [=](Device d) {
              const int64_t M = 67, K = 129, N = 45;
              Tensor a = rnd(d, ta ? Shape{K, M} : Shape{M, K}, 1);
              Tensor b = rnd(d, tb ? Shape{N, K} : Shape{K, N}, 2), c = rnd(d, {M, N}, 3);
              gemm(a, ta, b, tb, c, 0.5f, 0.25f);
              return Outs{c};
            }, {gemm_tol});
  t.add("gemm", "column blocks of wider matrices (row-strided operands)", [](Device d) {
    Tensor a = rnd(d, {20, 64}, 4), b = rnd(d, {24, 50}, 5), c = fill(d, {20, 40}, 0.5);
    gemm(a.narrow(1, 8, 24), false, b.narrow(1, 10, 30), false, c.narrow(1, 5, 30), 1.0f, 1.0f);
    return Outs{c};
  }, {gemm_tol});
  t.add("gemm", "one output row (matrix-vector), trans_b", [](Device d) {
    Tensor a = rnd(d, {1, 300}, 6), b = rnd(d, {77, 300}, 7), c = fill(d, {1, 77}, 0.0);
    gemm(a, false, b, true, c);
    return Outs{c};
  }, {gemm_tol});
  t.add("gemm", "one output column", [](Device d) {
    Tensor a = rnd(d, {77, 300}, 8), b = rnd(d, {300, 1}, 9), c = fill(d, {77, 1}, 0.0);
    gemm(a, false, b, false, c);
    return Outs{c};
  }, {gemm_tol});
  // Half-precision operands: the products of the bf16 (fp16) values accumulated in fp32; other
  // backends within bf16 tolerance of the CPU.
  const Tolerance half_tol{1e-2, 1e-2};
  for (DType dt : {DType::BF16, DType::F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        t.add("gemm", str(dtype_name(dt), " 67x129 @ 129x45, trans_a ", ta, ", trans_b ", tb,
                          ", alpha .5, beta .25"),
              [=](Device d) {
                const int64_t M = 67, K = 129, N = 45;
                Tensor a = rnd(d, ta ? Shape{K, M} : Shape{M, K}, 1, 1.0f, dt);
                Tensor b = rnd(d, tb ? Shape{N, K} : Shape{K, N}, 2, 1.0f, dt);
                Tensor c = rnd(d, {M, N}, 3);
                gemm(a, ta, b, tb, c, 0.5f, 0.25f);
                return Outs{c};
              }, {half_tol});
  t.add("gemm", "bfloat16 one output row (matrix-vector), trans_b", [=](Device d) {
    Tensor a = rnd(d, {1, 300}, 6, 1.0f, DType::BF16), b = rnd(d, {77, 300}, 7, 1.0f, DType::BF16);
    Tensor c = fill(d, {1, 77}, 0.0);
    gemm(a, false, b, true, c);
    return Outs{c};
  }, {half_tol});
  t.add("gemm", "bfloat16 one output column, beta 1", [=](Device d) {
    Tensor a = rnd(d, {77, 300}, 8, 1.0f, DType::BF16), b = rnd(d, {300, 1}, 9, 1.0f, DType::BF16);
    Tensor c = rnd(d, {77, 1}, 10);
    gemm(a, false, b, false, c, 1.0f, 1.0f);
    return Outs{c};
  }, {half_tol});
  t.add("gemm_batched", "bfloat16 3 x (16x32 @ 24x32^T)", [=](Device d) {
    Tensor a = rnd(d, {3, 16, 32}, 10, 1.0f, DType::BF16), b = rnd(d, {3, 24, 32}, 11, 1.0f, DType::BF16);
    Tensor c = rnd(d, {3, 16, 24}, 12);
    gemm_batched(a, false, b, true, c, 1.0f, 0.5f);
    return Outs{c};
  }, {half_tol});
  for (bool ta : {false, true})
    t.add("gemm_batched", str("3 x (16x32 @ 32x24), trans_a ", ta, ", beta .5"), [=](Device d) {
      Tensor a = rnd(d, ta ? Shape{3, 32, 16} : Shape{3, 16, 32}, 10), b = rnd(d, {3, 32, 24}, 11);
      Tensor c = rnd(d, {3, 16, 24}, 12);
      gemm_batched(a, ta, b, false, c, 1.0f, 0.5f);
      return Outs{c};
    }, {gemm_tol});
}

void embedding_cases(Table& t) {
  const Tolerance exact{0.0, 0.0};
  t.add("embedding_fwd", "V 50, h 16, 40 ids", [](Device d) {
    Tensor out = fill(d, {40, 16}, 0.0);
    embedding_fwd(out, ids(d, 40, 0, 50, 1), rnd(d, {50, 16}, 13));
    return Outs{out};
  }, {exact});
  t.add("embedding_bwd", "V 50, h 16, 300 ids over 12 rows (repeats)", [](Device d) {
    Tensor dw = fill(d, {50, 16}, 0.0);
    embedding_bwd(dw, ids(d, 300, 0, 12, 2), rnd(d, {300, 16}, 14));
    return Outs{dw};
  }, {exact});
  t.add("vocab_parallel_embedding_fwd", "rows [30, 60) of 90, ids anywhere", [](Device d) {
    Tensor out = fill(d, {40, 8}, 7.0);
    vocab_parallel_embedding_fwd(out, ids(d, 40, 0, 90, 3), rnd(d, {30, 8}, 15), 30);
    return Outs{out};
  }, {exact});
  for (DType dt : {DType::BF16, DType::F16})
    t.add("vocab_parallel_embedding_fwd", str(dtype_name(dt), " table rows [30, 60) of 90"),
          [dt](Device d) {
            Tensor out = fill(d, {40, 8}, 7.0);
            vocab_parallel_embedding_fwd(out, ids(d, 40, 0, 90, 3), rnd(d, {30, 8}, 15, 1.0f, dt), 30);
            return Outs{out};
          }, {exact});
  t.add("vocab_parallel_embedding_bwd", "rows [30, 60) of 90, accumulating", [](Device d) {
    Tensor dw = rnd(d, {30, 8}, 16);
    vocab_parallel_embedding_bwd(dw, ids(d, 200, 0, 90, 4), rnd(d, {200, 8}, 17), 30);
    return Outs{dw};
  });
}

// The kind-taking ops: cases of every kind of kernels/op_kinds.h (add_kind names the kind; a
// test fails while a kind has no norm_fwd / norm_bwd or activation_fwd / activation_bwd case).
void norm_cases(Table& t) {
  for (bool save : {true, false})
    t.add_kind("norm_fwd", "LayerNorm", str("13 x 40, saving mean/rstd ", save), [=](Device d) {
      Tensor out = fill(d, {13, 40}, 0.0), mean = save ? fill(d, {13}, 0.0) : Tensor();
      Tensor rstd = save ? fill(d, {13}, 0.0) : Tensor();
      norm_fwd(NormId::layernorm, out, mean, rstd, rnd(d, {13, 40}, 20, 2.0f), rnd(d, {40}, 21),
               rnd(d, {40}, 22), 1e-5f);
      return save ? Outs{out, mean, rstd} : Outs{out};
    });
  t.add_kind("norm_fwd", "LayerNorm", "130 x 1000 in place (out aliases x)", [](Device d) {
    Tensor x = rnd(d, {130, 1000}, 23);
    norm_fwd(NormId::layernorm, x, Tensor(), Tensor(), x, rnd(d, {1000}, 24), rnd(d, {1000}, 25),
             1e-5f);
    return Outs{x};
  });
  for (bool acc : {false, true})
    t.add_kind("norm_bwd", "LayerNorm", str("13 x 40, accumulate_dx ", acc), [=](Device d) {
      Tensor x = rnd(d, {13, 40}, 26), w = rnd(d, {40}, 27), b = rnd(d, {40}, 28);
      Tensor y = fill(d, {13, 40}, 0.0), mean = fill(d, {13}, 0.0), rstd = fill(d, {13}, 0.0);
      norm_fwd(NormId::layernorm, y, mean, rstd, x, w, b, 1e-5f);
      Tensor dx = rnd(d, {13, 40}, 29), dw = rnd(d, {40}, 30), db = rnd(d, {40}, 31);
      norm_bwd(NormId::layernorm, dx, dw, db, rnd(d, {13, 40}, 32), x, w, mean, rstd, acc);
      return Outs{dx, dw, db};
    }, {Tolerance{1e-4, 1e-4}, Tolerance{1e-3, 1e-4}});
  t.add_kind("norm_fwd", "RMSNorm", "13 x 40 with rstd", [](Device d) {
    Tensor out = fill(d, {13, 40}, 0.0), rstd = fill(d, {13}, 0.0);
    norm_fwd(NormId::rmsnorm, out, Tensor(), rstd, rnd(d, {13, 40}, 33, 3.0f), rnd(d, {40}, 34),
             Tensor(), 1e-6f);
    return Outs{out, rstd};
  });
  t.add_kind("norm_fwd", "RMSNorm", "in place, no rstd", [](Device d) {
    Tensor x = rnd(d, {5, 64}, 35);
    norm_fwd(NormId::rmsnorm, x, Tensor(), Tensor(), x, rnd(d, {64}, 36), Tensor(), 1e-5f);
    return Outs{x};
  });
  // bf16 outputs (a norm feeding bf16 products): the fp32 values rounded as cast rounds them.
  const Tolerance bf16_out{1e-2, 1e-2};
  t.add_kind("norm_fwd", "LayerNorm", "13 x 40, bf16 out, saving mean/rstd", [=](Device d) {
    Tensor out = fill(d, {13, 40}, 0.0, DType::BF16), mean = fill(d, {13}, 0.0);
    Tensor rstd = fill(d, {13}, 0.0);
    norm_fwd(NormId::layernorm, out, mean, rstd, rnd(d, {13, 40}, 51, 2.0f), rnd(d, {40}, 52),
             rnd(d, {40}, 53), 1e-5f);
    return Outs{out, mean, rstd};
  }, {bf16_out, Tolerance{}, Tolerance{}});
  t.add_kind("norm_fwd", "RMSNorm", "7 x 1000, bf16 out, no rstd", [=](Device d) {
    Tensor out = fill(d, {7, 1000}, 0.0, DType::BF16);
    norm_fwd(NormId::rmsnorm, out, Tensor(), Tensor(), rnd(d, {7, 1000}, 54, 3.0f),
             rnd(d, {1000}, 55), Tensor(), 1e-6f);
    return Outs{out};
  }, {bf16_out});
  for (bool acc : {false, true})
    t.add_kind("norm_bwd", "RMSNorm", str("13 x 40, accumulate_dx ", acc), [=](Device d) {
      Tensor x = rnd(d, {13, 40}, 37), w = rnd(d, {40}, 38);
      Tensor y = fill(d, {13, 40}, 0.0), rstd = fill(d, {13}, 0.0);
      norm_fwd(NormId::rmsnorm, y, Tensor(), rstd, x, w, Tensor(), 1e-5f);
      Tensor dx = rnd(d, {13, 40}, 39), dw = rnd(d, {40}, 40);
      norm_bwd(NormId::rmsnorm, dx, dw, Tensor(), rnd(d, {13, 40}, 41), x, w, Tensor(), rstd, acc);
      return Outs{dx, dw};
    });
}

void activation_cases(Table& t) {
  for (ActivationId k : {ActivationId::gelu_tanh, ActivationId::gelu}) {
    const char* name = kActivationOps[size_t(k)].name;
    t.add_kind("activation_fwd", name, "33 x 130", [=](Device d) {
      Tensor y = fill(d, {33, 130}, 0.0);
      activation_fwd(k, y, rnd(d, {33, 130}, 42, 2.0f));
      return Outs{y};
    }, {Tolerance{1e-6, 1e-5}});
    // bf16 outputs (an activation feeding a bf16 product), 4-aligned (the GPU's wide loop) and not.
    for (int64_t cols : {128, 130})
      t.add_kind("activation_fwd", name, str("33 x ", cols, ", bf16 out"), [=](Device d) {
        Tensor y = fill(d, {33, cols}, 0.0, DType::BF16);
        activation_fwd(k, y, rnd(d, {33, cols}, 56, 2.0f));
        return Outs{y};
      }, {Tolerance{1e-2, 1e-2}});
    t.add_kind("activation_bwd", name, "33 x 130", [=](Device d) {
      Tensor dx = fill(d, {33, 130}, 0.0);
      activation_bwd(k, dx, rnd(d, {33, 130}, 43), rnd(d, {33, 130}, 44, 2.0f));
      return Outs{dx};
    });
  }
  t.add_kind("activation_fwd", "swiglu", "9 x (2 x 20)", [](Device d) {
    Tensor out = fill(d, {9, 20}, 0.0);
    activation_fwd(ActivationId::swiglu, out, rnd(d, {9, 40}, 45, 2.0f));
    return Outs{out};
  });
  t.add_kind("activation_fwd", "swiglu", "9 x (2 x 20), bf16 out", [](Device d) {
    Tensor out = fill(d, {9, 20}, 0.0, DType::BF16);
    activation_fwd(ActivationId::swiglu, out, rnd(d, {9, 40}, 57, 2.0f));
    return Outs{out};
  }, {Tolerance{1e-2, 1e-2}});
  t.add_kind("activation_bwd", "swiglu", "9 x (2 x 20)", [](Device d) {
    Tensor dx = fill(d, {9, 40}, 0.0);
    activation_bwd(ActivationId::swiglu, dx, rnd(d, {9, 20}, 46), rnd(d, {9, 40}, 47, 2.0f));
    return Outs{dx};
  });
  t.add_kind("activation_fwd", "squared_relu", "7 x 33 in place", [](Device d) {
    Tensor x = rnd(d, {7, 33}, 48);
    activation_fwd(ActivationId::squared_relu, x, x);
    return Outs{x};
  });
  t.add_kind("activation_bwd", "squared_relu", "7 x 33, dx aliases dout", [](Device d) {
    Tensor g = rnd(d, {7, 33}, 49);
    activation_bwd(ActivationId::squared_relu, g, g, rnd(d, {7, 33}, 50));
    return Outs{g};
  });
}

void elementwise_cases(Table& t) {
  const Tolerance tight{1e-6, 1e-5};
  t.add("bias_add", "33 x 130 += [130]", [](Device d) {
    Tensor x = rnd(d, {33, 130}, 60);
    bias_add(x, rnd(d, {130}, 61));
    return Outs{x};
  }, {tight});
  // A width of a multiple of 4 (the GPU's float4 kernel), more rows than one block walks.
  t.add("bias_add", "1031 x 132 += [132]", [](Device d) {
    Tensor x = rnd(d, {1031, 132}, 62);
    bias_add(x, rnd(d, {132}, 63));
    return Outs{x};
  }, {tight});
  t.add("bias_grad", "[130] += column sums of 33 x 130", [](Device d) {
    Tensor db = rnd(d, {130}, 62);
    bias_grad(db, rnd(d, {33, 130}, 63));
    return Outs{db};
  });
  t.add("add", "33 x 130", [](Device d) {
    Tensor out = fill(d, {33, 130}, 0.0);
    add(out, rnd(d, {33, 130}, 64), rnd(d, {33, 130}, 65));
    return Outs{out};
  }, {tight});
  t.add("add", "out aliases a", [](Device d) {
    Tensor a = rnd(d, {1000}, 66);
    add(a, a, rnd(d, {1000}, 67));
    return Outs{a};
  }, {tight});
  t.add("scale", "x *= 0.3", [](Device d) {
    Tensor x = rnd(d, {33, 130}, 68);
    scale(x, 0.3f);
    return Outs{x};
  }, {tight});
  t.add("tanh_fwd", "9 x 130, in place", [](Device d) {
    Tensor x = rnd(d, {9, 130}, 69, 3.0f);
    tanh_fwd(x, x);
    return Outs{x};
  });
  t.add("tanh_bwd", "9 x 130", [](Device d) {
    Tensor y = fill(d, {9, 130}, 0.0);
    tanh_fwd(y, rnd(d, {9, 130}, 70, 3.0f));
    Tensor dx = fill(d, {9, 130}, 0.0);
    tanh_bwd(dx, rnd(d, {9, 130}, 71), y);
    return Outs{dx};
  });
  const DropoutSpec drop{0.3f, 1234, 99, 1000};
  t.add("dropout_fwd", "17 x 300, p .3, element offset 1000", [=](Device d) {
    Tensor out = fill(d, {17, 300}, 0.0);
    dropout_fwd(out, rnd(d, {17, 300}, 69), drop);
    return Outs{out};
  }, {tight});
  t.add("dropout_fwd", "p 0 (identity), in place", [](Device d) {
    Tensor x = rnd(d, {5, 7}, 70);
    dropout_fwd(x, x, DropoutSpec{});
    return Outs{x};
  }, {tight});
  t.add("dropout_bwd", "17 x 300, p .3", [=](Device d) {
    Tensor dx = fill(d, {17, 300}, 0.0);
    dropout_bwd(dx, rnd(d, {17, 300}, 71), drop);
    return Outs{dx};
  }, {tight});
  for (bool with_bias : {true, false})
    t.add("bias_dropout_add_fwd", str("17 x 300, p .3, bias ", with_bias), [=](Device d) {
      Tensor out = fill(d, {17, 300}, 0.0);
      bias_dropout_add_fwd(out, rnd(d, {17, 300}, 72), with_bias ? rnd(d, {300}, 73) : Tensor(),
                           rnd(d, {17, 300}, 74), drop);
      return Outs{out};
    }, {tight});
  t.add("bias_dropout_add_bwd", "17 x 300, p .3, dbias accumulating", [=](Device d) {
    Tensor dx = fill(d, {17, 300}, 0.0), db = rnd(d, {300}, 75);
    bias_dropout_add_bwd(dx, db, rnd(d, {17, 300}, 76), drop);
    return Outs{dx, db};
  }, {tight, Tolerance{}});
}

void rows_cases(Table& t) {
  t.add("index_select_rows", "fp32 rows 10 -> 6 (a repeat)", [](Device d) {
    Tensor out = fill(d, {6, 7}, 0.0);
    index_select_rows(out, rnd(d, {10, 7}, 80), ints(d, {3, 9, 0, 3, 5, 1}, {6}));
    return Outs{out};
  });
  t.add("index_select_rows", "int32, column blocks of wider matrices", [](Device d) {
    std::vector<int32_t> v(10 * 16);
    for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(i * 7 % 101);
    Tensor in = ints(d, v, {10, 16}), out = fill(d, {4, 12}, -1.0, DType::I32);
    index_select_rows(out.narrow(1, 2, 7), in.narrow(1, 4, 7), ints(d, {8, 2, 2, 0}, {4}));
    return Outs{out};
  });
  t.add("index_copy_rows", "distinct rows", [](Device d) {
    Tensor out = rnd(d, {10, 7}, 81);
    index_copy_rows(out, rnd(d, {4, 7}, 82), ints(d, {7, 2, 9, 0}, {4}));
    return Outs{out};
  });
  t.add("index_copy_rows", "accumulate with repeats", [](Device d) {
    Tensor out = rnd(d, {10, 7}, 83);
    index_copy_rows(out, rnd(d, {5, 7}, 84), ints(d, {3, 3, 1, 8, 3}, {5}), true);
    return Outs{out};
  });
  for (DType dt : {DType::F32, DType::BF16})
    t.add("copy_to_flat", str("3 parts, ", dtype_name(dt)), [=](Device d) {
      Tensor flat = fill(d, {25}, 0.0, dt);
      copy_to_flat(flat, {rnd(d, {3, 4}, 85, 1.0f, dt), rnd(d, {5}, 86, 1.0f, dt),
                          rnd(d, {2, 2, 2}, 87, 1.0f, dt)});
      return Outs{flat};
    });
  t.add("copy_from_flat", "3 parts", [](Device d) {
    Outs parts{fill(d, {3, 4}, 0.0), fill(d, {5}, 0.0), fill(d, {2, 2, 2}, 0.0)};
    copy_from_flat(parts, rnd(d, {25}, 88));
    return parts;
  });
}

void rope_cases(Table& t) {
  const int n = 4, g = 2, hd = 6;
  for (const RotaryConfig& rc : {RotaryConfig{6, 1e4, false}, RotaryConfig{4, 500.0, true}}) {
    const std::string what = str("7 rows, rotary_dim ", rc.rotary_dim, ", interleaved ",
                                 rc.interleaved);
    t.add("rope_fwd", what, [=](Device d) {
      Tensor qkv = rnd(d, {7, qkv_width(n, g, hd)}, 110);
      rope_fwd(qkv, ints(d, {0, 3, 5, 1, 9, 2, 400}, {7}), attention_shape(1, 7, n, g, hd), rc);
      return Outs{qkv};
    });
    t.add("rope_bwd", what, [=](Device d) {
      Tensor dqkv = rnd(d, {7, qkv_width(n, g, hd)}, 111);
      rope_bwd(dqkv, ints(d, {0, 3, 5, 1, 9, 2, 400}, {7}), attention_shape(1, 7, n, g, hd), rc);
      return Outs{dqkv};
    });
  }
}

void loss_cases(Table& t) {
  for (bool grad : {true, false})
    t.add("softmax_xent_fwd_bwd", str("7 x 50304, a masked token, write_grad ", grad),
          [grad](Device d) {
            Tensor logits = rnd(d, {7, 50304}, 120, 3.0f), loss = fill(d, {7}, 0.0);
            softmax_xent_fwd_bwd(logits, loss, ids(d, 7, 0, 50304, 5),
                                 ints(d, {1, 1, 1, 0, 1, 1, 1}, {7}).to(DType::F32), 0.125f, grad);
            return Outs{loss, logits};
          }, {Tolerance{1e-5, 1e-5}, Tolerance{1e-7, 1e-4}});
  // One rank holding ids [10, 20) of 30, or the whole vocabulary of 10 (loss and backward).
  auto chain = [](Device d, Outs& in, int64_t start, int64_t vocab, DType target_dtype, int steps,
                  float ls) {
    Tensor logits = rnd(d, {6, 10}, 121, 2.0f);
    Tensor targets = ids(d, 6, 0, vocab, 6);
    if (target_dtype != DType::I32) targets = on(d, targets.to(Device::cpu()).to(target_dtype));
    Tensor mx = fill(d, {6}, 0.0), stats = fill(d, {3, 6}, 0.0);
    Tensor local = fill(d, {6}, 0.0, DType::I64), loss = fill(d, {6}, 0.0);
    vocab_parallel_xent_max(mx, logits, targets, vocab);
    if (steps > 1) vocab_parallel_xent_partials(stats, local, logits, mx, targets, start);
    if (steps > 2) vocab_parallel_xent_loss(loss, logits, stats, vocab, ls);
    in = {logits, mx, stats, local, loss};
  };
  t.add("vocab_parallel_xent_max", "6 x 10 of 30", [chain](Device d) {
    Outs in;
    chain(d, in, 10, 30, DType::I32, 1, 0.0f);
    return Outs{in[1]};
  });
  for (DType dt : {DType::I32, DType::I64})
    t.add("vocab_parallel_xent_partials", str("6 x 10 of 30, ", dtype_name(dt), " targets"),
          [chain, dt](Device d) {
            Outs in;
            chain(d, in, 10, 30, dt, 2, 0.0f);
            return Outs{in[0], in[2], in[3]};
          });
  for (float ls : {0.0f, 0.1f}) {
    t.add("vocab_parallel_xent_loss", str("whole vocabulary of 10, label smoothing ", ls),
          [chain, ls](Device d) {
            Outs in;
            chain(d, in, 0, 10, DType::I32, 3, ls);
            return Outs{in[4], in[0]};
          });
    t.add("vocab_parallel_xent_bwd", str("whole vocabulary of 10, label smoothing ", ls),
          [chain, ls](Device d) {
            Outs in;
            chain(d, in, 0, 10, DType::I32, 3, ls);
            Tensor dlogits = fill(d, {6, 10}, 0.0);
            vocab_parallel_xent_bwd(dlogits, in[0], in[3], rnd(d, {6}, 122), 10, ls);
            return Outs{dlogits};
          });
  }
}

void optimizer_reduction_cases(Table& t) {
  // The fp32 main weights alone (fp32 training), or with an fp32, bf16 or fp16 model copy.
  for (const char* copy : {"bfloat16", "float16", "float32", "none"})
    t.add("adamw_step", str("70001 params, step 7, wd .1, model copy ", copy), [copy](Device d) {
      const Shape s{70001};
      Tensor master = rnd(d, s, 130), m = rnd(d, s, 131, 0.001f), v = squares(d, s, 132, 0.001f);
      const bool with_copy = std::string(copy) != "none";
      Tensor model_copy = with_copy ? fill(d, s, 0.0, dtype_from_name(copy)) : Tensor();
      adamw_step(master, rnd(d, s, 133, 0.01f), m, v, model_copy,
                 AdamWConfig{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7});
      return with_copy ? Outs{master, m, v, model_copy} : Outs{master, m, v};
    }, {Tolerance{1e-7, 1e-6}, Tolerance{1e-9, 1e-6}, Tolerance{1e-12, 1e-6}, Tolerance{0.0, 1e-2}});
  for (float momentum : {0.0f, 0.9f})
    for (bool first : {true, false})
      t.add("sgd_step", str("1000 params, momentum ", momentum, ", first step ", first),
            [=](Device d) {
              Tensor p = rnd(d, {1000}, 134), buf = rnd(d, {1000}, 135);
              sgd_step(p, rnd(d, {1000}, 136), buf, 0.1f, 0.01f, momentum, first);
              return Outs{p, buf};
            });
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    t.add("l2_norm_squared", str("4097 ", dtype_name(dt)), [dt](Device d) {
      return Outs{scalar(l2_norm_squared(rnd(d, {4097}, 137, 1.0f, dt)))};
    }, {Tolerance{0.0, 1e-6}});
    t.add("all_finite", str("finite ", dtype_name(dt)), [dt](Device d) {
      return Outs{scalar(all_finite(rnd(d, {4097}, 138, 1.0f, dt)))};
    }, {Tolerance{0.0, 0.0}});
  }
  // Each tensor's sum of squares: empty tensors, several chunks, a view at an offset, and a list
  // with bf16 in it (read one by one); a NaN makes its own tensor's sum NaN and no other.
  t.add("l2_norm_squared_each", "fp32: 0, 7, 65536, 200003 elements, a view at offset 1000, 0",
        [](Device d) {
          const Tensor big = rnd(d, {200003}, 147);
          return Outs{doubles(l2_norm_squared_each({rnd(d, {0}, 148), rnd(d, {7}, 149),
                                                     rnd(d, {65536}, 150), big,
                                                     big.narrow(0, 1000, 70001), rnd(d, {0}, 151)}))};
        }, {Tolerance{0.0, 1e-9}});
  t.add("l2_norm_squared_each", "fp32, bf16, fp32", [](Device d) {
    return Outs{doubles(l2_norm_squared_each(
        {rnd(d, {3000}, 152), rnd(d, {3000}, 153, 1.0f, DType::BF16), rnd(d, {70000}, 154)}))};
  }, {Tolerance{0.0, 1e-9}});
  t.add("l2_norm_squared_each", "a NaN in the second of three", [](Device d) {
    Tensor x = rnd(Device::cpu(), {70000}, 155);
    x.data<float>()[66000] = NAN;
    const std::vector<double> r =
        l2_norm_squared_each({rnd(d, {100}, 156), on(d, x), rnd(d, {100}, 157)});
    return Outs{scalar(std::isfinite(r[0])), scalar(std::isnan(r[1])), scalar(std::isfinite(r[2]))};
  }, {Tolerance{0.0, 0.0}});
  t.add("all_finite", "a NaN at 3000 of 4097", [](Device d) {
    Tensor x = rnd(Device::cpu(), {4097}, 139);
    x.data<float>()[3000] = NAN;
    return Outs{scalar(all_finite(on(d, x)))};
  }, {Tolerance{0.0, 0.0}});
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16})
    t.add("sum", str("100003 ", dtype_name(dt)), [dt](Device d) {
      return Outs{scalar(sum(rnd(d, {100003}, 140, 1.0f, dt)))};
    });
  t.add("dot", "fp32 . fp32", [](Device d) {
    return Outs{scalar(dot(rnd(d, {5000}, 141), rnd(d, {5000}, 142)))};
  });
  t.add("dot", "bf16 . fp32", [](Device d) {
    return Outs{scalar(dot(rnd(d, {5000}, 143, 1.0f, DType::BF16), rnd(d, {5000}, 144)))};
  });
  for (int64_t n : {int64_t(0), int64_t(7), int64_t(200003)})
    t.add("int_range", str(n, " ids in [-5, 90)"), [n](Device d) {
      const IntRange r = int_range(ids(d, n, -5, 90, 146));
      return Outs{scalar(double(r.min)), scalar(double(r.max))};
    }, {Tolerance{0.0, 0.0}});
  const std::vector<std::pair<DType, DType>> casts = {
      {DType::F32, DType::BF16}, {DType::F32, DType::F16}, {DType::BF16, DType::F32},
      {DType::F16, DType::F32},  {DType::F32, DType::F64}, {DType::BF16, DType::F16},
      {DType::F64, DType::F32},  {DType::F64, DType::BF16}};
  for (auto [from, to] : casts)
    t.add("cast", str(dtype_name(from), " -> ", dtype_name(to), ", 4097 values of scale 100"),
          [from, to](Device d) {
            Tensor dst = fill(d, {4097}, 0.0, to);
            cast(dst, rnd(d, {4097}, 145, 100.0f, from));
            return Outs{dst};
          }, {Tolerance{0.0, 0.0}});
  // A multiple of 8 values: the GPU's 8-a-thread fp32 -> bf16 kernel.
  t.add("cast", "float32 -> bfloat16, 8 x 4099 values of scale 100", [](Device d) {
    Tensor dst = fill(d, {8, 4099}, 0.0, DType::BF16);
    cast(dst, rnd(d, {8, 4099}, 147, 100.0f));
    return Outs{dst};
  }, {Tolerance{0.0, 0.0}});
}

}  // namespace

std::vector<OpCase> backend_op_cases() {
  Table t;
  matmul_cases(t);
  embedding_cases(t);
  norm_cases(t);
  activation_cases(t);
  elementwise_cases(t);
  rows_cases(t);
  attention_cases(t);
  rope_cases(t);
  loss_cases(t);
  optimizer_reduction_cases(t);
  return t.take();
}

}  // namespace megatron::ops::testing
