// The leader's calls, broadcast to the model-parallel ranks (see distributed_engine.h).
//
// Wire format: a header int64 [4] = {op, payload length, a, b}, then (when the length is not 0)
// the payload int64 [length]. Forward calls carry {calls, all_positions} in a, b and the payload
// slots[calls], counts[calls], tokens[sum counts]; encoder inputs (T5) {rows} in a and the
// payload lengths[rows], tokens[sum lengths]; a slot's encoder input {slot} in a and its tokens.
#include "inference/distributed_engine.h"

#include <chrono>
#include <thread>

#include "core/error.h"

namespace megatron::inference {

namespace {

enum Op : int64_t {
  kStop = int64_t(LeaderCall::stop),
  kStart = int64_t(LeaderCall::start),
  kStartSlots = int64_t(LeaderCall::start_slots),
  kForward = int64_t(LeaderCall::forward),
  kReorder = int64_t(LeaderCall::reorder),
  kClearSlot = int64_t(LeaderCall::clear_slot),
  kGrowSlots = int64_t(LeaderCall::grow_slots),
  kEncoderInputs = int64_t(LeaderCall::encoder_inputs),
  kSlotEncoderInput = int64_t(LeaderCall::slot_encoder_input),
};

constexpr int64_t kHeader = 4;

// Waits for the leader's next header without the group's timeout (a server may idle for hours):
// polls hot for a moment, then sleeps between polls so an idle rank leaves the CPU alone.
void receive_header(Communicator& group, Tensor& header) {
  CommHandle h = group.broadcast_async(header, 0);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0; !h.test(); ++polls) {
    if (polls < 64) continue;
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

struct ForwardCall {
  std::vector<int64_t> slots, counts;
  std::vector<int32_t> tokens;
};

ForwardCall unpack_forward(const std::vector<int64_t>& p, int64_t calls) {
  ForwardCall c;
  MG_CHECK(int64_t(p.size()) >= 2 * calls, "follower: short forward payload");
  c.slots.assign(p.begin(), p.begin() + calls);
  c.counts.assign(p.begin() + calls, p.begin() + 2 * calls);
  for (size_t i = size_t(2 * calls); i < p.size(); ++i) c.tokens.push_back(int32_t(p[i]));
  return c;
}

// Encoder inputs: `rows` lengths, then the rows' tokens back to back.
std::vector<std::vector<int32_t>> unpack_inputs(const std::vector<int64_t>& p, int64_t rows) {
  MG_CHECK(rows >= 1 && int64_t(p.size()) >= rows, "follower: short encoder-input payload");
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(rows));
  size_t at = size_t(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t n = size_t(p[size_t(r)]);
    MG_CHECK(at + n <= p.size(), "follower: short encoder-input payload");
    out[size_t(r)].assign(p.begin() + int64_t(at), p.begin() + int64_t(at + n));
    at += n;
  }
  return out;
}

}  // namespace

DistributedEngine::DistributedEngine(std::unique_ptr<GPTEngine> local,
                                     std::shared_ptr<Communicator> group, int64_t vocab_width)
    : local_(std::move(local)), group_(std::move(group)), vocab_width_(vocab_width) {
  MG_CHECK(local_ && group_ && group_->rank() == 0,
           "DistributedEngine: the leader is rank 0 of its model-parallel group");
  MG_CHECK(vocab_width_ >= 1 && vocab_width_ <= local_->vocab_size(),
           "DistributedEngine: logits width ", vocab_width_, " beyond the model's ",
           local_->vocab_size());
}

DistributedEngine::~DistributedEngine() {
  try {
    finish();
  } catch (...) {  // a failing group ends the job elsewhere; a destructor must not throw
  }
}

void DistributedEngine::finish() {
  if (finished_) return;
  finished_ = true;
  stop_followers(*group_);
}

void DistributedEngine::send(int64_t op, std::vector<int64_t> args) {
  MG_CHECK(!finished_ || op == kStop, "DistributedEngine: a call after finish()");
  send_leader_call(*group_, LeaderCall(op), std::move(args));
}

std::vector<int64_t> forward_call_args(std::span<const int64_t> slots,
                                       std::span<const int32_t> tokens,
                                       std::span<const int64_t> counts, bool all_positions) {
  std::vector<int64_t> args = {int64_t(slots.size()), all_positions ? 1 : 0};
  args.insert(args.end(), slots.begin(), slots.end());
  args.insert(args.end(), counts.begin(), counts.end());
  args.insert(args.end(), tokens.begin(), tokens.end());
  return args;
}

void stop_followers(Communicator& group) {
  send_leader_call(group, LeaderCall::stop, {});
  group.barrier();  // every follower has received the end
}

void send_leader_call(Communicator& group, LeaderCall call, std::vector<int64_t> args) {
  const int64_t op = int64_t(call);
  std::vector<int64_t> head = {op, 0, 0, 0}, payload;
  if (op == kForward) {  // a, b, then the payload
    head[2] = args[0];
    head[3] = args[1];
    payload.assign(args.begin() + 2, args.end());
  } else {
    for (size_t i = 0; i < args.size() && i < 2; ++i) head[2 + i] = args[i];
    if (args.size() > 2) payload.assign(args.begin() + 2, args.end());
  }
  head[1] = int64_t(payload.size());
  Tensor h = Tensor::from_vector(head, {kHeader});
  group.broadcast(h, 0);
  if (!payload.empty()) {
    Tensor p = Tensor::from_vector(payload, {int64_t(payload.size())});
    group.broadcast(p, 0);
  }
}

void DistributedEngine::start(int64_t batch, int64_t max_len) {
  local_->check_start(batch, max_len);
  send(kStart, {batch, max_len});
  local_->start(batch, max_len);
}

void DistributedEngine::start_slots(int64_t slots, int64_t max_len) {
  local_->check_start(slots, max_len);
  send(kStartSlots, {slots, max_len});
  local_->start_slots(slots, max_len);
}

void DistributedEngine::clear_slot(int64_t slot) {
  MG_CHECK(slot >= 0 && slot < local_->slots(), "clear_slot ", slot, " of ", local_->slots());
  send(kClearSlot, {slot});
  local_->clear_slot(slot);
}

void DistributedEngine::grow_slots(int64_t max_len) {
  local_->check_grow(max_len);
  send(kGrowSlots, {max_len});
  local_->grow_slots(max_len);
}

void DistributedEngine::reorder(std::span<const int64_t> src) {
  MG_CHECK(!src.empty() && int64_t(src.size()) <= local_->slots(), "reorder: ", src.size(),
           " rows for batch ", local_->slots());
  for (int64_t s : src) MG_CHECK(s >= 0 && s < local_->slots(), "reorder row out of range");
  std::vector<int64_t> args = {int64_t(src.size()), 0};
  args.insert(args.end(), src.begin(), src.end());
  send(kReorder, args);
  local_->reorder(src);
}

Tensor DistributedEngine::forward_slots(std::span<const int64_t> slots,
                                        std::span<const int32_t> tokens,
                                        std::span<const int64_t> counts, bool all_positions) {
  local_->check_run(slots, tokens, counts);
  send(kForward, forward_call_args(slots, tokens, counts, all_positions));
  const Tensor logits = local_->forward_slots(slots, tokens, counts, all_positions);
  if (logits.size(2) == vocab_width_) return logits;
  return logits.narrow(2, 0, vocab_width_).contiguous();
}

Tensor DistributedEngine::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  const int64_t batch = local_->slots();
  MG_CHECK(n >= 1 && int64_t(tokens.size()) == batch * n, "forward: ", tokens.size(),
           " tokens for ", batch, "x", n);
  std::vector<int64_t> slots(static_cast<size_t>(batch)), counts(static_cast<size_t>(batch), n);
  for (int64_t b = 0; b < batch; ++b) slots[size_t(b)] = b;
  return forward_slots(slots, tokens, counts, all_positions);
}

