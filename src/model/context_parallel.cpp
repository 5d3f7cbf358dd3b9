// Context-parallel sequence layout, batch slicing and the attention exchange (see
// context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>

#include "model/gpt_model.h"

namespace megatron::model {

CpCommType parse_cp_comm_type(const std::string& name) {
  if (name == "p2p") return CpCommType::P2P;
  if (name == "allgather") return CpCommType::AllGather;
  MG_REQUIRE(name != "a2a" && name != "a2a+p2p", "--cp-comm-type ", name, " (the all-to-all of "
             "attention heads) is not implemented; use p2p (the ring, the default) or allgather");
  MG_THROW("--cp-comm-type must be p2p or allgather, got '", name, "'");
}

ContextParallel ContextParallel::none() {
  static const std::shared_ptr<Communicator> one = make_self_communicator("cp");
  return ContextParallel{one};
}

int64_t context_parallel_position(int64_t i, int64_t local_seq, int rank, int size) {
  if (size == 1) return i;
  const int64_t chunk = local_seq / 2;
  return i < chunk ? int64_t(rank) * chunk + i : int64_t(2 * size - 1 - rank) * chunk + (i - chunk);
}

Tensor context_parallel_positions(int64_t local_seq, int rank, int size) {
  Tensor t = Tensor::empty({local_seq}, DType::I32);
  for (int64_t i = 0; i < local_seq; ++i)
    t.data<int32_t>()[i] = int32_t(context_parallel_position(i, local_seq, rank, size));
  return t;
}

namespace {

// Copies rows between the rank-major layout [C][b][S/C] (what the all-gather produces) and
// sequence order [b][S]: to_sequence = true moves rank-major -> sequence.
void permute_rows(const Tensor& src, const Tensor& dst, int64_t batch, int size, bool to_sequence) {
  const int64_t w = src.size(1), seq = src.size(0) / batch, local = seq / size;
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  for (int r = 0; r < size; ++r)
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < local; ++i) {
        const int64_t rank_major = (int64_t(r) * batch + bi) * local + i;
        const int64_t in_order = bi * seq + context_parallel_position(i, local, r, size);
        const int64_t from = to_sequence ? rank_major : in_order;
        const int64_t to = to_sequence ? in_order : rank_major;
        std::copy(s + from * w, s + (from + 1) * w, d + to * w);
      }
}

}  // namespace

Tensor GatherFromContextParallelRegion::forward(const ContextParallel& cp, const Tensor& local,
                                                int64_t batch) {
  const int C = cp.size();
  if (C == 1) return local;
  MG_CHECK(local.dim() == 2 && local.size(0) % batch == 0, "context-parallel gather: ",
           shape_str(local.shape()), " is not [batch * local_seq, width]");
  const Tensor in = local.contiguous();
  Tensor gathered = Tensor::empty({C * in.size(0), in.size(1)}, DType::F32);
  cp.group->all_gather(in, gathered);
  Tensor full = Tensor::empty(gathered.shape(), DType::F32);
  permute_rows(gathered, full, batch, C, true);
  return full;
}

Tensor GatherFromContextParallelRegion::backward(const ContextParallel& cp, const Tensor& dfull,
                                                 int64_t batch) {
  const int C = cp.size();
  if (C == 1) return dfull;
  MG_CHECK(dfull.dim() == 2 && dfull.size(0) % (batch * C) == 0, "context-parallel "
           "reduce-scatter: ", shape_str(dfull.shape()), " is not [batch * seq, width]");
  const Tensor in = dfull.contiguous();
  Tensor rank_major = Tensor::empty(in.shape(), DType::F32);
  permute_rows(in, rank_major, batch, C, false);
  Tensor out = Tensor::empty({in.size(0) / C, in.size(1)}, DType::F32);
  cp.group->reduce_scatter(rank_major, out, ReduceOp::Sum);
  return out;
}

