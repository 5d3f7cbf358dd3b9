// Generation across tensor- and pipeline-parallel ranks, as Megatron's text generation does it:
// one rank leads, the others follow. The leader (the first pipeline stage's tensor-parallel
// rank 0 of a model-parallel group; world rank 0 without data parallelism) runs everything a
// single process runs: tokenizing, the generation loop, sampling, the HTTP server, printing. Its
// model is a DistributedEngine: every call on it (start, forward, reorder, cache slots) is first
// checked on the leader, then broadcast over the model-parallel group, and then run by every
// rank on its own stage and shard (GPTEngine's stage constructor: KV caches for its own heads and
// layers, the usual all-reduces inside the layers, activations passed stage to stage). The
// logits, gathered over tensor parallelism on the last stage, come back to the leader, which
// samples; so every rank takes the same branch, and the tokens are the single-process ones.
//
// A call the leader's checks refuse (a sequence beyond the model's length, a token outside the
// vocabulary) fails on the leader alone, before anything is sent: the followers never see it and
// stay in step. The followers wait (follow_leader) without a timeout, polling and sleeping, so
// an idle server costs no CPU; finish() (or the leader's destructor) sends them the end. An
// exception on any rank ends the whole job (the CLI's abort_job_if_distributed), never a hang.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "inference/gpt_engine.h"

namespace megatron::inference {

class DistributedEngine final : public LanguageModel {
 public:
  // `local`: the leader's own stage; `group`: the model-parallel group, of which the leader is
  // rank 0. `vocab_width`: the logits' width (the vocabulary padded as for one rank, the width
  // the single-process path gives; the extra rows of a wider tensor-parallel padding are
  // dropped, so both paths normalise over the same vocabulary).
  DistributedEngine(std::unique_ptr<GPTEngine> local, std::shared_ptr<Communicator> group,
                    int64_t vocab_width);
  ~DistributedEngine() override;

  int64_t vocab_size() const override { return vocab_width_; }
  int64_t max_sequence_length() const override { return local_->max_sequence_length(); }
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return local_->position(); }
  bool supports_ragged() const override { return true; }
  Tensor prefill_ragged(std::span<const std::vector<int32_t>> prompts, bool all_positions) override;
  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override;
  void clear_slot(int64_t slot) override;
  void grow_slots(int64_t max_len) override;
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override;

  // Tells the followers that generation is over and waits until each has received it (they
  // return from follow_leader). Idempotent.
  void finish();
  GPTEngine& local() { return *local_; }

 private:
  void send(int64_t op, std::vector<int64_t> args);

  std::unique_ptr<GPTEngine> local_;
  std::shared_ptr<Communicator> group_;
  int64_t vocab_width_ = 0;
  bool finished_ = false;
};

// A follower's whole job: runs on `local` the calls the leader (rank 0 of `group`) broadcasts,
// until it finishes. `local` is this rank's GPTEngine stage, or its T5Engine shard (whose leader
// also sends the encoder inputs: t5_leader.h).
void follow_leader(LanguageModel& local, Communicator& group);

// The leader's side of the wire, for leaders other than DistributedEngine: one call of
// LanguageModel (by its name in the follower's switch) with its int64 arguments, broadcast to the
// followers of `group` (the leader is its rank 0). The caller has checked the call first.
enum class LeaderCall : int64_t {
  stop = 0, start, start_slots, forward, reorder, clear_slot, grow_slots,
  encoder_inputs,      // args {rows, 0, length of each row's input, the inputs back to back}
  slot_encoder_input,  // args {slot, 0, the input's tokens}
};
void send_leader_call(Communicator& group, LeaderCall op, std::vector<int64_t> args);
// The arguments of LeaderCall::forward (a forward_slots call).
std::vector<int64_t> forward_call_args(std::span<const int64_t> slots,
                                       std::span<const int32_t> tokens,
                                       std::span<const int64_t> counts, bool all_positions);
// Ends the followers of `group` (stop, then a barrier once each has received it).
void stop_followers(Communicator& group);

}  // namespace megatron::inference
