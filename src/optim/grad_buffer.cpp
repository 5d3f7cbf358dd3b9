// Flat parameter/gradient buffers with buckets and their data-parallel collectives
// (see grad_buffer.h).
#include "optim/grad_buffer.h"

#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/ops.h"

namespace megatron::optim {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
// MPI counts are int; keep every bucket well below.
constexpr int64_t kMaxBucketElements = int64_t(1) << 30;
}  // namespace

BufferLayout BufferLayout::build(const std::vector<int64_t>& numels, int64_t bucket_size,
                                 int dp_size, bool pad_for_sharding) {
  MG_CHECK(dp_size >= 1, "BufferLayout: data-parallel size ", dp_size);
  MG_CHECK(bucket_size >= 0, "BufferLayout: bucket size ", bucket_size);
  BufferLayout L;
  L.dp_size = dp_size;
  L.padded = pad_for_sharding;
  L.params.resize(numels.size());
  const int64_t limit = bucket_size > 0 ? std::min(bucket_size, kMaxBucketElements) : kMaxBucketElements;
  const int64_t bucket_align = pad_for_sharding ? std::lcm(int64_t(dp_size), int64_t(128)) : 1;
  int64_t at = 0;
  Bucket cur;
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.end = round_up(at, bucket_align);
    at = cur.end;
    L.buckets.push_back(std::move(cur));
    cur = Bucket();
    cur.begin = at;
  };
  for (size_t k = numels.size(); k-- > 0;) {
    MG_CHECK(numels[k] > 0, "BufferLayout: parameter ", k, " has no elements");
    if (pad_for_sharding) at = round_up(at, 64);
    L.params[k] = Param{at, numels[k], int(L.buckets.size())};
    at += numels[k];
    cur.params.push_back(k);
    if (at - cur.begin >= limit) close();
  }
  close();
  L.total = at;
  return L;
}

int64_t BufferLayout::shard_size(int b) const {
  MG_CHECK(padded, "shard_size: the layout is not padded for sharding");
  const Bucket& k = buckets[size_t(b)];
  return (k.end - k.begin) / dp_size;
}

int64_t BufferLayout::shard_offset(int b) const {
  int64_t off = 0;
  for (int i = 0; i < b; ++i) off += shard_size(i);
  return off;
}

std::vector<BufferLayout::Piece> BufferLayout::shard_pieces(int dp_rank) const {
  MG_CHECK(padded && dp_rank >= 0 && dp_rank < dp_size, "shard_pieces: rank ", dp_rank, " of ",
           dp_size, padded ? "" : " (layout not padded for sharding)");
  std::vector<Piece> out;
  int64_t shard_base = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& k = buckets[b];
    const int64_t n = (k.end - k.begin) / dp_size;
    const int64_t lo = k.begin + dp_rank * n, hi = lo + n;
    for (size_t idx : k.params) {
      const Param& p = params[idx];
      const int64_t s = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (s >= e) continue;
      out.push_back(Piece{idx, s - p.offset, e - s, shard_base + (s - lo), s});
    }
    shard_base += n;
  }
  return out;
}