namespace {

constexpr int kTagKV = 7101, kTagDKV = 7102;

// The key and value columns of fused QKV rows [rows, g*(n/g+2)*d], packed per group -> [rows,
// g*2*d] (a group's key head and value head are adjacent in the QKV row).
Tensor pack_kv(const Tensor& qkv, const ops::AttentionShape& sh) {
  const int hpg = sh.heads / sh.groups;
  const int64_t d = sh.head_dim, W = int64_t(sh.groups) * (hpg + 2) * d, KW = int64_t(sh.groups) * 2 * d;
  const int64_t rows = qkv.numel() / W;
  Tensor kv = Tensor::empty({rows, KW}, DType::F32);
  const float* x = qkv.data<float>();
  float* o = kv.data<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int g = 0; g < sh.groups; ++g) {
      const float* k = x + i * W + (int64_t(g) * (hpg + 2) + hpg) * d;
      std::copy(k, k + 2 * d, o + i * KW + int64_t(g) * 2 * d);
    }
  return kv;
}

// dqkv's key and value columns <- dkv (the inverse of pack_kv's column map).
void unpack_kv(const Tensor& dkv, const Tensor& dqkv, const ops::AttentionShape& sh) {
  const int hpg = sh.heads / sh.groups;
  const int64_t d = sh.head_dim, W = int64_t(sh.groups) * (hpg + 2) * d, KW = int64_t(sh.groups) * 2 * d;
  const int64_t rows = dqkv.numel() / W;
  const float* s = dkv.data<float>();
  float* o = dqkv.data<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int g = 0; g < sh.groups; ++g) {
      const float* k = s + i * KW + int64_t(g) * 2 * d;
      std::copy(k, k + 2 * d, o + i * W + (int64_t(g) * (hpg + 2) + hpg) * d);
    }
}

ops::AttentionShape block_shape(const ContextParallel& cp, const ops::AttentionShape& local) {
  ops::AttentionShape b = local;
  b.kv_seq = local.seq;
  b.full_seq = int64_t(cp.size()) * local.seq;
  return b;
}

}  // namespace

void ring_attention_fwd(const ContextParallel& cp, const Tensor& ctx, const Tensor& lse,
                        const Tensor& qkv, const Tensor& attention_start,
                        const ops::AttentionShape& shape, const ops::DropoutSpec& dropout) {
  const int C = cp.size(), r = cp.rank(), next = (r + 1) % C, prev = (r + C - 1) % C;
  const ops::AttentionShape sh = block_shape(cp, shape);
  const Tensor q = qkv.contiguous();
  const Tensor qpos = context_parallel_positions(sh.seq, r, C);
  Tensor kv = pack_kv(q, sh), incoming = Tensor::empty(kv.shape(), DType::F32);
  Tensor cb = Tensor::empty(ctx.shape(), DType::F32), lb = Tensor::empty(lse.shape(), DType::F32);
  for (int i = 0; i < C; ++i) {
    const int src = (r + C - i) % C;  // whose keys and values this step holds
    CommHandle recv, send;
    if (i + 1 < C) {  // the next block travels while this one is computed
      recv = cp.group->recv_async(incoming, prev, kTagKV);
      send = cp.group->send_async(kv, next, kTagKV);
    }
    const Tensor kpos = context_parallel_positions(sh.seq, src, C);
    if (i == 0) {
      ops::attention_block_fwd(ctx, lse, q, qpos, kv, kpos, attention_start, sh, dropout);
    } else {
      ops::attention_block_fwd(cb, lb, q, qpos, kv, kpos, attention_start, sh, dropout);
      ops::attention_merge(ctx, lse, cb, lb, sh);
    }
    if (i + 1 < C) {
      send.wait();
      recv.wait();
      std::swap(kv, incoming);
    }
  }
}

