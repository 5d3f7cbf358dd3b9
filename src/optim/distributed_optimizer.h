// The distributed optimizer (--use-distributed-optimizer; Megatron's DistributedOptimizer, a
// ZeRO-1 scheme): the fp32 main parameters and the Adam moments (or SGD momentum) are sharded
// across the data-parallel ranks over the flat buffer of optim/grad_buffer.h. Each DP rank owns
// the contiguous 1/DP slice of every bucket. One step:
//   1. the gradient buffer is reduce-scattered (ParamAndGradBuffer::finish_grad_sync): this
//      rank's main_grad_shard() holds the fully reduced gradients of its slice;
//   2. unscale by 1/loss_scale; the inf check and the grad norm are reduced over `grad_stats`
//      (every rank holding distinct gradient pieces: data x model parallel, the world when PP = 1;
//      model::param_counts_in_grad_norm: TP duplicates and pipeline replicas are not counted);
//      all ranks skip together; clip;
//   3. AdamW/SGD on the fp32 main shard (per parameter piece: weight decay follows the piece's
//      parameter), writing the updated values in the parameter dtype into the parameter buffer;
//   4. all-gather of the parameter buffer, so every rank holds every updated parameter
//      (ParamAndGradBuffer::start_param_sync). With --overlap-param-gather the gathers are only
//      launched here and overlap the next forward pass, which waits for each bucket just before
//      the first layer that uses it (GPTModel / StageModel forward pre-hook ->
//      ParamAndGradBuffer::wait_params); other readers call finish_param_sync() first, and so
//      does step() itself before it touches the shard.
// The update is elementwise, so with the same reduced gradients it equals the unsharded
// optimizer's bit for bit. Memory per parameter (fp32 model): 4 (param) + 4 (grad) + 12/DP.
// Several buffers (expert parallelism: the experts' weights summed and sharded over the expert
// data-parallel group, the others over data x context parallel; Megatron's ChainedOptimizer of
// a dense and an expert DistributedOptimizer): one optimizer whose shard is the concatenation of
// this rank's shards of every buffer, one inf check and one grad norm over all of them (each
// buffer's pieces counted by the duplicate rule of its own tensor-parallel rank).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "optim/grad_buffer.h"
#include "optim/optimizer.h"

namespace megatron::optim {

class DistributedOptimizer final : public MegatronOptimizer {
 public:
  // `buffer` was built with pad_for_sharding over the model's parameters; it outlives this.
  // tp_rank: this rank's tensor-parallel rank (the grad-norm duplicate rule).
  DistributedOptimizer(ParamAndGradBuffer& buffer, const OptimizerConfig& cfg,
                       Communicator& grad_stats, int tp_rank);
  struct BufferPart {
    ParamAndGradBuffer* buffer = nullptr;
    int tp_rank = 0;  // this rank's tensor-parallel rank in the group its weights are split over
  };
  // `params`: the model's parameters in model order (parameters() and the piece indices follow
  // it); every one of them is in exactly one buffer.
  DistributedOptimizer(model::ParameterList params, std::vector<BufferPart> buffers,
                       const OptimizerConfig& cfg, Communicator& grad_stats);

  // MegatronOptimizer (megatron_optimizer.h).
  void zero_grad() override;
  // After buffer.finish_grad_sync(). Ends with the parameter all-gather (launched only, with the
  // buffer's overlap_param_gather; none when the step is skipped).
  StepResult step(double lr, double weight_decay, GradScaler& scaler,
                  double decoupled_lr = std::nan("")) override;
  void set_decoupled_lr_params(std::vector<bool> flags) override;
  void finish_param_sync() override;
  const OptimizerConfig& config() const override { return cfg_; }
  const model::ParameterList& parameters() const override { return params_; }
  int64_t step_count() const override { return step_count_; }
  void set_step_count(int64_t n) override { step_count_ = n; }
  // Main shard <- model parameters (after loading model weights without optimizer state).
  void reload_main_from_model() override;
  // Model parameters <- main shard (then all-gathered, blocking), after loading the main shard.
  void copy_main_to_model() override;
  // This rank's pieces (BufferLayout::shard_pieces of its DP rank, buffer after buffer) as views
  // of the shard.
  std::vector<StatePiece> state_pieces() override;
  std::optional<ShardBuffers> shard() const override;

  ParamAndGradBuffer& buffer() const { return *parts_.front().buffer; }  // the first
  // Shard state, [total_shard_size] fp32 each, indexed by Piece::shard_offset (padding included).
  // exp_avg is SGD's momentum buffer; exp_avg_sq is undefined for SGD.
  Tensor main_params() const { return main_; }
  Tensor exp_avg() const { return exp_avg_; }
  Tensor exp_avg_sq() const { return exp_avg_sq_; }

 private:
  // One buffer's share: its pieces with their parameter indices (model order) and shard offsets
  // (in main_) already translated.
  struct Part {
    ParamAndGradBuffer* buffer = nullptr;
    int tp_rank = 0;
    int64_t base = 0;  // where this buffer's shard starts in main_
    std::vector<BufferLayout::Piece> pieces;
  };
  model::ParameterList params_;
  std::vector<Part> parts_;
  OptimizerConfig cfg_;
  Communicator& grad_stats_;
  Tensor main_, exp_avg_, exp_avg_sq_;
  std::vector<bool> decoupled_;
  int64_t step_count_ = 0;
};

}  // namespace megatron::optim