ParamAndGradBuffer::ParamAndGradBuffer(model::ParameterList params,
                                       std::shared_ptr<Communicator> dp,
                                       const GradBufferConfig& cfg)
    : params_(std::move(params)), dp_(std::move(dp)), cfg_(cfg) {
  MG_CHECK(dp_ != nullptr, "ParamAndGradBuffer: null data-parallel group");
  MG_CHECK(!params_.empty(), "ParamAndGradBuffer: no parameters");
  std::vector<int64_t> numels;
  const DType vdtype = params_[0]->value.dtype();
  const Device device = params_[0]->value.device();
  for (size_t i = 0; i < params_.size(); ++i) {
    const model::Parameter* p = params_[i];
    MG_CHECK(p->grad.dtype() == DType::F32 && p->grad.numel() == p->value.numel(), "parameter ",
             p->name, ": grad must be fp32 of the value's size");
    MG_CHECK(p->value.dtype() == vdtype, "parameter ", p->name, " is ", dtype_name(p->value.dtype()),
             ", others ", dtype_name(vdtype), ": one buffer holds one dtype");
    MG_CHECK(p->value.device() == device && p->grad.device() == device, "parameter ", p->name,
             " is on ", p->value.device().to_string(), ", others on ", device.to_string(),
             ": one buffer lives on one device");
    MG_CHECK(index_.emplace(p, i).second, "parameter ", p->name, " listed twice");
    numels.push_back(p->value.numel());
  }
  layout_ = BufferLayout::build(numels, cfg.bucket_size, dp_->size(), cfg.pad_for_sharding);
  grad_ = Tensor::zeros({layout_.total}, DType::F32, device);
  if (cfg.pad_for_sharding) {
    param_ = Tensor::zeros({layout_.total}, vdtype, device);
    grad_shard_ = Tensor::zeros({layout_.total_shard_size()}, DType::F32, device);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    model::Parameter* p = params_[i];
    const BufferLayout::Param& lp = layout_.params[i];
    Tensor g = grad_.narrow(0, lp.offset, lp.numel).view(p->grad.shape());
    g.copy_(p->grad);
    p->grad = g;
    if (param_.defined()) {
      Tensor v = param_.narrow(0, lp.offset, lp.numel).view(p->value.shape());
      v.copy_(p->value);
      p->value = v;
    }
  }
  const size_t nb = layout_.buckets.size();
  pending_.assign(nb, 0);
  launched_.assign(nb, false);
  reported_.assign(params_.size(), false);
  handles_.resize(nb);
  bf16_in_.resize(nb);
  bf16_out_.resize(nb);
  param_handles_.resize(nb);
  param_pending_.assign(nb, false);
  for (size_t b = 0; b < nb; ++b) pending_[b] = int(layout_.buckets[b].params.size());
}

ParamAndGradBuffer::~ParamAndGradBuffer() = default;

void ParamAndGradBuffer::zero_grad() { grad_.zero_(); }

void ParamAndGradBuffer::launch(size_t b) {
  const BufferLayout::Bucket& k = layout_.buckets[b];
  Tensor view = grad_.narrow(0, k.begin, k.end - k.begin);
  if (cfg_.reduce_in_bf16) {
    // --grad-reduce-in-bf16: the bucket goes out rounded to bf16 (RNE); the communicator sums bf16
    // in fp32 and rounds the sum once to bf16; finish_grad_sync() widens it back into fp32.
    Tensor in = Tensor::empty({k.end - k.begin}, DType::BF16, view.device());
    ops::cast(in, view);
    bf16_in_[b] = in;
    if (cfg_.pad_for_sharding) {
      Tensor out = Tensor::empty({layout_.shard_size(int(b))}, DType::BF16, view.device());
      bf16_out_[b] = out;
      handles_[b] = dp_->reduce_scatter_async(in, out, ReduceOp::Sum);
    } else {
      handles_[b] = dp_->all_reduce_async(in, ReduceOp::Sum);
    }
    launched_[b] = true;
    return;
  }
  if (cfg_.pad_for_sharding) {
    Tensor out = grad_shard_.narrow(0, layout_.shard_offset(int(b)), layout_.shard_size(int(b)));
    handles_[b] = dp_->reduce_scatter_async(view, out, ReduceOp::Sum);
  } else {
    handles_[b] = dp_->all_reduce_async(view, ReduceOp::Sum);
  }
  launched_[b] = true;
}

void ParamAndGradBuffer::register_grads_ready(const model::ParameterList& ready) {
  for (const model::Parameter* p : ready) {
    auto it = index_.find(p);
    MG_CHECK(it != index_.end(), "register_grads_ready: ", p->name, " is not in the buffer");
    MG_CHECK(!reported_[it->second], "register_grads_ready: ", p->name, " reported twice");
    reported_[it->second] = true;
    const size_t b = size_t(layout_.params[it->second].bucket);
    if (--pending_[b] == 0 && !launched_[b]) launch(b);
  }
  progress();
}