Tensor ring_attention_bwd(const ContextParallel& cp, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& ctx, const Tensor& lse, const Tensor& attention_start,
                          const ops::AttentionShape& shape, const ops::DropoutSpec& dropout) {
  const int C = cp.size(), r = cp.rank(), next = (r + 1) % C, prev = (r + C - 1) % C;
  const ops::AttentionShape sh = block_shape(cp, shape);
  const Tensor q = qkv.contiguous(), dc = dctx.contiguous();
  const Tensor qpos = context_parallel_positions(sh.seq, r, C);
  Tensor delta = Tensor::empty(lse.shape(), DType::F32);
  ops::attention_delta(delta, dc, ctx, sh);
  Tensor kv = pack_kv(q, sh), incoming = Tensor::empty(kv.shape(), DType::F32);
  Tensor dq = Tensor::zeros(q.shape(), DType::F32);
  // The dK / dV accumulator of a block travels one step behind it: at step i this rank adds its
  // queries' part to the accumulator of block r-i, which ranks r-i .. r-1 have filled so far.
  Tensor acc_in = Tensor::empty(kv.shape(), DType::F32), sending;
  CommHandle acc_send;
  for (int i = 0; i < C; ++i) {
    const int src = (r + C - i) % C;
    CommHandle recv, send, acc_recv;
    if (i + 1 < C) {
      recv = cp.group->recv_async(incoming, prev, kTagKV);
      send = cp.group->send_async(kv, next, kTagKV);
    }
    if (i > 0) acc_recv = cp.group->recv_async(acc_in, prev, kTagDKV);
    Tensor mine = Tensor::zeros(kv.shape(), DType::F32);
    ops::attention_block_bwd(dq, mine, dc, q, qpos, kv, context_parallel_positions(sh.seq, src, C),
                             lse, delta, attention_start, sh, dropout);
    if (i > 0) {
      acc_recv.wait();
      float* m = mine.data<float>();
      const float* a = acc_in.data<float>();
      for (int64_t k = 0; k < mine.numel(); ++k) m[k] += a[k];
    }
    acc_send.wait();
    sending = mine;
    acc_send = cp.group->send_async(sending, next, kTagDKV);  // the last one reaches the owner
    if (i + 1 < C) {
      send.wait();
      recv.wait();
      std::swap(kv, incoming);
    }
  }
  Tensor own = Tensor::empty(kv.shape(), DType::F32);
  cp.group->recv_async(own, prev, kTagDKV).wait();
  acc_send.wait();
  unpack_kv(own, dq, sh);  // dq's key / value columns are still zero
  return dq;
}

GPTInputs slice_for_context_parallel(const GPTInputs& in, int rank, int size) {
  if (size == 1) return in;
  MG_REQUIRE(in.tokens.defined() && in.tokens.dim() == 2, "context parallelism: tokens must be "
             "a [batch, seq] tensor");
  const int64_t b = in.tokens.size(0), s = in.tokens.size(1);
  MG_REQUIRE(s % (2 * size) == 0, "sequence length ", s, " is not divisible by 2 x "
             "--context-parallel-size = ", 2 * size, " (the sequence is cut into 2 x CP chunks "
             "for causal load balancing)");
  const int64_t local = s / size;
  auto slice = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    MG_REQUIRE(t.shape() == in.tokens.shape(), "context parallelism: a batch tensor has shape ",
               shape_str(t.shape()), ", not the tokens' ", shape_str(in.tokens.shape()));
    const Tensor src = t.contiguous();
    Tensor out = Tensor::empty({b, local}, src.dtype());
    const size_t el = dtype_size(src.dtype());
    const char* sp = static_cast<const char*>(src.raw_data());
    char* op = static_cast<char*>(out.raw_data());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < local; ++i)
        std::copy_n(sp + size_t(bi * s + context_parallel_position(i, local, rank, size)) * el, el,
                    op + size_t(bi * local + i) * el);
    return out;
  };
  return GPTInputs{slice(in.tokens), slice(in.position_ids), slice(in.attention_start),
                   slice(in.labels), slice(in.loss_mask), slice(in.padding_mask)};
}

}  // namespace megatron::model
