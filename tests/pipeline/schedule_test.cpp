// The pipeline schedules as data: warm-up / steady / cool-down counts against values computed by
// hand from Megatron's formulas, the exact pass orders of small cases, the layout and
// micro-batch errors, and a simulation of all ranks of every small (P, M, v) that executes the
// schedules with non-blocking sends and blocking receives (as forward_backward.cpp does) and
// checks that they finish (no deadlock), that every received message is the one the pass expects
// (FIFO matching per direction is enough), and that 1F1B bounds the micro-batches in flight.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

#include "core/error.h"
#include "model/stage_model.h"
#include "pipeline/schedules.h"

namespace megatron::pipeline {
namespace {

struct Counts {
  int warmup, steady, cooldown;
  bool operator==(const Counts&) const = default;
};
Counts counts(const Schedule& s) { return {s.num_warmup, s.num_steady, s.num_cooldown}; }
std::ostream& operator<<(std::ostream& os, const Counts& c) {
  return os << "{" << c.warmup << ", " << c.steady << ", " << c.cooldown << "}";
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineSchedule, NoPipeliningIsForwardThenBackwardPerMicrobatch) {
  const Schedule s = no_pipelining_schedule(3);
  EXPECT_EQ(s.kind, ScheduleKind::NoPipelining);
  EXPECT_EQ(to_string(s), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(counts(s), (Counts{0, 3, 0}));
  for (const Step& st : s.steps) EXPECT_FALSE(st.recv || st.send);
  EXPECT_EQ(to_string(no_pipelining_schedule(2, true)), "F0 F1");
  EXPECT_EQ(make_schedule(1, 0, 3, 1).kind, ScheduleKind::NoPipelining);
}

// warmup = min(P - r - 1, M), steady = M - warmup, cooldown = warmup.
TEST(PipelineSchedule, OneFOneBCountsAreMegatrons) {
  const Counts p4m8[] = {{3, 5, 3}, {2, 6, 2}, {1, 7, 1}, {0, 8, 0}};
  const Counts p4m2[] = {{2, 0, 2}, {2, 0, 2}, {1, 1, 1}, {0, 2, 0}};
  const Counts p2m1[] = {{1, 0, 1}, {0, 1, 0}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(counts(one_f_one_b_schedule(4, r, 8)), p4m8[r]) << "rank " << r;
    EXPECT_EQ(counts(one_f_one_b_schedule(4, r, 2)), p4m2[r]) << "rank " << r;
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(counts(one_f_one_b_schedule(2, r, 1)), p2m1[r]);
  EXPECT_EQ(make_schedule(4, 1, 8, 1).kind, ScheduleKind::OneFOneB);
}

TEST(PipelineSchedule, OneFOneBOrderAndTransfers) {
  EXPECT_EQ(to_string(one_f_one_b_schedule(4, 0, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(to_string(one_f_one_b_schedule(4, 1, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(to_string(one_f_one_b_schedule(4, 2, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(to_string(one_f_one_b_schedule(4, 3, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(to_string(one_f_one_b_schedule(3, 0, 4, true)), "F0 F1 F2 F3");
  // First stage: no forward receive, no backward send; last stage the reverse.
  for (const Step& st : one_f_one_b_schedule(3, 0, 2).steps)
    EXPECT_EQ(std::pair(st.recv, st.send),
              st.pass == Pass::Forward ? std::pair(false, true) : std::pair(true, false));
  for (const Step& st : one_f_one_b_schedule(3, 2, 2).steps)
    EXPECT_EQ(std::pair(st.recv, st.send),
              st.pass == Pass::Forward ? std::pair(true, false) : std::pair(false, true));
  for (const Step& st : one_f_one_b_schedule(3, 1, 2).steps) EXPECT_TRUE(st.recv && st.send);
}

// warmup = (P - r - 1) * 2 + (v - 1) * P (all M*v when M == P), steady = M*v - warmup.
TEST(PipelineSchedule, InterleavedCountsAreMegatrons) {
  const Counts p2v2m4[] = {{4, 4, 4}, {2, 6, 2}};
  const Counts p4v2m8[] = {{10, 6, 10}, {8, 8, 8}, {6, 10, 6}, {4, 12, 4}};
  const Counts p4v3m8[] = {{14, 10, 14}, {12, 12, 12}, {10, 14, 10}, {8, 16, 8}};
  for (int r = 0; r < 2; ++r) EXPECT_EQ(counts(interleaved_schedule(2, r, 4, 2)), p2v2m4[r]);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(counts(interleaved_schedule(4, r, 8, 2)), p4v2m8[r]) << "rank " << r;
    EXPECT_EQ(counts(interleaved_schedule(4, r, 8, 3)), p4v3m8[r]) << "rank " << r;
    // M == P: every forward first, then every backward.
    EXPECT_EQ(counts(interleaved_schedule(4, r, 4, 2)), (Counts{8, 0, 8})) << "rank " << r;
  }
  EXPECT_EQ(counts(interleaved_schedule(2, 1, 6, 2)), (Counts{2, 10, 2}));
  EXPECT_EQ(counts(interleaved_schedule(2, 0, 4, 2, true)), (Counts{8, 0, 0}));
  EXPECT_EQ(make_schedule(2, 0, 4, 2).kind, ScheduleKind::Interleaved);
}

// Micro-batches go in groups of P per chunk: chunk 0's group, chunk 1's group, then the next
// group; backwards walk the chunks in reverse.
TEST(PipelineSchedule, InterleavedOrder) {
  EXPECT_EQ(to_string(interleaved_schedule(2, 0, 4, 2)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(to_string(interleaved_schedule(2, 1, 4, 2)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(to_string(interleaved_schedule(2, 0, 2, 2)), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // Transfers on rank 0 of 2: chunk 0 is virtual stage 0 (no forward input), chunk 1 is virtual
  // stage 2 of 4 (receives from rank 1's chunk 0, sends to rank 1's chunk 1).
  for (const Step& st : interleaved_schedule(2, 0, 2, 2).steps) {
    const bool stage0 = st.chunk == 0;
    if (st.pass == Pass::Forward) {
      EXPECT_EQ(st.recv, !stage0);
      EXPECT_TRUE(st.send);
    } else {
      EXPECT_TRUE(st.recv);
      EXPECT_EQ(st.send, !stage0);
    }
  }
}

TEST(PipelineSchedule, BadConfigurationsGiveClearErrors) {
  EXPECT_NE(error_of([] { interleaved_schedule(2, 0, 3, 2); })
                .find("number of micro-batches (3) is not divisible by "
                      "--pipeline-model-parallel-size (2) when using the interleaved schedule"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(4, 1, 6, 2); }).find("not divisible"), std::string::npos);
  EXPECT_NE(error_of([] { one_f_one_b_schedule(2, 0, 0); }).find("micro-batches must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(1, 0, 4, 2); }).find("--pipeline-model-parallel-size > 1"),
            std::string::npos);
  EXPECT_NO_THROW(one_f_one_b_schedule(4, 0, 3));  // 1F1B takes any count
}

TEST(PipelineLayoutTest, MegatronSplitOfLayersAndChunks) {
  using model::PipelineLayout;
  const PipelineLayout a = PipelineLayout::make(8, 4);
  EXPECT_EQ(a.num_chunks, 1);
  EXPECT_EQ(a.layers_per_chunk(), 2);
  EXPECT_EQ(a.first_layer(2, 0), 4);
  EXPECT_TRUE(a.has_embedding(0, 0));
  EXPECT_FALSE(a.has_output(2, 0));
  EXPECT_TRUE(a.has_output(3, 0));
  // 8 layers, P = 2, one layer per virtual stage: rank 0 holds layers 0, 2, 4, 6; rank 1 holds
  // 1, 3, 5, 7 (chunk c of rank r is virtual stage c*P + r).
  const PipelineLayout b = PipelineLayout::make(8, 2, 1);
  EXPECT_EQ(b.num_chunks, 4);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(b.first_layer(0, c), 2 * c);
    EXPECT_EQ(b.first_layer(1, c), 2 * c + 1);
  }
  EXPECT_TRUE(b.has_embedding(0, 0));
  EXPECT_FALSE(b.has_embedding(1, 0));
  EXPECT_TRUE(b.has_output(1, 3));
  EXPECT_FALSE(b.has_output(0, 3));
  const PipelineLayout c = PipelineLayout::make(8, 2, 2);
  EXPECT_EQ(c.num_chunks, 2);
  EXPECT_EQ(c.first_layer(1, 1), 6);
  EXPECT_EQ(PipelineLayout::make(8, 2, 4).num_chunks, 1);

  EXPECT_NE(error_of([] { PipelineLayout::make(6, 4); })
                .find("--num-layers 6 is not divisible by --pipeline-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { PipelineLayout::make(8, 2, 3); })
                .find("not divisible by --num-layers-per-virtual-pipeline-stage 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { PipelineLayout::make(4, 1, 2); })
                .find("--pipeline-model-parallel-size > 1"),
            std::string::npos);
  PipelineLayout bad;
  bad.num_layers = 6;
  bad.pipeline_size = 2;
  bad.num_chunks = 2;
  EXPECT_THROW(bad.validate(), Error);
}

// ---- Simulation of all ranks ------------------------------------------------------------------
// A message names the pass it is for: (micro-batch, destination virtual stage).
struct Msg {
  int microbatch, virtual_stage;
};

struct SimResult {
  bool finished = true;
  std::string problem;
  std::vector<int> max_in_flight;
};

SimResult simulate(int P, int M, int v) {
  std::vector<Schedule> sched;
  for (int r = 0; r < P; ++r) sched.push_back(make_schedule(P, r, M, v));
  // channel[(src, dst, kind)] in send order (kind 0: activations, 1: gradients).
  std::map<std::tuple<int, int, int>, std::deque<Msg>> channel;
  std::vector<size_t> pc(size_t(P), 0);
  // (virtual stage, micro-batch) pairs forwarded and not yet backwarded / ever forwarded
  std::vector<std::set<std::pair<int, int>>> held(static_cast<size_t>(P));
  std::vector<std::set<std::pair<int, int>>> done_fwd(static_cast<size_t>(P));
  SimResult res;
  res.max_in_flight.assign(size_t(P), 0);
  auto fail = [&](const std::string& why) {
    res.finished = false;
    if (res.problem.empty()) res.problem = why;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (pc[size_t(r)] < sched[size_t(r)].steps.size()) {
        const Step& st = sched[size_t(r)].steps[pc[size_t(r)]];
        const int vs = st.chunk * P + r;
        const bool fwd = st.pass == Pass::Forward;
        const int src = fwd ? (r + P - 1) % P : (r + 1) % P;
        if (st.recv) {
          auto& q = channel[{src, r, fwd ? 0 : 1}];
          if (q.empty()) break;  // blocked
          const Msg m = q.front();
          q.pop_front();
          if (m.microbatch != st.microbatch || m.virtual_stage != vs)
            fail("rank " + std::to_string(r) + " expected (mb " + std::to_string(st.microbatch) +
                 ", vs " + std::to_string(vs) + ") got (mb " + std::to_string(m.microbatch) +
                 ", vs " + std::to_string(m.virtual_stage) + ")");
        }
        if (fwd) {
          held[size_t(r)].insert({vs, st.microbatch});
          done_fwd[size_t(r)].insert({vs, st.microbatch});
        } else if (held[size_t(r)].erase({vs, st.microbatch}) == 0) {
          fail("backward before forward on rank " + std::to_string(r));
        }
        res.max_in_flight[size_t(r)] =
            std::max(res.max_in_flight[size_t(r)], int(held[size_t(r)].size()));
        if (st.send) {
          const int dst = fwd ? (r + 1) % P : (r + P - 1) % P;
          channel[{r, dst, fwd ? 0 : 1}].push_back({st.microbatch, fwd ? vs + 1 : vs - 1});
        }
        ++pc[size_t(r)];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    if (pc[size_t(r)] != sched[size_t(r)].steps.size())
      fail("deadlock: rank " + std::to_string(r) + " stuck at step " +
           std::to_string(pc[size_t(r)]));
    if (int(done_fwd[size_t(r)].size()) != M * v) fail("missing forwards");
  }
  for (auto& [key, q] : channel)
    if (!q.empty()) fail("unconsumed messages");
  return res;
}

TEST(PipelineSchedule, EveryScheduleRunsToCompletionWithMatchingMessages) {
  int cases = 0;
  for (int P = 1; P <= 6; ++P)
    for (int v = 1; v <= (P == 1 ? 1 : 4); ++v)
      for (int M = 1; M <= 13; ++M) {
        if (v > 1 && M % P != 0) continue;
        SCOPED_TRACE("P=" + std::to_string(P) + " v=" + std::to_string(v) +
                     " M=" + std::to_string(M));
        const SimResult r = simulate(P, M, v);
        EXPECT_TRUE(r.finished) << r.problem;
        for (int rank = 0; rank < P; ++rank) {
          const Schedule s = make_schedule(P, rank, M, v);
          // At most warmup + 1 micro-batches held (1F1B's memory bound: P - r, not M).
          EXPECT_LE(r.max_in_flight[size_t(rank)], s.num_warmup + 1);
          if (v == 1 && P > 1) {
            EXPECT_LE(r.max_in_flight[size_t(rank)], std::min(P - rank, M));
          }
          EXPECT_EQ(int(s.steps.size()), 2 * M * v);
        }
        ++cases;
      }
  EXPECT_GT(cases, 100);
}

}  // namespace
}  // namespace megatron::pipeline
