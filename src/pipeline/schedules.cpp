// The pass orders of Megatron's three schedules (see schedules.h).
#include "pipeline/schedules.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::pipeline {

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::NoPipelining: return "no-pipelining";
    case ScheduleKind::OneFOneB: return "1F1B";
    case ScheduleKind::Interleaved: return "interleaved 1F1B";
  }
  return "?";
}

namespace {

void check_common(int P, int r, int M, int v) {
  MG_REQUIRE(M >= 1, "the number of micro-batches must be >= 1 (got ", M,
             "); --global-batch-size must be at least --micro-batch-size x data-parallel size");
  MG_REQUIRE(P >= 1 && r >= 0 && r < P, "pipeline rank ", r, " outside [0, ", P, ")");
  MG_REQUIRE(v >= 1, "virtual pipeline stages per rank must be >= 1 (got ", v, ")");
}

// The transfers of a pass of chunk c on rank r (virtual stage c*P + r of P*v).
Step make_step(Pass pass, int mb, int c, int P, int r, int v) {
  const bool first = c == 0 && r == 0, last = c == v - 1 && r == P - 1;
  Step s;
  s.pass = pass;
  s.microbatch = mb;
  s.chunk = c;
  if (pass == Pass::Forward) {
    s.recv = !first;
    s.send = !last;
  } else {
    s.recv = !last;
    s.send = !first;
  }
  return s;
}

// warmup forwards of 0..w-1, then (forward w+i, backward i) pairs, then the remaining backwards;
// fwd(k) / bwd(k) give the k-th forward / backward pass.
template <class F, class B>
void fill(Schedule& s, int total, F fwd, B bwd) {
  if (s.forward_only) {
    s.num_warmup = total;
    s.num_steady = s.num_cooldown = 0;
    for (int k = 0; k < total; ++k) s.steps.push_back(fwd(k));
    return;
  }
  s.num_steady = total - s.num_warmup;
  s.num_cooldown = s.num_warmup;
  for (int k = 0; k < s.num_warmup; ++k) s.steps.push_back(fwd(k));
  for (int i = 0; i < s.num_steady; ++i) {
    s.steps.push_back(fwd(s.num_warmup + i));
    s.steps.push_back(bwd(i));
  }
  for (int k = s.num_steady; k < total; ++k) s.steps.push_back(bwd(k));
}

}  // namespace

Schedule no_pipelining_schedule(int M, bool forward_only) {
  check_common(1, 0, M, 1);
  Schedule s;
  s.kind = ScheduleKind::NoPipelining;
  s.num_microbatches = M;
  s.forward_only = forward_only;
  for (int m = 0; m < M; ++m) {
    s.steps.push_back(make_step(Pass::Forward, m, 0, 1, 0, 1));
    if (!forward_only) s.steps.push_back(make_step(Pass::Backward, m, 0, 1, 0, 1));
  }
  s.num_warmup = forward_only ? M : 0;
  s.num_steady = forward_only ? 0 : M;
  return s;
}

Schedule one_f_one_b_schedule(int P, int r, int M, bool forward_only) {
  check_common(P, r, M, 1);
  Schedule s;
  s.kind = ScheduleKind::OneFOneB;
  s.pipeline_size = P;
  s.pipeline_rank = r;
  s.num_microbatches = M;
  s.forward_only = forward_only;
  s.num_warmup = std::min(P - r - 1, M);
  fill(
      s, M, [&](int k) { return make_step(Pass::Forward, k, 0, P, r, 1); },
      [&](int k) { return make_step(Pass::Backward, k, 0, P, r, 1); });
  return s;
}

Schedule interleaved_schedule(int P, int r, int M, int v, bool forward_only) {
  check_common(P, r, M, v);
  MG_REQUIRE(P > 1, "the interleaved schedule (--num-layers-per-virtual-pipeline-stage) needs "
             "--pipeline-model-parallel-size > 1");
  MG_REQUIRE(M % P == 0, "number of micro-batches (", M,
             ") is not divisible by --pipeline-model-parallel-size (", P,
             ") when using the interleaved schedule (--num-layers-per-virtual-pipeline-stage); "
             "make --global-batch-size / (--micro-batch-size x data-parallel size) a multiple "
             "of ", P);
  Schedule s;
  s.kind = ScheduleKind::Interleaved;
  s.pipeline_size = P;
  s.pipeline_rank = r;
  s.num_microbatches = M;
  s.num_chunks = v;
  s.forward_only = forward_only;
  const int total = M * v, group = P * v;
  if (M == P) {
    s.num_warmup = total;  // all forwards, then all backwards
  } else {
    s.num_warmup = std::min((P - r - 1) * 2 + (v - 1) * P, total);
  }
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % group) / P;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / group) * P + k % P; };
  fill(
      s, total,
      [&](int k) { return make_step(Pass::Forward, microbatch_of(k), chunk_of(k, true), P, r, v); },
      [&](int k) {
        return make_step(Pass::Backward, microbatch_of(k), chunk_of(k, false), P, r, v);
      });
  return s;
}

Schedule make_schedule(int P, int r, int M, int v, bool forward_only) {
  if (P == 1) {
    MG_REQUIRE(v == 1, "virtual pipeline stages (", v,
               " per rank) need --pipeline-model-parallel-size > 1");
    return no_pipelining_schedule(M, forward_only);
  }
  if (v > 1) return interleaved_schedule(P, r, M, v, forward_only);
  return one_f_one_b_schedule(P, r, M, forward_only);
}

std::string to_string(const Schedule& s) {
  std::string out;
  for (const Step& st : s.steps) {
    if (!out.empty()) out += ' ';
    out += st.pass == Pass::Forward ? 'F' : 'B';
    out += std::to_string(st.microbatch);
    if (s.num_chunks > 1) out += "." + std::to_string(st.chunk);
  }
  return out;
}

}  // namespace megatron::pipeline
