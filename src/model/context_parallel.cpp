// Context-parallel sequence layout, batch slicing and the attention exchange (see
// context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <vector>

#include "kernels/ops.h"
#include "model/layer_spec.h"

namespace megatron::model {

CpCommTypeId parse_cp_comm_type(const std::string& name) {
  for (const CpCommTypeKind& k : cp_comm_type_kinds()) {
    if (name != k.name) continue;
    MG_REQUIRE(k.implemented, "--cp-comm-type ", name, " (the all-to-all of attention heads) is "
               "not implemented; use p2p (the ring, the default) or allgather");
    return k.id;
  }
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
  Tensor gathered = Tensor::empty({C * in.size(0), in.size(1)}, in.dtype(), in.device());
  cp.group->all_gather(in, gathered);
  Tensor full = Tensor::empty(gathered.shape(), in.dtype(), in.device());
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
// g*2*d] (a group's key head and value head are adjacent in the QKV row, so the packed block is
// HeadLayout::kv). Seen as [rows * groups, (n/g + 2) * d], the key and value heads of every group
// are the column block [n/g * d, (n/g + 2) * d): a row-strided view the row ops copy.
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

// This rank's queries (the query heads of its fused QKV, at their positions in the whole
// sequence) against a packed key/value block of kv_rows rows per sequence at kv_positions
// (undefined: the whole sequence in order). Shape, masks and dropout are those of the whole
// [S, S] attention.
struct CpAttention {
  ops::AttentionInputs in;
  ops::AttentionShape shape;
  ops::AttentionMask mask;
  CpAttention(const ContextParallel& cp, const Tensor& qkv, const ops::AttentionMask& local_mask,
              const ops::AttentionShape& local, int64_t kv_rows)
      : shape(local), mask(local_mask) {
    const int C = cp.size();
    const int64_t S = int64_t(C) * local.seq;
    shape.kv_seq = kv_rows;
    shape.q_span = shape.kv_span = S;
    in.q = qkv;
    in.q_layout = ops::HeadLayout::qkv(ops::QkvPart::Query, local.heads, local.groups,
                                       local.head_dim, local.seq);
    in.k_layout = ops::HeadLayout::kv(ops::QkvPart::Key, local.groups, local.head_dim, kv_rows);
    in.v_layout = ops::HeadLayout::kv(ops::QkvPart::Value, local.groups, local.head_dim, kv_rows);
    in.q_positions = context_parallel_positions(local.seq, cp.rank(), C, qkv.device());
    // The padding of every key, by position: [b, S] in sequence order.
    if (mask.key_padding.defined())
      mask.key_padding = GatherFromContextParallelRegion::forward(
                             cp, mask.key_padding.contiguous().view({-1, 1}), local.batch)
                             .view({local.batch, S});
  }
  void set_block(const Tensor& kv, const Tensor& kv_positions) {
    in.k = in.v = kv;
    in.kv_positions = kv_positions;
  }
};

}  // namespace

void ring_attention_fwd(const ContextParallel& cp, const Tensor& out, const Tensor& lse,
                        const Tensor& qkv, const ops::AttentionMask& mask,
                        const ops::AttentionShape& shape, const ops::DropoutSpec& dropout) {
  const int C = cp.size(), r = cp.rank(), next = (r + 1) % C, prev = (r + C - 1) % C;
  const Tensor q = qkv.contiguous();
  const Device dev = q.device();
  CpAttention att(cp, q, mask, shape, shape.seq);
  Tensor kv = pack_kv(q, shape), incoming = Tensor::empty(kv.shape(), DType::F32, dev);
  Tensor ob = Tensor::empty(out.shape(), DType::F32, dev);
  Tensor lb = Tensor::empty(lse.shape(), DType::F32, dev);
  for (int i = 0; i < C; ++i) {
    const int src = (r + C - i) % C;  // whose keys and values this step holds
    CommHandle recv, send;
    if (i + 1 < C) {  // the next block travels while this one is computed
      recv = cp.group->recv_async(incoming, prev, kTagKV);
      send = cp.group->send_async(kv, next, kTagKV);
    }
    att.set_block(kv, context_parallel_positions(shape.seq, src, C, dev));
    if (i == 0) {
      ops::attention_fwd(out, lse, Tensor(), att.in, att.mask, att.shape, dropout);
    } else {
      ops::attention_fwd(ob, lb, Tensor(), att.in, att.mask, att.shape, dropout);
      ops::attention_merge(out, lse, ob, lb, att.shape);
    }
    if (i + 1 < C) {
      send.wait();
      recv.wait();
      std::swap(kv, incoming);
    }
  }
}

Tensor ring_attention_bwd(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& lse, const ops::AttentionMask& mask,
                          const ops::AttentionShape& shape, const ops::DropoutSpec& dropout) {
  const int C = cp.size(), r = cp.rank(), next = (r + 1) % C, prev = (r + C - 1) % C;
  const Tensor q = qkv.contiguous(), dc = dout.contiguous();
  const Device dev = q.device();
  CpAttention att(cp, q, mask, shape, shape.seq);
  Tensor kv = pack_kv(q, shape), incoming = Tensor::empty(kv.shape(), DType::F32, dev);
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
    att.set_block(kv, context_parallel_positions(shape.seq, src, C, dev));
    ops::attention_bwd({dq, mine, mine, Tensor()}, dc, out, lse, Tensor(), att.in, att.mask,
                       att.shape, dropout, /*accumulate=*/true);
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
  unpack_kv(own, dq, shape);  // dq's key / value columns are still zero
  return dq;
}

void allgather_attention_fwd(const ContextParallel& cp, const Tensor& out, const Tensor& lse,
                             const Tensor& probs, const Tensor& qkv,
                             const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                             const ops::DropoutSpec& dropout) {
  const Tensor q = qkv.contiguous();
  CpAttention att(cp, q, mask, shape, int64_t(cp.size()) * shape.seq);
  att.set_block(GatherFromContextParallelRegion::forward(cp, pack_kv(q, shape), shape.batch),
                Tensor());
  ops::attention_fwd(out, lse, probs, att.in, att.mask, att.shape, dropout);
}

Tensor allgather_attention_bwd(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& lse, const Tensor& probs,
                               const ops::AttentionMask& mask, const ops::AttentionShape& shape,
                               const ops::DropoutSpec& dropout) {
  const Tensor q = qkv.contiguous();
  CpAttention att(cp, q, mask, shape, int64_t(cp.size()) * shape.seq);
  const Tensor kv = GatherFromContextParallelRegion::forward(cp, pack_kv(q, shape), shape.batch);
  att.set_block(kv, Tensor());
  Tensor dqkv = Tensor::empty(q.shape(), DType::F32, q.device());
  Tensor dkv = Tensor::empty(kv.shape(), DType::F32, q.device());
  ops::attention_bwd({dqkv, dkv, dkv, Tensor()}, dout.contiguous(), out, lse, probs, att.in,
                     att.mask, att.shape, dropout);
  // dK / dV of every position from this rank's queries, summed over the group at their owners.
  unpack_kv(GatherFromContextParallelRegion::backward(cp, dkv, shape.batch), dqkv, shape);
  return dqkv;
}

}  // namespace megatron::model
