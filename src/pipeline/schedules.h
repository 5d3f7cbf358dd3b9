// Megatron's pipeline schedules as data: for one pipeline rank, the ordered list of forward and
// backward passes over (micro-batch, model chunk), with the point-to-point transfers each pass
// needs. Pure arithmetic (no communication), so the warm-up / steady / cool-down counts are
// unit-tested against Megatron's formulas and every (P, M, v) can be checked for deadlock by
// simulation; pipeline/forward_backward.h executes a schedule.
//
// With P pipeline ranks, M micro-batches and v model chunks per rank (megatron/core/
// pipeline_parallel/schedules.py):
//  - no pipelining (P = 1): F(m) B(m) for every micro-batch.
//  - 1F1B: rank r runs warmup = min(P - r - 1, M) forwards, then M - warmup steady-state pairs
//    (the forward of micro-batch warmup + i, the backward of micro-batch i), then warmup
//    cool-down backwards.
//  - interleaved 1F1B (v > 1): M must be a multiple of P. The M*v virtual micro-batches k are
//    taken in groups of P*v: within a group, chunk 0's P micro-batches, then chunk 1's, ...
//    (forward chunk = (k mod P*v) / P, micro-batch = (k / (P*v)) * P + k mod P; backward walks
//    the chunks in reverse). warmup = (P - r - 1) * 2 + (v - 1) * P capped at M*v, or all M*v
//    when M == P; then M*v - warmup steady pairs; then warmup cool-down backwards.
//  - forward only (evaluation): every pass is a warm-up forward.
// A forward of chunk c receives its input from the previous virtual stage unless it is virtual
// stage 0 and sends its output to the next unless it is the last; a backward receives the output
// gradient from the next virtual stage (unless last) and sends the input gradient back (unless
// first). The previous / next virtual stage of (rank r, chunk c) is on rank r -/+ 1, wrapping
// from rank P-1 chunk c to rank 0 chunk c+1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::pipeline {

enum class Pass : uint8_t { Forward, Backward };

struct Step {
  Pass pass = Pass::Forward;
  int microbatch = 0;  // 0 .. M-1
  int chunk = 0;       // model chunk on this rank, 0 .. v-1
  bool recv = false;   // forward: input from the previous stage; backward: grad from the next
  bool send = false;   // forward: output to the next stage; backward: input grad to the previous
  bool operator==(const Step&) const = default;
};

enum class ScheduleKind : uint8_t { NoPipelining, OneFOneB, Interleaved };
const char* schedule_kind_name(ScheduleKind k);  // "no-pipelining", "1F1B", "interleaved 1F1B"

struct Schedule {
  ScheduleKind kind = ScheduleKind::NoPipelining;
  int pipeline_size = 1, pipeline_rank = 0, num_microbatches = 0, num_chunks = 1;
  bool forward_only = false;
  // Counted in (virtual) micro-batch passes, as Megatron's num_warmup_microbatches and
  // num_microbatches_remaining: warmup forwards, steady (forward, backward) pairs, cooldown
  // backwards. No pipelining counts its M forward/backward pairs as steady.
  int num_warmup = 0, num_steady = 0, num_cooldown = 0;
  std::vector<Step> steps;
};

// Megatron's forward_backward_no_pipelining order (P = 1, one chunk).
Schedule no_pipelining_schedule(int num_microbatches, bool forward_only = false);
// forward_backward_pipelining_without_interleaving for rank `pipeline_rank` of `pipeline_size`.
Schedule one_f_one_b_schedule(int pipeline_size, int pipeline_rank, int num_microbatches,
                              bool forward_only = false);
// forward_backward_pipelining_with_interleaving with `num_chunks` model chunks per rank.
// megatron::Error when num_microbatches is not a multiple of pipeline_size.
Schedule interleaved_schedule(int pipeline_size, int pipeline_rank, int num_microbatches,
                              int num_chunks, bool forward_only = false);
// Megatron's get_forward_backward_func: no pipelining at P = 1, interleaved when v > 1, else 1F1B.
Schedule make_schedule(int pipeline_size, int pipeline_rank, int num_microbatches, int num_chunks,
                       bool forward_only = false);

// "F0.1 B0.0 ..." (pass, micro-batch, chunk when v > 1), for messages and tests.
std::string to_string(const Schedule& s);

}  // namespace megatron::pipeline
