// Data-parallel gradient (and parameter) buffers, Megatron's param_and_grad_buffer.py:
//
// All trainable parameters are laid out in one flat buffer in REVERSE order of
// GPTModel::parameters() (the final LayerNorm first, the embedding last: roughly the order in
// which backward finishes their gradients) and grouped into buckets. Each Parameter::grad becomes
// a view into the flat fp32 gradient buffer (and, for the distributed optimizer, each
// Parameter::value a view into a flat parameter buffer in the parameter dtype): the buffer takes
// over their storage, as Megatron's param.main_grad / param.data views do.
//
// Buckets: parameters are added in buffer order; a bucket is closed once it holds at least
// bucket_size elements (0: one bucket for everything). Megatron uses buckets only with
// --overlap-grad-reduce (default size max(40M, 1M x DP)); the caller decides.
// For the distributed optimizer (pad_for_sharding): each parameter's start is aligned to 64
// elements and each bucket's end is padded to a multiple of lcm(DP, 128), so every bucket splits
// into DP equal contiguous shards: DP rank r owns elements [begin + r*n, begin + (r+1)*n) of a
// bucket of DP*n elements. Padding elements are zero and belong to no parameter.
//
// Worked example (DP = 2, pad_for_sharding, bucket_size 0, params in model order A[100], B[10]):
//   buffer order B, A: B at [0, 10), A at [64, 164) (start aligned to 64); bucket [0, 256)
//   (164 padded to a multiple of lcm(2, 128) = 128); rank 0 owns [0, 128): B and A[0:64);
//   rank 1 owns [128, 256): A[64:100) and 156 padding elements.
//
// Gradient reduction per bucket is a SUM over the data-parallel group: all-reduce in place
// (plain data parallelism) or reduce-scatter into this rank's shard (the distributed optimizer).
// The trainer scales the loss by 1 / (loss tokens of the whole global batch, summed over DP), so
// the sum is exactly the single-rank gradient of the per-token loss; no further division.
// With overlap, register_grads_ready() launches a bucket's non-blocking collective as soon as all
// of its parameters are reported final, and progress() lets MPI advance the pending ones (MPI has
// no progress thread here: a collective moves only while some MPI call runs).
//
// Parameter synchronisation (distributed optimizer; Megatron's start/finish_param_sync): after
// the optimizer wrote this rank's shard of the parameter buffer, every bucket is all-gathered in
// place. Without overlap_param_gather start_param_sync() waits for the gathers. With it
// (--overlap-param-gather) they are only launched, in the order the next forward pass needs them
// (the last bucket, which holds the embedding, first), and nothing may read a parameter before
// its bucket arrived: the model's forward pre-hook calls wait_params() with the parameters of the
// layer it is about to run (which also polls the other gathers, so they advance during compute),
// and every other reader (evaluation, checkpoint save, the end of training, the next optimizer
// step) calls finish_param_sync() first. Until then the parameter elements outside this rank's
// shard hold their previous values.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/parameter.h"

namespace megatron::optim {

// Pure arithmetic of the flat layout (testable without any tensor).
struct BufferLayout {
  struct Param {
    int64_t offset = 0, numel = 0;  // elements in the flat buffer
    int bucket = 0;
  };
  struct Bucket {
    int64_t begin = 0, end = 0;  // [begin, end) in the flat buffer (end padded when sharding)
    std::vector<size_t> params;  // parameter indices (model order) in buffer order
  };
  std::vector<Param> params;  // indexed like the ParameterList (model order)
  std::vector<Bucket> buckets;
  int64_t total = 0;          // flat buffer elements (incl. padding)
  int dp_size = 1;
  bool padded = false;

  // numels in model order; parameters are placed in reverse order.
  static BufferLayout build(const std::vector<int64_t>& numels, int64_t bucket_size, int dp_size,
                            bool pad_for_sharding);
  // Elements of bucket b each DP rank owns (sharded layouts only).
  int64_t shard_size(int b) const;
  // Offset of bucket b's shard in the concatenation of this rank's shards of all buckets.
  int64_t shard_offset(int b) const;
  int64_t total_shard_size() const { return total / dp_size; }

