// Executes a pipeline schedule on a StageModel with non-blocking point-to-point transfers
// (see forward_backward.h).
#include "pipeline/forward_backward.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::pipeline {

using model::Batch;
using model::StageModel;
using model::Parameter;
using model::ParameterList;

namespace {

constexpr int kActivationTag = 11;  // forward: output of a virtual stage to the next one
constexpr int kGradientTag = 12;    // backward: input gradient to the previous virtual stage

// The receives of one direction, in the order the schedule consumes them. One is posted ahead:
// the next receive is started as soon as the previous one has been taken.
class RecvChannel {
 public:
  RecvChannel(Communicator& group, int src, int tag, Shape shape, Device device,
              std::vector<size_t> steps)
      : group_(group), src_(src), tag_(tag), shape_(std::move(shape)), device_(device),
        steps_(std::move(steps)) {
    post_next();
  }
  // Waits for the transfer of schedule step `step` and returns its tensor.
  Tensor take(size_t step) {
    MG_CHECK(next_ < steps_.size() && steps_[next_] == step,
             "pipeline receive out of order at step ", step);
    handle_.wait();
    Tensor t = std::move(buf_);
    ++next_;
    post_next();
    return t;
  }

 private:
  void post_next() {
    if (next_ >= steps_.size()) return;
    buf_ = Tensor::empty(shape_, DType::F32, device_);
    handle_ = group_.recv_async(buf_, src_, tag_);
  }
  Communicator& group_;
  int src_, tag_;
  Shape shape_;
  Device device_;
  std::vector<size_t> steps_;
  size_t next_ = 0;
  Tensor buf_;
  CommHandle handle_;
};

struct PendingSend {
  Tensor tensor;  // kept alive until the send completes
  CommHandle handle;
};

// Sets a chunk's grad-ready hook for one backward pass (cleared on exit, errors included).
class HookScope {
 public:
  HookScope(model::ModelChunk& chunk, model::GradReadyHook hook) : chunk_(chunk) {
    chunk_.set_grad_ready_hook(std::move(hook));
  }
  ~HookScope() { chunk_.set_grad_ready_hook({}); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;

 private:
  model::ModelChunk& chunk_;
};

void check_microbatches(const std::vector<Batch>& mbs) {
  MG_REQUIRE(!mbs.empty(), "forward_backward: no micro-batches");
  const Tensor& t0 = mbs.front().tokens;
  MG_REQUIRE(t0.defined() && t0.dim() == 2, "forward_backward: micro-batch 0 has no [batch, seq] "
             "tokens tensor");
  for (size_t i = 1; i < mbs.size(); ++i)
    MG_REQUIRE(mbs[i].tokens.defined() && mbs[i].tokens.shape() == t0.shape(),
               "forward_backward: micro-batch ", i, " has tokens ",
               mbs[i].tokens.defined() ? shape_str(mbs[i].tokens.shape()) : "undefined",
               " but micro-batch 0 has ", shape_str(t0.shape()),
               "; pipeline stages exchange fixed-shape activations, so every micro-batch must "
               "have one shape");
}

}  // namespace

ForwardBackwardResult run_schedule(StageModel& model, const std::vector<Batch>& mbs,
                                   const Schedule& s, const ForwardBackwardOptions& opt) {
  check_microbatches(mbs);
  Communicator& pp = model.pipeline_group();
  const int P = pp.size(), r = pp.rank();
  MG_CHECK(s.pipeline_size == P && s.pipeline_rank == r && s.num_chunks == model.num_chunks() &&
               s.num_microbatches == int(mbs.size()) && s.forward_only == opt.forward_only,
           "run_schedule: a ", schedule_kind_name(s.kind), " schedule for rank ", s.pipeline_rank,
           " of ", s.pipeline_size, " (", s.num_chunks, " chunks, ", s.num_microbatches,
           " micro-batches) does not fit this model (rank ", r, " of ", P, ", ",
           model.num_chunks(), " chunks, ", mbs.size(), " micro-batches)");
  MG_CHECK(opt.microbatch_grad_scale.empty() || opt.microbatch_grad_scale.size() == mbs.size(),
           "run_schedule: ", opt.microbatch_grad_scale.size(), " micro-batch grad scales for ",
           mbs.size(), " micro-batches");
  const int64_t b = mbs[0].tokens.size(0), seq = mbs[0].tokens.size(1);
  const Shape act_shape = {model.chunk(0).activation_rows(b, seq), model.config().hidden_size};
  const int prev = (r + P - 1) % P, next = (r + 1) % P;

  std::vector<size_t> fwd_recvs, bwd_recvs;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    if (st.recv) (st.pass == Pass::Forward ? fwd_recvs : bwd_recvs).push_back(i);
  }
  const Device dev = model.chunk(0).device();
  RecvChannel activations(pp, prev, kActivationTag, act_shape, dev, std::move(fwd_recvs));
  RecvChannel gradients(pp, next, kGradientTag, act_shape, dev, std::move(bwd_recvs));
  std::vector<PendingSend> sends;

