// Context-parallel sequence layout, batch slicing and the attention exchange (see
// context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <vector>

#include "kernels/ops.h"

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

Tensor context_parallel_positions(int64_t local_seq, int rank, int size, Device device) {
  std::vector<int32_t> pos(static_cast<size_t>(local_seq));
  for (int64_t i = 0; i < local_seq; ++i)
    pos[size_t(i)] = int32_t(context_parallel_position(i, local_seq, rank, size));
  return Tensor::from_vector(pos, {local_seq}, device);
}

namespace {

// 0, 1, ..., n-1 as an int32 index (a plain row copy through the row ops).
Tensor iota_index(int64_t n, Device device) {
  std::vector<int32_t> ix(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ix[size_t(i)] = int32_t(i);
  return Tensor::from_vector(ix, {n}, device);
}

// Copies rows between the rank-major layout [C][b][S/C] (what the all-gather produces) and
// sequence order [b][S]: to_sequence = true moves rank-major -> sequence.
void permute_rows(const Tensor& src, const Tensor& dst, int64_t batch, int size, bool to_sequence) {
  const int64_t rows = src.size(0), seq = rows / batch, local = seq / size;
  // source[k]: the row of src that lands in row k of dst.
  std::vector<int32_t> source(static_cast<size_t>(rows));
  for (int r = 0; r < size; ++r)
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < local; ++i) {
        const int64_t rank_major = (int64_t(r) * batch + bi) * local + i;
        const int64_t in_order = bi * seq + context_parallel_position(i, local, r, size);
        if (to_sequence)
          source[size_t(in_order)] = int32_t(rank_major);
        else
          source[size_t(rank_major)] = int32_t(in_order);
      }
  ops::index_select_rows(dst, src, Tensor::from_vector(source, {rows}, src.device()));
}

}  // namespace

Tensor GatherFromContextParallelRegion::forward(const ContextParallel& cp, const Tensor& local,
                                                int64_t batch) {
  const int C = cp.size();
  if (C == 1) return local;
  MG_CHECK(local.dim() == 2 && local.size(0) % batch == 0, "context-parallel gather: ",
           shape_str(local.shape()), " is not [batch * local_seq, width]");
  const Tensor in = local.contiguous();
  Tensor gathered = Tensor::empty({C * in.size(0), in.size(1)}, DType::F32, in.device());
  cp.group->all_gather(in, gathered);
  Tensor full = Tensor::empty(gathered.shape(), DType::F32, in.device());
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
  Tensor rank_major = Tensor::empty(in.shape(), DType::F32, in.device());
  permute_rows(in, rank_major, batch, C, false);
  Tensor out = Tensor::empty({in.size(0) / C, in.size(1)}, DType::F32, in.device());
  cp.group->reduce_scatter(rank_major, out, ReduceOp::Sum);
  return out;
}

namespace {

constexpr int kTagKV = 7101, kTagDKV = 7102;

// The key and value columns of fused QKV rows [rows, g*(n/g+2)*d], packed per group -> [rows,
// g*2*d] (a group's key head and value head are adjacent in the QKV row).
// Seen as [rows * groups, (n/g + 2) * d], the key and value heads of every group are the column
// block [n/g * d, (n/g + 2) * d): a row-strided view the row ops copy.
Tensor kv_columns(const Tensor& qkv, const ops::AttentionShape& sh) {
  const int hpg = sh.heads / sh.groups;
  const int64_t d = sh.head_dim, GW = int64_t(hpg + 2) * d;
  return qkv.view({qkv.numel() / GW, GW}).narrow(1, int64_t(hpg) * d, 2 * d);
}

Tensor pack_kv(const Tensor& qkv, const ops::AttentionShape& sh) {
  const Tensor cols = kv_columns(qkv, sh);
  const int64_t rows = cols.size(0) / sh.groups;
  Tensor kv = Tensor::empty({rows, int64_t(sh.groups) * 2 * sh.head_dim}, DType::F32, qkv.device());
  ops::index_select_rows(kv.view({cols.size(0), cols.size(1)}), cols,
                         iota_index(cols.size(0), qkv.device()));
  return kv;
}

// dqkv's key and value columns <- dkv (the inverse of pack_kv's column map).
void unpack_kv(const Tensor& dkv, const Tensor& dqkv, const ops::AttentionShape& sh) {
  const Tensor cols = kv_columns(dqkv, sh);
  ops::index_copy_rows(cols, dkv.view({cols.size(0), cols.size(1)}),
                       iota_index(cols.size(0), dkv.device()));
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
  const Device dev = q.device();
  const Tensor qpos = context_parallel_positions(sh.seq, r, C, dev);
  Tensor kv = pack_kv(q, sh), incoming = Tensor::empty(kv.shape(), DType::F32, dev);
  Tensor cb = Tensor::empty(ctx.shape(), DType::F32, dev);
  Tensor lb = Tensor::empty(lse.shape(), DType::F32, dev);
  for (int i = 0; i < C; ++i) {
    const int src = (r + C - i) % C;  // whose keys and values this step holds
    CommHandle recv, send;
    if (i + 1 < C) {  // the next block travels while this one is computed
      recv = cp.group->recv_async(incoming, prev, kTagKV);
      send = cp.group->send_async(kv, next, kTagKV);
    }
    const Tensor kpos = context_parallel_positions(sh.seq, src, C, dev);
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
  const Device dev = q.device();
  const Tensor qpos = context_parallel_positions(sh.seq, r, C, dev);
  Tensor delta = Tensor::empty(lse.shape(), DType::F32, dev);
  ops::attention_delta(delta, dc, ctx, sh);
  Tensor kv = pack_kv(q, sh), incoming = Tensor::empty(kv.shape(), DType::F32, dev);
  Tensor dq = Tensor::zeros(q.shape(), DType::F32, dev);
  // The dK / dV accumulator of a block travels one step behind it: at step i this rank adds its
  // queries' part to the accumulator of block r-i, which ranks r-i .. r-1 have filled so far.
  Tensor acc_in = Tensor::empty(kv.shape(), DType::F32, dev), sending;
  CommHandle acc_send;
  for (int i = 0; i < C; ++i) {
    const int src = (r + C - i) % C;
    CommHandle recv, send, acc_recv;
    if (i + 1 < C) {
      recv = cp.group->recv_async(incoming, prev, kTagKV);
      send = cp.group->send_async(kv, next, kTagKV);
    }
    if (i > 0) acc_recv = cp.group->recv_async(acc_in, prev, kTagDKV);
    Tensor mine = Tensor::zeros(kv.shape(), DType::F32, dev);
    ops::attention_block_bwd(dq, mine, dc, q, qpos, kv, context_parallel_positions(sh.seq, src, C, dev),
                             lse, delta, attention_start, sh, dropout);
    if (i > 0) {
      acc_recv.wait();
      ops::add(mine, mine, acc_in);
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
  Tensor own = Tensor::empty(kv.shape(), DType::F32, dev);
  cp.group->recv_async(own, prev, kTagDKV).wait();
  acc_send.wait();
  unpack_kv(own, dq, sh);  // dq's key / value columns are still zero
  return dq;
}

}  // namespace megatron::model
