// The T5 leader's calls, checked and then broadcast to the tensor-parallel ranks (t5_leader.h).
#include "inference/t5_leader.h"

#include "core/error.h"

namespace megatron::inference {

T5LeaderEngine::T5LeaderEngine(std::unique_ptr<T5Engine> local, std::shared_ptr<Communicator> group)
    : local_(std::move(local)), group_(std::move(group)) {
  MG_CHECK(local_ && group_ && group_->rank() == 0,
           "T5LeaderEngine: the leader is rank 0 of its tensor-parallel group");
}

T5LeaderEngine::~T5LeaderEngine() {
  try {
    finish();
  } catch (...) {  // a failing group ends the job elsewhere; a destructor must not throw
  }
}

void T5LeaderEngine::finish() {
  if (finished_) return;
  finished_ = true;
  stop_followers(*group_);
}

void T5LeaderEngine::send(LeaderCall op, std::vector<int64_t> args) {
  MG_CHECK(!finished_, "T5LeaderEngine: a call after finish()");
  send_leader_call(*group_, op, std::move(args));
}

void T5LeaderEngine::set_encoder_inputs(std::vector<std::vector<int32_t>> inputs) {
  local_->check_inputs(inputs);
  std::vector<int64_t> args = {int64_t(inputs.size()), 0};
  for (const auto& in : inputs) args.push_back(int64_t(in.size()));
  for (const auto& in : inputs) args.insert(args.end(), in.begin(), in.end());
  send(LeaderCall::encoder_inputs, std::move(args));
  local_->set_encoder_inputs(std::move(inputs));
}

void T5LeaderEngine::start(int64_t batch, int64_t max_len) {
  local_->check_start(batch, max_len);
  send(LeaderCall::start, {batch, max_len});
  local_->start(batch, max_len);
}

// The follower runs a lockstep forward as forward_slots over every row.
Tensor T5LeaderEngine::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  const int64_t batch = local_->rows();
  MG_CHECK(batch > 0 && n >= 1 && int64_t(tokens.size()) == batch * n, "forward: ",
           tokens.size(), " tokens for ", batch, "x", n);
  std::vector<int64_t> rows(static_cast<size_t>(batch)), counts(static_cast<size_t>(batch), n);
  for (int64_t b = 0; b < batch; ++b) rows[size_t(b)] = b;
  local_->check_run(rows, tokens, counts);
  send(LeaderCall::forward, forward_call_args(rows, tokens, counts, all_positions));
  return local_->forward(tokens, n, all_positions);
}

void T5LeaderEngine::reorder(std::span<const int64_t> src) {
  local_->check_reorder(src);
  std::vector<int64_t> args = {int64_t(src.size()), 0};
  args.insert(args.end(), src.begin(), src.end());
  send(LeaderCall::reorder, std::move(args));
  local_->reorder(src);
}

void T5LeaderEngine::start_slots(int64_t slots, int64_t max_len) {
  local_->check_start_slots(slots, max_len);
  send(LeaderCall::start_slots, {slots, max_len});
  local_->start_slots(slots, max_len);
}

void T5LeaderEngine::set_slot_encoder_input(int64_t slot, std::span<const int32_t> input) {
  local_->check_slot(slot);
  local_->check_input(size_t(slot), input);
  std::vector<int64_t> args = {slot, 0};
  args.insert(args.end(), input.begin(), input.end());
  send(LeaderCall::slot_encoder_input, std::move(args));
  local_->set_slot_encoder_input(slot, input);
}

void T5LeaderEngine::clear_slot(int64_t slot) {
  local_->check_slot(slot);
  send(LeaderCall::clear_slot, {slot});
  local_->clear_slot(slot);
}

void T5LeaderEngine::grow_slots(int64_t max_len) {
  local_->check_grow(max_len);
  send(LeaderCall::grow_slots, {max_len});
  local_->grow_slots(max_len);
}

Tensor T5LeaderEngine::forward_slots(std::span<const int64_t> slots,
                                     std::span<const int32_t> tokens,
                                     std::span<const int64_t> counts, bool all_positions) {
  local_->check_run(slots, tokens, counts);
  send(LeaderCall::forward, forward_call_args(slots, tokens, counts, all_positions));
  return local_->forward_slots(slots, tokens, counts, all_positions);
}

}  // namespace megatron::inference
