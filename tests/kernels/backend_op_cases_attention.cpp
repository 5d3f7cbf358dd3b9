// The op cases of the core attention op, its merge and the KV cache (see backend_ops.h): each
// operand layout (fused QKV, a separate Q with a fused KV, fused-QKV queries against a packed KV
// block at key positions, a KV cache read through kv_index), the masks, a bias and dropout;
// backward written and accumulated.
#include "op_case_util.h"

namespace megatron::ops::testing {

namespace {

// One forward call's tensors; `grads` (same shapes as the operands and bias) for the backward.
struct AttentionCall {
  AttentionInputs in;
  AttentionMask mask;
  AttentionShape shape;
  DropoutSpec dropout;
  Tensor out, lse, probs;
  AttentionGrads grads;
};

struct Variant {
  std::string what;
  bool save_probs = false;
  std::function<AttentionCall(Device)> make;  // inputs, mask, shape, dropout
};

AttentionShape shape_of(int64_t b, int64_t sq, int64_t skv, int n, int g, int d) {
  AttentionShape sh = attention_shape(b, sq, n, g, d);
  sh.kv_seq = skv;
  return sh;
}

// Self-attention over random fused QKV rows [b * s, width].
AttentionCall fused_qkv(Device d, int64_t b, int64_t s, int n, int g, int hd, uint64_t stream,
                        DType dtype = DType::F32) {
  AttentionCall c;
  c.shape = shape_of(b, s, s, n, g, hd);
  c.in.q = c.in.k = c.in.v = rnd(d, {b * s, qkv_width(n, g, hd)}, stream, 1.0f, dtype);
  c.in.q_layout = HeadLayout::qkv(QkvPart::Query, n, g, hd, s);
  c.in.k_layout = HeadLayout::qkv(QkvPart::Key, n, g, hd, s);
  c.in.v_layout = HeadLayout::qkv(QkvPart::Value, n, g, hd, s);
  return c;
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (bool save : {true, false})
    v.push_back({str("fused QKV, causal, GQA, starts, dropout .3, probs saved ", save), save,
                 [](Device d) {
                   AttentionCall c = fused_qkv(d, 2, 9, 4, 2, 3, 90);
                   std::vector<int32_t> st(18);
                   for (int i = 0; i < 18; ++i) st[size_t(i)] = i % 9 >= 3 ? 3 : 0;
                   c.mask.attention_start = ints(d, st, {2, 9});
                   c.dropout = DropoutSpec{0.3f, 5, 9};
                   return c;
                 }});
  v.push_back({"fused QKV, bidirectional, key padding, window (2, 1), ALiBi", true, [](Device d) {
                 AttentionCall c = fused_qkv(d, 2, 7, 4, 2, 3, 91);
                 c.mask.causal = false;
                 c.mask.window_left = 2;
                 c.mask.window_right = 1;
                 c.mask.alibi = true;
                 c.mask.key_padding = ints(d, {1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 7});
                 return c;
               }});
  v.push_back({"separate Q (5 rows) vs fused KV (8 rows), padding, per-row bias, dropout .2",
               false, [](Device d) {
                 AttentionCall c;
                 c.shape = shape_of(2, 5, 8, 4, 4, 3);
                 c.in.q = rnd(d, {10, 12}, 92);
                 c.in.k = c.in.v = rnd(d, {16, 24}, 93);
                 c.in.q_layout = HeadLayout::heads(4, 3, 5);
                 c.in.k_layout = HeadLayout::kv(QkvPart::Key, 4, 3, 8);
                 c.in.v_layout = HeadLayout::kv(QkvPart::Value, 4, 3, 8);
                 c.in.bias = rnd(d, {2, 4, 5, 8}, 94);
                 c.mask.causal = false;
                 c.mask.key_padding = ints(d, {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 8});
                 c.dropout = DropoutSpec{0.2f, 6, 7};
                 return c;
               }});
  v.push_back({"queries at {0, 1, 10, 11} vs a KV block at {2, 3, 8, 9} of 12, broadcast bias",
               false, [](Device d) {
                 AttentionCall c;
                 c.shape = shape_of(2, 4, 4, 4, 2, 3);
                 c.shape.q_span = c.shape.kv_span = 12;
                 c.in.q = rnd(d, {8, qkv_width(4, 2, 3)}, 95);
                 c.in.k = c.in.v = rnd(d, {8, 12}, 96);
                 c.in.q_layout = HeadLayout::qkv(QkvPart::Query, 4, 2, 3, 4);
                 c.in.k_layout = HeadLayout::kv(QkvPart::Key, 2, 3, 4);
                 c.in.v_layout = HeadLayout::kv(QkvPart::Value, 2, 3, 4);
                 c.in.q_positions = ints(d, {0, 1, 10, 11}, {4});
                 c.in.kv_positions = ints(d, {2, 3, 8, 9}, {4});
                 c.in.bias = rnd(d, {1, 4, 12, 12}, 97);
                 c.mask.attention_start = ints(d, {0, 0, 0, 3, 0, 0, 1, 1}, {2, 4});
                 c.dropout = DropoutSpec{0.3f, 5, 9};
                 return c;
               }});
  // Longer than one 32-key chunk of the CUDA kernels, head dims over one 32-lane chunk.
  v.push_back({"fused QKV, 2 x 70 rows, 4 heads in 2 groups of 40, causal, window 50, dropout .1",
               false, [](Device d) {
                 AttentionCall c = fused_qkv(d, 2, 70, 4, 2, 40, 101);
                 c.mask.window_left = 50;
                 c.dropout = DropoutSpec{0.1f, 8, 3};
                 return c;
               }});
  v.push_back({"Q (33 rows) vs fused KV (75 rows) of head dim 72, bidirectional, padding, ALiBi",
               true, [](Device d) {
                 AttentionCall c;
                 c.shape = shape_of(1, 33, 75, 2, 1, 72);
                 c.in.q = rnd(d, {33, 144}, 102);
                 c.in.k = c.in.v = rnd(d, {75, 144}, 103);
                 c.in.q_layout = HeadLayout::heads(2, 72, 33);
                 c.in.k_layout = HeadLayout::kv(QkvPart::Key, 1, 72, 75);
                 c.in.v_layout = HeadLayout::kv(QkvPart::Value, 1, 72, 75);
                 std::vector<int32_t> pad(75, 1);
                 for (int j = 60; j < 75; ++j) pad[size_t(j)] = 0;
                 c.mask.key_padding = ints(d, pad, {1, 75});
                 c.mask.causal = false;
                 c.mask.alibi = true;
                 return c;
               }});
  return v;
}

// bf16 operands (a bf16 model's activations): on the GPU the tensor-core kernels (head dims 64
// and 128, causal or bidirectional, grouped query heads, dropout; tiles of 64 rows, so lengths
// that leave partial tiles), and for a call they do not take the general kernels on fp32 copies.
std::vector<Variant> bf16_variants() {
  std::vector<Variant> v;
  v.push_back({"bf16 fused QKV, 2 x 130 rows, 4 heads in 2 groups of 64, causal", false,
               [](Device d) { return fused_qkv(d, 2, 130, 4, 2, 64, 120, DType::BF16); }});
  v.push_back({"bf16 fused QKV, 1 x 100 rows, 2 heads of 128, bidirectional, dropout .1", false,
               [](Device d) {
                 AttentionCall c = fused_qkv(d, 1, 100, 2, 2, 128, 121, DType::BF16);
                 c.mask.causal = false;
                 c.dropout = DropoutSpec{0.1f, 8, 4};
                 return c;
               }});
  v.push_back({"bf16 fused QKV, 1 x 96 rows, 2 heads of 64, causal, dropout .2", false,
               [](Device d) {
                 AttentionCall c = fused_qkv(d, 1, 96, 2, 2, 64, 122, DType::BF16);
                 c.dropout = DropoutSpec{0.2f, 9, 5};
                 return c;
               }});
  v.push_back({"bf16 fused QKV, 2 x 70 rows, 4 heads in 2 groups of 40, causal, window 50", false,
               [](Device d) {
                 AttentionCall c = fused_qkv(d, 2, 70, 4, 2, 40, 123, DType::BF16);
                 c.mask.window_left = 50;
                 return c;
               }});
  return v;
}

AttentionCall forward(const Variant& v, Device d) {
  AttentionCall c = v.make(d);
  const AttentionShape& sh = c.shape;
  const int64_t skv = sh.kv_seq > 0 ? sh.kv_seq : sh.seq;
  c.out = fill(d, {sh.batch * sh.seq, int64_t(sh.heads) * sh.head_dim}, 0.0);
  c.lse = fill(d, {sh.batch, sh.heads, sh.seq}, 0.0);
  if (v.save_probs) c.probs = fill(d, {sh.batch, sh.heads, sh.seq, skv}, 0.0);
  attention_fwd(c.out, c.lse, c.probs, c.in, c.mask, sh, c.dropout);
  const bool fused = c.in.q.storage() == c.in.k.storage();
  c.grads.dq = fill(d, c.in.q.shape(), 0.5);
  c.grads.dk = c.grads.dv = fused ? c.grads.dq : fill(d, c.in.k.shape(), 0.5);
  if (c.in.bias.defined()) c.grads.dbias = fill(d, c.in.bias.shape(), 0.5);
  return c;
}

Outs grad_outputs(const AttentionCall& c) {
  Outs o{c.grads.dq};
  if (c.grads.dk.storage() != c.grads.dq.storage()) o.push_back(c.grads.dk);
  if (c.grads.dbias.defined()) o.push_back(c.grads.dbias);
  return o;
}

}  // namespace

void attention_cases(Table& t) {
  for (const Variant& v : variants()) {
    t.add("attention_fwd", v.what, [v](Device d) {
      const AttentionCall c = forward(v, d);
      return c.probs.defined() ? Outs{c.out, c.lse, c.probs} : Outs{c.out, c.lse};
    }, {Tolerance{1e-5, 1e-4}});
    for (bool accumulate : {false, true})
      t.add("attention_bwd", v.what + (accumulate ? ", accumulated" : ", written"),
            [v, accumulate](Device d) {
              const AttentionCall c = forward(v, d);
              attention_bwd(c.grads, rnd(d, c.out.shape(), 98), c.out, c.lse, c.probs, c.in,
                            c.mask, c.shape, c.dropout, accumulate);
              return grad_outputs(c);
            }, {Tolerance{1e-4, 1e-4}});
  }
  for (const Variant& v : bf16_variants()) {
    t.add("attention_fwd", v.what, [v](Device d) {
      const AttentionCall c = forward(v, d);
      return Outs{c.out, c.lse};
    }, {Tolerance{2e-2, 2e-2}, Tolerance{1e-4, 1e-4}});
    for (bool accumulate : {false, true})
      t.add("attention_bwd", v.what + (accumulate ? ", accumulated" : ", written"),
            [v, accumulate](Device d) {
              const AttentionCall c = forward(v, d);
              attention_bwd(c.grads, rnd(d, c.out.shape(), 124), c.out, c.lse, c.probs, c.in,
                            c.mask, c.shape, c.dropout, accumulate);
              return grad_outputs(c);
            }, {Tolerance{2e-2, 2e-2}});
  }
  t.add("attention_merge", "a partial result into a running one", [](Device d) {
    const std::vector<Variant> vs = variants();
    const AttentionCall c = forward(vs[3], d);
    Tensor out = rnd(d, c.out.shape(), 99), lse = rnd(d, c.lse.shape(), 100);
    attention_merge(out, lse, c.out, c.lse, c.shape);
    return Outs{out, lse};
  });
  // KV cache: 2 slots of 8 positions; slot 0 prefills positions 0..4, slot 1 positions 0..2.
  auto cache = [](Device d, Outs& in) {
    const int heads = 4, groups = 2, hd = 5;
    AttentionShape sh = attention_shape(0, 0, heads, groups, hd);
    Tensor kc = fill(d, {2, groups, 8, hd}, 0.0), vc = fill(d, {2, groups, 8, hd}, 0.0);
    Tensor qkv = rnd(d, {8, qkv_width(heads, groups, hd)}, 112);
    Tensor slot = ints(d, {0, 0, 0, 0, 0, 1, 1, 1}, {8}), pos = ints(d, {0, 1, 2, 3, 4, 0, 1, 2}, {8});
    kv_cache_append(kc, vc, qkv, slot, pos, sh);
    in = {kc, vc, qkv, slot, pos};
    return sh;
  };
  t.add("kv_cache_append", "8 rows into 2 slots", [cache](Device d) {
    Outs in;
    cache(d, in);
    return Outs{in[0], in[1]};
  });
  for (bool masks : {false, true})
    t.add("attention_fwd", str("KV cache: prefill of 2 slots by kv_index, window 2 + ALiBi ", masks),
          [cache, masks](Device d) {
            Outs c;
            AttentionShape sh = cache(d, c);
            sh.batch = 8;
            sh.seq = 1;
            sh.kv_seq = sh.q_span = 8;
            AttentionInputs in;
            in.q = c[2];
            in.q_layout = HeadLayout::qkv(QkvPart::Query, 4, 2, 5, 1);
            in.k = c[0];
            in.v = c[1];
            in.k_layout = in.v_layout = HeadLayout::cache(2, 8, 5);
            in.kv_index = c[3];
            in.q_positions = c[4];
            AttentionMask mask;
            if (masks) {
              mask.window_left = 2;
              mask.alibi = true;
            }
            Tensor out = fill(d, {8, 20}, 0.0);
            attention_fwd(out, Tensor(), Tensor(), in, mask, sh, DropoutSpec{});
            return Outs{out};
          });
}

}  // namespace megatron::ops::testing