  // --overlap-grad-reduce: the step of each chunk's last backward, during which its parameters
  // are reported (all of the chunk's forwards come before it).
  const bool hooked = bool(opt.grad_ready) && !opt.forward_only;
  MG_CHECK(!hooked || opt.finalize_grads, "run_schedule: grad_ready needs finalize_grads");
  std::vector<size_t> last_backward(size_t(model.num_chunks()), s.steps.size());
  if (hooked) {
    for (size_t i = 0; i < s.steps.size(); ++i)
      if (s.steps[i].pass == Pass::Backward) last_backward[size_t(s.steps[i].chunk)] = i;
    for (size_t i = 0; i < s.steps.size(); ++i)
      MG_CHECK(s.steps[i].pass == Pass::Backward ||
                   i < last_backward[size_t(s.steps[i].chunk)],
               "run_schedule: forward of chunk ", s.steps[i].chunk, " after its last backward");
  }
  Parameter* const tied = model.shared_embedding();
  const bool sp = model.has_partial_tp_grads();
  auto report = [&](const ParameterList& group) {
    ParameterList ready;
    for (Parameter* p : group)
      if (p != tied) ready.push_back(p);
    if (ready.empty()) return;
    if (sp) model::all_reduce_sequence_parallel_grads(ready, model.tensor_group());
    opt.grad_ready(ready);
  };

