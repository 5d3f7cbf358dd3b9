// One rank's share of a layout, measured (measure.h).
#include "plan/measure.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "core/host_memory.h"
#include "plan/simulated_communicator.h"

namespace megatron::plan {

int first_rank_of_stage(const Layout& l, int pp_rank) { return pp_rank * l.tp * l.cp * l.dp; }

namespace {

// Restarts the kernel's resident high-water mark (VmHWM) at the current resident set.
void reset_resident_peak() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

}  // namespace

Measurement measure_rank(const PlanInput& in, int world_rank, int iterations) {
  MG_REQUIRE(iterations >= 2, "--measure-iters must be >= 2 (the first step warms up; got ",
             iterations, ")");
  MG_REQUIRE(world_rank >= 0 && world_rank < in.world_size, "--measure-rank ", world_rank,
             " is outside the world of ", in.world_size, " ranks");
  training::TrainingArgs a = in.args;
  // The run's model, layout, batch, optimizer and data (its first samples); no checkpoint, no
  // evaluation, no metrics files.
  a.train_iters = iterations;
  a.train_samples = 0;
  a.rampup_batch_size.clear();
  a.step_batch_size_schedule.clear();
  a.lr_decay_iters = a.lr_warmup_iters = 0;
  a.lr_decay_samples = a.lr_warmup_samples = a.lr_wsd_decay_iters = a.lr_wsd_decay_samples = 0;
  a.eval_iters = 0;
  a.log_interval = iterations;
  a.save.clear();
  a.save_interval = 0;
  a.load.clear();
  a.metrics_jsonl.clear();
  a.tensorboard.dir.clear();
  a.exit_interval = 0;
  a.exit_duration_in_mins = 0;
  a.exit_signal_handler = false;
  a.skip_train = false;
  if (a.lr < 0) a.lr = 1e-4;
  if (a.min_lr > a.lr) a.min_lr = 0;
  const ParallelConfig pc = parallel_config(in);
  Measurement m;
  m.world_rank = world_rank;
  m.pp_rank = world_rank / (in.layout.tp * in.layout.cp * in.layout.dp);
  m.iterations = iterations;
  m.resident_before = double(resident_memory().current);
  // The rank's share of this machine's cores, as `megatron launch` gives it.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(1, cores / std::min(in.world_size, cores)));
  reset_host_memory_peak();
  reset_resident_peak();
  training::TrainingSummary s;
  try {
    s = training::pretrain(a, make_simulated_world(pc, world_rank));
  } catch (...) {
    omp_set_num_threads(saved_threads);
    throw;
  }
  omp_set_num_threads(saved_threads);
  m.peak_allocated = double(host_memory_stats().peak);
  m.peak_resident = double(resident_memory().peak);
  std::vector<double> t(s.iteration_seconds.begin() + 1, s.iteration_seconds.end());
  std::sort(t.begin(), t.end());
  m.seconds_per_iteration = t.empty() ? 0 : t[t.size() / 2];
  return m;
}

}  // namespace megatron::plan