void ParamAndGradBuffer::start_grad_sync() {
  for (size_t b = 0; b < launched_.size(); ++b)
    if (!launched_[b]) launch(b);
}

void ParamAndGradBuffer::progress() {
  for (size_t b = 0; b < handles_.size(); ++b) {
    if (launched_[b]) handles_[b].test();
    if (param_pending_[b]) param_handles_[b].test();
  }
}

int ParamAndGradBuffer::launched_buckets() const {
  int n = 0;
  for (bool l : launched_) n += l;
  return n;
}

void ParamAndGradBuffer::finish_grad_sync() {
  start_grad_sync();
  for (CommHandle& h : handles_) h.wait();
  for (size_t b = 0; b < bf16_in_.size(); ++b) {  // --grad-reduce-in-bf16: the bf16 sums back to fp32
    if (!bf16_in_[b].defined()) continue;
    const BufferLayout::Bucket& k = layout_.buckets[b];
    if (cfg_.pad_for_sharding)
      ops::cast(grad_shard_.narrow(0, layout_.shard_offset(int(b)), layout_.shard_size(int(b))), bf16_out_[b]);
    else
      ops::cast(grad_.narrow(0, k.begin, k.end - k.begin), bf16_in_[b]);
    bf16_in_[b] = Tensor();
    bf16_out_[b] = Tensor();
  }
  for (size_t b = 0; b < launched_.size(); ++b) {
    launched_[b] = false;
    pending_[b] = int(layout_.buckets[b].params.size());
    handles_[b] = CommHandle();
  }
  reported_.assign(params_.size(), false);
}

int ParamAndGradBuffer::bucket_of(const model::Parameter* p) const {
  auto it = index_.find(p);
  MG_CHECK(it != index_.end(), "ParamAndGradBuffer: parameter ", p->name, " is not in the buffer");
  return layout_.params[it->second].bucket;
}

void ParamAndGradBuffer::launch_param_gather(size_t b) {
  const BufferLayout::Bucket& k = layout_.buckets[b];
  Tensor all = param_.narrow(0, k.begin, k.end - k.begin);
  param_handles_[b] = dp_->all_gather_inplace_async(all);
  param_pending_[b] = true;
  ++param_pending_count_;
}

void ParamAndGradBuffer::start_param_sync() {
  MG_CHECK(cfg_.pad_for_sharding, "start_param_sync needs the sharded (distributed optimizer) layout");
  finish_param_sync();
  // Buffer order is reverse model order: the forward needs the last bucket first.
  for (size_t b = layout_.buckets.size(); b-- > 0;) launch_param_gather(b);
  if (!cfg_.overlap_param_gather) finish_param_sync();
}

void ParamAndGradBuffer::wait_param_bucket(int bucket) {
  const size_t b = size_t(bucket);
  MG_CHECK(b < param_pending_.size(), "wait_param_bucket: bucket ", bucket, " of ",
           param_pending_.size());
  if (!param_pending_[b]) return;
  param_handles_[b].wait();
  param_handles_[b] = CommHandle();
  param_pending_[b] = false;
  --param_pending_count_;
}

void ParamAndGradBuffer::wait_params(const model::ParameterList& params) {
  if (param_pending_count_ == 0) return;
  for (const model::Parameter* p : params) wait_param_bucket(bucket_of(p));
  progress();
}

void ParamAndGradBuffer::finish_param_sync() {
  // In launch order, so a rank never blocks on a gather its peers have not reached the front of.
  for (size_t b = param_pending_.size(); b-- > 0;) wait_param_bucket(int(b));
}

void ParamAndGradBuffer::all_gather_params() {
  MG_CHECK(cfg_.pad_for_sharding, "all_gather_params needs the sharded (distributed optimizer) layout");
  start_param_sync();
  finish_param_sync();
}

}  // namespace megatron::optim