  ForwardBackwardResult res;
  res.kind = s.kind;
  model::ChunkForward fwd;
  fwd.training = !opt.forward_only;
  fwd.grad_scale = opt.grad_scale;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    model::ModelChunk& chunk = model.chunk(st.chunk);
    const Batch& in = mbs[size_t(st.microbatch)];
    if (st.pass == Pass::Forward) {
      MG_CHECK(st.recv != chunk.pre_process() && st.send != chunk.post_process(),
               "schedule step ", i, " disagrees with chunk ", st.chunk, "'s stage");
      Tensor x = st.recv ? activations.take(i) : Tensor();
      fwd.dropout_offset = opt.dropout_offset + uint64_t(st.microbatch) * opt.dropout_offset_stride;
      fwd.grad_scale = opt.microbatch_grad_scale.empty()
                           ? opt.grad_scale
                           : opt.microbatch_grad_scale[size_t(st.microbatch)];
      fwd.moe_aux_grad_scale = opt.moe_aux_grad_scale.empty()
                                   ? 1.0
                                   : opt.moe_aux_grad_scale[size_t(st.microbatch)];
      model::LossResult loss;
      Tensor y = chunk.forward(st.microbatch, in, x, fwd, &loss);
      if (chunk.post_process()) {
        res.loss_sum += loss.loss_sum;
        res.num_tokens += loss.num_tokens;
        res.more.resize(std::max(res.more.size(), loss.more.size()));
        for (size_t k = 0; k < loss.more.size(); ++k) {
          res.more[k].sum += loss.more[k].sum;
          res.more[k].count += loss.more[k].count;
        }
      }
      if (st.send) sends.push_back({y, pp.send_async(y, next, kActivationTag)});
    } else {
      MG_CHECK(st.recv != chunk.post_process() && st.send != chunk.pre_process(),
               "schedule step ", i, " disagrees with chunk ", st.chunk, "'s stage");
      Tensor dy = st.recv ? gradients.take(i) : Tensor();
      Tensor dx;
      if (hooked && i == last_backward[size_t(st.chunk)]) {
        HookScope scope(chunk, report);
        dx = chunk.backward(st.microbatch, dy);
      } else {
        dx = chunk.backward(st.microbatch, dy);
      }
      if (st.send) sends.push_back({dx, pp.send_async(dx, prev, kGradientTag)});
    }
    int held = 0;
    for (int c = 0; c < model.num_chunks(); ++c) held += model.chunk(c).in_flight();
    res.max_in_flight = std::max(res.max_in_flight, held);
    std::erase_if(sends, [](PendingSend& p) { return p.handle.test(); });
    if (opt.progress) opt.progress();
  }
  for (PendingSend& p : sends) p.handle.wait();
  for (int c = 0; c < model.num_chunks(); ++c)
    MG_CHECK(model.chunk(c).in_flight() == 0, "chunk ", c, " still holds ",
             model.chunk(c).in_flight(), " micro-batches after the schedule");

  // The losses live on the last stage; every rank of the pipeline group gets them (every stage
  // knows how many the family has).
  if (P > 1) {
    const size_t terms = model.chunk(0).loss_names().size();
    res.more.resize(terms - 1);
    Tensor loss = Tensor::empty({int64_t(2 * terms)}, DType::F64);
    double* v = loss.data<double>();
    v[0] = res.loss_sum;
    v[1] = res.num_tokens;
    for (size_t k = 1; k < terms; ++k) {
      v[2 * k] = res.more[k - 1].sum;
      v[2 * k + 1] = res.more[k - 1].count;
    }
    pp.broadcast(loss, P - 1);
    res.loss_sum = v[0];
    res.num_tokens = v[1];
    for (size_t k = 1; k < terms; ++k) res.more[k - 1] = {v[2 * k], v[2 * k + 1]};
  }

  if (hooked) {
    // Everything but the tied embedding was finalised and reported by the passes.
    model.all_reduce_embedding_grads();
    if (tied) opt.grad_ready({tied});
  } else if (!opt.forward_only && opt.finalize_grads) {
    model.finalize_model_parallel_grads();
  }
  return res;
}

ForwardBackwardResult forward_backward(StageModel& model, const std::vector<Batch>& mbs,
                                       const ForwardBackwardOptions& opt) {
  const Schedule s = make_schedule(model.pipeline_size(), model.pipeline_rank(), int(mbs.size()),
                                   model.num_chunks(), opt.forward_only);
  return run_schedule(model, mbs, s, opt);
}

ForwardBackwardResult forward_backward_no_pipelining(StageModel& model,
                                                     const std::vector<Batch>& mbs,
                                                     const ForwardBackwardOptions& opt) {
  MG_REQUIRE(model.pipeline_size() == 1 && model.num_chunks() == 1,
             "forward_backward_no_pipelining needs --pipeline-model-parallel-size 1 (got ",
             model.pipeline_size(), ") and no virtual stages");
  return run_schedule(model, mbs, no_pipelining_schedule(int(mbs.size()), opt.forward_only), opt);
}

ForwardBackwardResult forward_backward_pipelining_without_interleaving(
    StageModel& model, const std::vector<Batch>& mbs, const ForwardBackwardOptions& opt) {
  MG_REQUIRE(model.num_chunks() == 1, "the non-interleaved 1F1B schedule needs one model chunk "
             "per rank (got ", model.num_chunks(), "); use the interleaved schedule");
  return run_schedule(model, mbs,
                      one_f_one_b_schedule(model.pipeline_size(), model.pipeline_rank(),
                                           int(mbs.size()), opt.forward_only),
                      opt);
}

ForwardBackwardResult forward_backward_pipelining_with_interleaving(
    StageModel& model, const std::vector<Batch>& mbs, const ForwardBackwardOptions& opt) {
  return run_schedule(model, mbs,
                      interleaved_schedule(model.pipeline_size(), model.pipeline_rank(),
                                           int(mbs.size()), model.num_chunks(), opt.forward_only),
                      opt);
}

}  // namespace megatron::pipeline
