// Serving a T5 checkpoint on tensor-parallel ranks (`megatron serve` under launch with
// --tensor-model-parallel-size T): rank 0 leads and runs everything a single process runs (the
// HTTP server, tokenizing, the generation loop, sampling); its model is a T5LeaderEngine over its
// own T5Engine shard. Every call on it (the encoder inputs, start, forward, reorder, cache slots)
// is checked on the leader first, then broadcast to the other ranks of the tensor-parallel group
// (the wire of distributed_engine.h), then run by every rank on its shard: the encoder and the
// decoder's layers all-reduce inside, and the logits are gathered over the vocabulary shards on
// every rank, so the leader samples the single process's tokens. The other ranks run
// follow_leader on their T5Engine until the leader finishes. A call the leader's checks refuse
// fails on the leader alone, before anything is sent, so the followers stay in step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "inference/distributed_engine.h"
#include "inference/t5_engine.h"

namespace megatron::inference {

class T5LeaderEngine final : public LanguageModel {
 public:
  // `local`: the leader's shard; `group`: the tensor-parallel group, of which the leader is rank 0.
  T5LeaderEngine(std::unique_ptr<T5Engine> local, std::shared_ptr<Communicator> group);
  ~T5LeaderEngine() override;

  int64_t vocab_size() const override { return local_->vocab_size(); }
  int64_t max_sequence_length() const override { return local_->max_sequence_length(); }
  bool encoder_decoder() const override { return true; }
  void set_encoder_inputs(std::vector<std::vector<int32_t>> inputs) override;
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return local_->position(); }

  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override;
  void set_slot_encoder_input(int64_t slot, std::span<const int32_t> input) override;
  void clear_slot(int64_t slot) override;
  void grow_slots(int64_t max_len) override;
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override;

  // Tells the followers that serving is over and waits until each has received it (they return
  // from follow_leader). Idempotent; the destructor calls it.
  void finish();
  int group_size() const { return group_->size(); }

 private:
  void send(LeaderCall op, std::vector<int64_t> args);

  std::unique_ptr<T5Engine> local_;
  std::shared_ptr<Communicator> group_;
  bool finished_ = false;
};

}  // namespace megatron::inference