Tensor DistributedEngine::prefill_ragged(std::span<const std::vector<int32_t>> prompts,
                                         bool all_positions) {
  MG_CHECK(int64_t(prompts.size()) == local_->slots(), "prefill_ragged: ", prompts.size(),
           " prompts for batch ", local_->slots());
  std::vector<int64_t> slots, counts;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    slots.push_back(int64_t(i));
    counts.push_back(int64_t(prompts[i].size()));
    tokens.insert(tokens.end(), prompts[i].begin(), prompts[i].end());
  }
  return forward_slots(slots, tokens, counts, all_positions);
}

void follow_leader(LanguageModel& local, Communicator& group) {
  MG_CHECK(group.rank() != 0, "follow_leader on the leader");
  for (;;) {
    Tensor h = Tensor::zeros({kHeader}, DType::I64);
    receive_header(group, h);
    const int64_t* v = h.data<int64_t>();
    const int64_t op = v[0], len = v[1], a = v[2], b = v[3];
    std::vector<int64_t> payload;
    if (len > 0) {
      Tensor p = Tensor::zeros({len}, DType::I64);
      group.broadcast(p, 0);
      payload.assign(p.data<int64_t>(), p.data<int64_t>() + len);
    }
    switch (op) {
      case kStop:
        group.barrier();
        return;
      case kStart:
        local.start(a, b);
        break;
      case kStartSlots:
        local.start_slots(a, b);
        break;
      case kClearSlot:
        local.clear_slot(a);
        break;
      case kGrowSlots:
        local.grow_slots(a);
        break;
      case kReorder:
        local.reorder(payload);
        break;
      case kForward: {
        const ForwardCall c = unpack_forward(payload, a);
        local.forward_slots(c.slots, c.tokens, c.counts, b != 0);
        break;
      }
      case kEncoderInputs:
        local.set_encoder_inputs(unpack_inputs(payload, a));
        break;
      case kSlotEncoderInput:
        local.set_slot_encoder_input(
            a, std::vector<int32_t>(payload.begin(), payload.end()));
        break;
      default:
        MG_CHECK(false, "follower: unknown call ", op, " from the leader");
    }
  }
}

}  // namespace megatron::inference