  // A contiguous piece of one parameter inside a DP rank's shard.
  struct Piece {
    size_t param = 0;           // parameter index (model order)
    int64_t param_offset = 0;   // first element within the parameter
    int64_t length = 0;
    int64_t shard_offset = 0;   // position in the rank's concatenated shards
    int64_t buffer_offset = 0;  // position in the flat buffer
  };
  // The pieces DP rank `dp_rank` owns, in buffer order (sharded layouts only).
  std::vector<Piece> shard_pieces(int dp_rank) const;
};

struct GradBufferConfig {
  int64_t bucket_size = 0;        // elements; 0: one bucket
  bool pad_for_sharding = false;  // the distributed optimizer's layout and reduce-scatter
  // --overlap-param-gather: start_param_sync() launches the gathers without waiting (sharded only).
  bool overlap_param_gather = false;
  // --grad-reduce-in-bf16 (with --bf16; Megatron's grad_reduce_in_fp32 off): each bucket is rounded
  // to bf16 (RNE) before the collective and its sum is rounded to bf16 once (the communicator sums
  // bf16 in fp32, communicator.h), then widened back into the fp32 buffer. Megatron's bf16 grad
  // buffer also rounds after every micro-batch's accumulation and NCCL rounds after every partial
  // sum of its ring; here the micro-batches accumulate in fp32 and the sum is rounded once, which
  // at DP 2 with one rounding per rank equals NCCL's bf16 all-reduce bit for bit.
  bool reduce_in_bf16 = false;
};

class ParamAndGradBuffer {
 public:
  // Takes over the storage of every parameter's grad (and, with pad_for_sharding, value): the
  // current contents are copied into the flat buffers and the Parameter tensors become views.
  ParamAndGradBuffer(model::ParameterList params, std::shared_ptr<Communicator> dp,
                     const GradBufferConfig& cfg);
  ~ParamAndGradBuffer();
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const BufferLayout& layout() const { return layout_; }
  const model::ParameterList& parameters() const { return params_; }
  Communicator& dp() const { return *dp_; }
  bool sharded() const { return cfg_.pad_for_sharding; }
  Tensor grad_data() const { return grad_; }    // [total] fp32
  Tensor param_data() const { return param_; }  // [total] param dtype (sharded only)
  // This rank's reduced gradient shards ([total_shard_size] fp32; sharded only): filled by the
  // reduce-scatter of finish_grad_sync().
  Tensor main_grad_shard() const { return grad_shard_; }

  void zero_grad();  // the whole gradient buffer (padding included)

  // Gradient synchronisation of one step: start_grad_sync() launches every bucket not launched
  // yet; register_grads_ready() (overlap) launches the buckets whose parameters are now all
  // reported; finish_grad_sync() launches what is left and waits for everything. All ranks of
  // the group must report the same parameters in the same order.
  void register_grads_ready(const model::ParameterList& ready);
  void start_grad_sync();
  void finish_grad_sync();
  void progress();  // polls the pending collectives, gradient and parameter (lets MPI advance them)
  int launched_buckets() const;  // buckets launched so far in this step (tests)

  // Parameter synchronisation (sharded only; see the header comment). start_param_sync(): after
  // the shard of the parameter buffer was updated, all-gathers every bucket so all ranks hold all
  // parameters; blocking unless cfg.overlap_param_gather, then launched last bucket first.
  // A gather still pending from before is finished first.
  void start_param_sync();
  // Waits for the gathers of the buckets holding `params` (a no-op for buckets already waited
  // for), then polls the others. The forward pre-hook of --overlap-param-gather.
  void wait_params(const model::ParameterList& params);
  void wait_param_bucket(int bucket);
  // Waits for every pending parameter gather. Call before anything reads parameters outside a
  // forward with the pre-hook. A no-op when none is pending (and without overlap).
  void finish_param_sync();
  // Some bucket's parameter gather was launched and not yet waited for.
  bool param_sync_pending() const { return param_pending_count_ > 0; }
  bool param_bucket_pending(int bucket) const { return param_pending_[size_t(bucket)]; }
  // The bucket holding parameter `p` (an error if p is not in the buffer).
  int bucket_of(const model::Parameter* p) const;
  bool holds(const model::Parameter* p) const { return index_.count(p) > 0; }
  // start_param_sync() and finish_param_sync(): blocking whatever the configuration (loading a
  // checkpoint, tests).
  void all_gather_params();

 private:
  void launch(size_t bucket);
  void launch_param_gather(size_t bucket);

  model::ParameterList params_;
  std::shared_ptr<Communicator> dp_;
  GradBufferConfig cfg_;
  BufferLayout layout_;
  Tensor grad_, param_, grad_shard_;
  std::vector<int> pending_;          // per bucket: parameters not yet reported this step
  std::vector<bool> launched_;
  std::vector<bool> reported_;       // per parameter, this step
  std::vector<CommHandle> handles_;
  std::vector<Tensor> bf16_in_, bf16_out_;  // per bucket, --grad-reduce-in-bf16 (while in flight)
  std::vector<CommHandle> param_handles_;  // per bucket: its parameter all-gather
  std::vector<bool> param_pending_;        // per bucket: gather launched, not yet waited for
  int param_pending_count_ = 0;
  std::unordered_map<const model::Parameter*, size_t> index_;  // parameter -> model index
};

}  // namespace megatron::optim
