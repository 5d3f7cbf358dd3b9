// Column/row-parallel linears, the vocab-parallel embedding and the vocab-parallel output layer
// with its loss (see parallel_layers.h). Communication only through the tp_mappings pairs.
#include "model/parallel_layers.h"

#include <algorithm>

#include "comm/tp_mappings.h"
#include "kernels/ops.h"

namespace megatron::model {

using tp::CopyToTensorParallelRegion;
using tp::GatherFromSequenceParallelRegion;
using tp::ReduceFromTensorParallelRegion;
using tp::ReduceScatterToSequenceParallelRegion;

namespace {

int64_t local_size(int64_t full, int parts, const std::string& what) {
  MG_REQUIRE(full % parts == 0, what, ": size ", full, " is not divisible by the tensor-parallel "
             "size ", parts);
  return full / parts;
}

// Rows of logits per loss-head chunk: on the CPU few enough to stay in cache; on a GPU as many as
// fit in 512 MiB of fp32 logits (large products keep the tensor cores busy), in multiples of 256.
int64_t head_rows(const Device& dev, int64_t vocab_shard) {
  constexpr int64_t kCpuRows = 256, kGpuBytes = int64_t(512) << 20;
  if (!dev.is_cuda()) return kCpuRows;
  const int64_t fit = kGpuBytes / (std::max<int64_t>(vocab_shard, 1) * int64_t(sizeof(float)));
  return std::max(kCpuRows, fit / kCpuRows * kCpuRows);
}

// Error unless every id of the int32 tensor is in [0, limit): the range comes from an op; the
// first id outside it is looked up on a host copy (error path only).
void check_ids(const Tensor& ids, int64_t limit, const char* what, const char* outside,
               const char* hint) {
  const ops::IntRange r = ops::int_range(ids);
  if (ids.numel() == 0 || (r.min >= 0 && r.max < limit)) return;
  const Tensor host = ids.contiguous().to(Device::cpu());
  const int32_t* p = host.data<int32_t>();
  for (int64_t i = 0; i < host.numel(); ++i)
    MG_REQUIRE(p[i] >= 0 && p[i] < limit, what, " ", p[i], " at position ", i, " ", outside, limit,
               hint);
}

}  // namespace

bool keeps_operand(const Tensor& x) { return x.device().is_cuda(); }

Tensor product_operand(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  const Tensor src = t.contiguous();
  Tensor out = Tensor::empty(src.shape(), dt, src.device());
  ops::cast(out, src);
  return out;
}

// ---- Column / row-parallel linear ----------------------------------------------------------
LinearBase::LinearBase(const std::string& prefix, int64_t in, int64_t out, bool row, DType dtype,
                       const TensorParallel& tp, const LinearOptions& opt)
    : in_features(row ? local_size(in, tp.size(), prefix + " input") : in),
      out_features(row ? out : local_size(out, tp.size() * opt.parts, prefix + " output") * opt.parts),
      skip_bias_add(opt.skip_bias_add),
      row_parallel_(row),
      tp_(tp) {
  WeightSpec w;
  w.name = prefix + ".weight";
  w.init = opt.init;
  w.partition_dim = row ? 1 : 0;
  w.partition_parts = row ? 1 : opt.parts;
  weight.init(w, {out_features, in_features}, dtype, opt.grad);
  // Column: bias sharded with the output. Row: replicated, added on the reduced output, which is
  // the sequence shard under sequence parallelism (partial gradient).
  if (opt.bias) {
    WeightSpec b;
    b.name = prefix + ".bias";
    b.init = InitMethod::zeros;
    b.weight_decay = false;
    b.partition_dim = row ? -1 : 0;
    b.partition_parts = row ? 1 : opt.parts;
    b.sequence_parallel = row && tp.sequence_parallel;
    bias.init(b, {out_features}, dtype, opt.grad);
  }
  weight.read_as_stored = true;  // only multiplied: no fp32 copy where gemm takes its dtype
  weight.refresh();
  register_weight(weight);
  register_weight(bias);
}

DType LinearBase::input_dtype() const {
  return weight.operand().dtype() == DType::BF16 ? DType::BF16 : DType::F32;
}

Tensor LinearBase::forward(const LayerContext& ctx, const Tensor& x) {
  Communicator& g = tp_.comm();
  const bool sp = tp_.sequence_parallel;
  const bool comm = !tp_.explicit_expert_comm;  // else the token dispatcher communicates
  Tensor xin = x;
  if (!row_parallel_ && comm)
    xin = sp ? GatherFromSequenceParallelRegion::forward(g, x)
             : CopyToTensorParallelRegion::forward(g, x);
  MG_CHECK(xin.dim() == 2 && xin.size(1) == in_features, "Linear ", weight.param.name,
           ": input ", shape_str(xin.shape()), " does not have ", in_features, " columns");
  const Tensor& W = weight.operand();
  Tensor y = Tensor::empty({xin.size(0), out_features}, DType::F32, xin.device());
  const Tensor xc = product_operand(xin, W.dtype());
  ops::gemm(xc, false, W, true, y);
  if (row_parallel_ && comm)
    y = sp ? ReduceScatterToSequenceParallelRegion::forward(g, y)
           : ReduceFromTensorParallelRegion::forward(g, y);
  if (!skip_bias_add && bias.defined()) ops::bias_add(y, bias.f32);
  // The weight gradient's operand: on a GPU the product operand itself (bf16 for a bf16 model:
  // half the bytes kept and no second cast), unless the backward gathers the sequence shard again.
  if (ctx.save) x_ = keeps_operand(x) && !(!row_parallel_ && sp && comm) ? xc : x;
  return y;
}

Tensor LinearBase::backward(const LayerContext&, const Tensor& dy) {
  MG_CHECK(x_.defined(), "Linear::backward without a saved forward");
  Communicator& g = tp_.comm();
  const bool sp = tp_.sequence_parallel;
  if (!skip_bias_add && bias.defined()) ops::bias_grad(bias.param.grad, dy);
  const bool comm = !tp_.explicit_expert_comm;
  Tensor dyin = dy, xin = x_;
  if (row_parallel_ && comm)
    dyin = sp ? ReduceScatterToSequenceParallelRegion::backward(g, dy)
              : ReduceFromTensorParallelRegion::backward(g, dy);
  else if (!row_parallel_ && sp && comm)
    xin = GatherFromSequenceParallelRegion::forward(g, x_);  // gathered again, not kept
  const Tensor& W = weight.operand();
  const Tensor dyc = product_operand(dyin, W.dtype());
  Tensor dx = Tensor::empty({dyin.size(0), in_features}, DType::F32, dyin.device());
  ops::gemm(dyc, false, W, false, dx);
  ops::gemm(dyc, true, product_operand(xin, W.dtype()), false, weight.param.grad, 1.0f, 1.0f);
  if (!row_parallel_ && comm)
    dx = sp ? GatherFromSequenceParallelRegion::backward(g, dx)
            : CopyToTensorParallelRegion::backward(g, dx);
  x_.reset();
  return dx;
}

// ---- Replicated linear -------------------------------------------------------------------------
Linear::Linear(const std::string& prefix, int64_t in, int64_t out, DType dtype, bool partial_grad,
               bool grad) {
  WeightSpec w;
  w.name = prefix + ".weight";
  w.sequence_parallel = partial_grad;
  weight.init(w, {out, in}, dtype, grad);
  WeightSpec b = w;
  b.name = prefix + ".bias";
  b.init = InitMethod::zeros;
  b.weight_decay = false;
  bias.init(b, {out}, dtype, grad);
  weight.read_as_stored = true;  // only multiplied: no fp32 copy where gemm takes its dtype
  weight.refresh();
  register_weight(weight);
  register_weight(bias);
}

Tensor Linear::forward(const LayerContext& ctx, const Tensor& x) {
  const Tensor& W = weight.operand();
  MG_CHECK(x.dim() == 2 && x.size(1) == W.size(1), "Linear ", weight.param.name, ": input ",
           shape_str(x.shape()), " does not have ", W.size(1), " columns");
  Tensor y = Tensor::empty({x.size(0), W.size(0)}, DType::F32, x.device());
  const Tensor xc = product_operand(x, W.dtype());
  ops::gemm(xc, false, W, true, y);
  ops::bias_add(y, bias.f32);
  if (ctx.save) x_ = keeps_operand(x) ? xc : x;  // as LinearBase::forward
  return y;
}

Tensor Linear::backward(const LayerContext&, const Tensor& dy) {
  MG_CHECK(x_.defined(), "Linear::backward without a saved forward");
  ops::bias_grad(bias.param.grad, dy);
  const Tensor& W = weight.operand();
  const Tensor dyc = product_operand(dy, W.dtype());
  Tensor dx = Tensor::empty({dy.size(0), W.size(1)}, DType::F32, dy.device());
  ops::gemm(dyc, false, W, false, dx);
  ops::gemm(dyc, true, product_operand(x_, W.dtype()), false, weight.param.grad, 1.0f, 1.0f);
  x_.reset();
  return dx;
}

// ---- Embedding (vocab-parallel word table + optional position table) ------------------------
Embedding::Embedding(int64_t vocab, int64_t max_positions, int64_t h, float drop, DType dtype,
                     const TensorParallel& tp, bool grad, int64_t num_tokentypes)
    : vocab_size(vocab),
      vocab_start(local_size(vocab, tp.size(), "padded vocabulary") * tp.rank()),
      dropout(drop),
      tp_(tp) {
  WeightSpec w;
  w.name = "embedding.word_embeddings.weight";
  w.partition_dim = 0;
  w.padded_vocab = true;
  word.init(w, {vocab / tp.size(), h}, dtype, grad);
  if (max_positions > 0) {
    WeightSpec p;
    p.name = "embedding.position_embeddings.weight";
    p.sequence_parallel = tp.sequence_parallel;
    position.init(p, {max_positions, h}, dtype, grad);
  }
  if (num_tokentypes > 0) {
    WeightSpec t;
    t.name = "embedding.tokentype_embeddings.weight";
    t.sequence_parallel = tp.sequence_parallel;
    tokentype.init(t, {num_tokentypes, h}, dtype, grad);
  }
  word.read_as_stored = true;  // looked up and multiplied (tied output layer) as stored
  word.refresh();
  register_weight(word);
  register_weight(position);
  register_weight(tokentype);
}

Tensor Embedding::forward(const LayerContext& ctx, const Tensor& tokens, const Tensor& pos,
                          const Tensor& types) {
  const Tensor& table = word.operand();
  const int64_t n = tokens.numel(), h = table.size(1);
  const bool learned = position.defined();
  check_ids(tokens, vocab_size, "token id", "is outside the padded vocabulary [0, ",
            "); the data was tokenized with a different tokenizer or vocab size");
  if (learned) {
    MG_REQUIRE(pos.defined() && pos.dtype() == DType::I32 && pos.numel() == n,
               "position_ids must be int32 with the tokens' ", n, " elements");
    const int64_t P = position.f32.size(0);
    check_ids(pos, P, "position id", "is outside [0, --max-position-embeddings=", ")");
  }
  if (tokentype.defined()) {
    MG_REQUIRE(types.defined() && types.dtype() == DType::I32 && types.numel() == n,
               "token-type ids must be int32 with the tokens' ", n, " elements");
    check_ids(types, tokentype.f32.size(0), "token-type id", "is outside [0, ", ")");
  }
  Communicator& g = tp_.comm();
  Tensor out = Tensor::empty({n, h}, DType::F32, table.device());
  ops::vocab_parallel_embedding_fwd(out, tokens, table, vocab_start);
  out = tp_.sequence_parallel ? ReduceScatterToSequenceParallelRegion::forward(g, out)
                              : ReduceFromTensorParallelRegion::forward(g, out);
  const int64_t rows = out.size(0), row0 = tp_.sequence_parallel ? tp_.rank() * rows : 0;
  if (learned) {
    Tensor p = Tensor::empty({rows, h}, DType::F32, out.device());
    ops::embedding_fwd(p, pos.view({n}).narrow(0, row0, rows), position.f32);
    ops::add(out, out, p);
  }
  if (tokentype.defined()) {
    Tensor t = Tensor::empty({rows, h}, DType::F32, out.device());
    ops::embedding_fwd(t, types.view({n}).narrow(0, row0, rows), tokentype.f32);
    ops::add(out, out, t);
  }
  if (ctx.training)
    ctx.for_each_sequence_run(row0, rows, h, [&](int64_t f, int64_t k, uint64_t off) {
      const Tensor o = out.narrow(0, f, k);
      ops::dropout_fwd(o, o, ctx.dropout(dropout, -1, kSiteEmbedding, off));
    });
  if (ctx.save) {
    tokens_ = tokens;
    if (learned) position_ids_ = pos;
    if (tokentype.defined()) tokentype_ids_ = types;
  }
  return out;
}

void Embedding::backward(const LayerContext& ctx, const Tensor& dout) {
  MG_CHECK(tokens_.defined(), "Embedding::backward without a saved forward");
  const Tensor& tokens = tokens_;
  const int64_t n = tokens.numel(), rows = dout.size(0), h = dout.size(1);
  const int64_t row0 = tp_.sequence_parallel ? tp_.rank() * rows : 0;
  Tensor d = dout;  // read only below; without dropout no pass over it
  if (ctx.dropout(dropout, -1, kSiteEmbedding).active()) {
    d = Tensor::empty(dout.shape(), DType::F32, dout.device());
    ctx.for_each_sequence_run(row0, rows, h, [&](int64_t f, int64_t k, uint64_t off) {
      ops::dropout_bwd(d.narrow(0, f, k), dout.narrow(0, f, k),
                       ctx.dropout(dropout, -1, kSiteEmbedding, off));
    });
  }
  if (position.defined()) {
    const Tensor& pos = position_ids_;
    ops::embedding_bwd(position.param.grad, pos.view({n}).narrow(0, row0, rows), d);
  }
  if (tokentype.defined()) {
    const Tensor& types = tokentype_ids_;
    ops::embedding_bwd(tokentype.param.grad, types.view({n}).narrow(0, row0, rows), d);
  }
  Communicator& g = tp_.comm();
  d = tp_.sequence_parallel ? ReduceScatterToSequenceParallelRegion::backward(g, d)
                            : ReduceFromTensorParallelRegion::backward(g, d);
  ops::vocab_parallel_embedding_bwd(word.param.grad, tokens, d, vocab_start);
  tokens_.reset();
  position_ids_.reset();
  tokentype_ids_.reset();
}

// ---- Output layer and loss --------------------------------------------------------------------
OutputLayer::OutputLayer(Weight& word, int64_t vocab_size, const TensorParallel& tp, bool bias_,
                         DType dtype, bool grad)
    : weight_(&word), vocab_size_(vocab_size), tp_(tp) {
  if (bias_) init_bias(dtype, grad);
}

OutputLayer::OutputLayer(int64_t vocab_size, int64_t h, DType dtype, const TensorParallel& tp,
                         bool shared, bool grad, bool bias_)
    : weight_(&own_), vocab_size_(vocab_size), tp_(tp) {
  WeightSpec w;
  w.name = "output_layer.weight";
  w.partition_dim = 0;
  w.padded_vocab = true;
  w.shared = shared;
  own_.init(w, {local_size(vocab_size, tp.size(), "padded vocabulary"), h}, dtype, grad);
  own_.read_as_stored = true;
  own_.refresh();
  register_weight(own_);
  if (bias_) init_bias(dtype, grad);
}

void OutputLayer::init_bias(DType dtype, bool grad) {
  WeightSpec b;
  b.name = "output_layer.bias";
  b.init = InitMethod::zeros;
  b.weight_decay = false;
  b.partition_dim = 0;
  b.padded_vocab = true;
  bias.init(b, {local_size(vocab_size_, tp_.size(), "padded vocabulary")}, dtype, grad);
  register_weight(bias);
}

Tensor OutputLayer::input_region(const Tensor& x) const {
  return tp_.sequence_parallel ? GatherFromSequenceParallelRegion::forward(tp_.comm(), x)
                               : CopyToTensorParallelRegion::forward(tp_.comm(), x);
}

Tensor OutputLayer::loss(const Tensor& x, const Tensor& labels, const Tensor& loss_mask,
                                 float grad_scale, Tensor* dx) {
  Communicator& g = tp_.comm();
  const Tensor xin = input_region(x);
  const Tensor& W = weight_->operand();
  const Tensor xc = product_operand(xin, W.dtype());
  const int64_t N = xin.size(0), vl = W.size(0);
  MG_CHECK(vl * tp_.size() == vocab_size_, "output layer: vocabulary shard ", vl, " x ",
           tp_.size(), " != ", vocab_size_);
  MG_CHECK(labels.numel() == N && loss_mask.numel() == N, "output layer: ", labels.numel(),
           " labels / ", loss_mask.numel(), " mask entries for ", N, " rows");
  const Device dev = xin.device();
  const int64_t R = std::min(N, head_rows(dev, vl));
  if (!logits_buf_.defined() || logits_buf_.size(0) != R || logits_buf_.size(1) != vl ||
      logits_buf_.device() != dev)
    logits_buf_ = Tensor::empty({R, vl}, DType::F32, dev);
  Tensor loss = Tensor::empty({N}, DType::F32, dev);
  Tensor dxin;
  if (dx) dxin = Tensor::empty(xin.shape(), DType::F32, dev);
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r = std::min(R, N - r0);
    Tensor z = logits_buf_.narrow(0, 0, r);
    const Tensor xr = xc.narrow(0, r0, r);
    ops::gemm(xr, false, W, true, z);
    if (bias.defined()) ops::bias_add(z, bias.f32);
    Tensor dz = z;
    if (tp_.size() == 1) {  // fused single-rank softmax cross entropy, dlogits in place
      ops::softmax_xent_fwd_bwd(z, loss.narrow(0, r0, r), labels.narrow(0, r0, r),
                                loss_mask.narrow(0, r0, r), grad_scale, dx != nullptr);
    } else {
      loss.narrow(0, r0, r).copy_(
          VocabParallelCrossEntropy::forward(g, z, labels.narrow(0, r0, r), xent_));
      if (dx) {
        Tensor upstream = loss_mask.narrow(0, r0, r).clone();
        ops::scale(upstream, grad_scale);
        dz = VocabParallelCrossEntropy::backward(xent_, upstream);
      }
      xent_ = {};
    }
    if (dx) {
      if (bias.defined()) ops::bias_grad(bias.param.grad, dz);
      const Tensor dzc = product_operand(dz, W.dtype());
      ops::gemm(dzc, false, W, false, dxin.narrow(0, r0, r));  // partial over vocabulary shards
      ops::gemm(dzc, true, xr, false, weight_->param.grad, 1.0f, 1.0f);
    }
  }
  if (dx)
    *dx = tp_.sequence_parallel ? GatherFromSequenceParallelRegion::backward(g, dxin)
                                : CopyToTensorParallelRegion::backward(g, dxin);
  return loss;
}

Tensor OutputLayer::logits(const Tensor& x) {
  const Tensor xin = input_region(x);
  const Tensor& W = weight_->operand();
  Tensor z = Tensor::empty({xin.size(0), W.size(0)}, DType::F32, xin.device());
  ops::gemm(product_operand(xin, W.dtype()), false, W, true, z);
  if (bias.defined()) ops::bias_add(z, bias.f32);
  return tp::gather_from_tensor_model_parallel_region(tp_.comm(), z);
}

}  // namespace megatron::model
