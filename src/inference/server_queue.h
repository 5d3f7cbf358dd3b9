// The server's request queue and scheduler. HTTP threads submit jobs; one scheduler thread
// owns the model and runs them with continuous batching (batch_engine.h): a running batch of up
// to max_batch_size sequences, each in its own KV-cache slot, advances one token per step, and
// between steps the rows of queued jobs are admitted first come, first served into the slots
// that finished sequences freed. A short request that arrives while long ones are generating
// thus joins at the next step and can finish first. Rows of one job are admitted in order; a
// job with more rows than slots is admitted as slots free up; a job is answered when all its
// rows are done. Nothing overtakes the oldest waiting job, so no request starves.
// Beam search jobs run alone: when one reaches the front of the queue, admission pauses until
// the running sequences finish, then the search runs on the model by itself.
// batch_window_ms: when a job arrives at an idle engine, wait this long at most for more jobs
// before the first step (later arrivals join the running batch anyway).
// The queue is bounded: submit() refuses a job when max_queue_size jobs are waiting, so an
// overloaded server answers 503 instead of growing. A failure of one row (its sampling, its
// logits) fails its job alone, and the batch goes on; a failed forward is reported on the jobs
// that were running; nothing here can take the server down.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "inference/batch_engine.h"
#include "inference/beam_search.h"
#include "inference/generation.h"

namespace megatron::inference {

// One request's work and results.
struct Job {
  enum class Kind { Sampling, BeamSearch };
  Kind kind = Kind::Sampling;
  std::vector<SequenceRequest> rows;  // Sampling
  BeamSearchRequest beam;             // BeamSearch

  // Filled by the scheduler.
  std::vector<SequenceResult> results;
  std::vector<BeamHypothesis> hypotheses;
  std::string error;  // non-empty when the engine failed (the message for a 500)
  bool finished = false;
  // Called on the scheduler thread once the job is finished (streaming closes its channel).
  std::function<void(Job&)> on_finished;

  // Blocks until the scheduler has finished the job.
  void wait();
  void mark_finished();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
};

struct SchedulerStats {
  int64_t jobs_done = 0;
  int64_t steps = 0;     // engine steps (forwards over the running batch) and beam searches
  int64_t rejected = 0;
  size_t queued = 0;     // jobs waiting for their first row to be admitted
  int64_t running = 0;   // sequences in the running batch
};

class Scheduler {
 public:
  // Throws megatron::Error when the model has no cache slots.
  Scheduler(LanguageModel& model, int64_t vocab, SpecialTokens special, int max_batch_size,
            size_t max_queue_size, double batch_window_ms = 0.0);
  ~Scheduler();  // stops and joins; queued jobs finish with an error
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the job; false (and the job untouched) when the queue is full or stopping.
  bool submit(std::shared_ptr<Job> job);
  // Stops admitting; the running sequences finish, waiting jobs get an error.
  void stop();
  SchedulerStats stats() const;

 private:
  struct RowRef {
    std::shared_ptr<Job> job;
    size_t row = 0;
  };
  void loop();
  // Admits queued rows into free slots, oldest first (mutex_ held). Jobs whose rows are invalid
  // go to `rejected`; returns a beam search job when it is its turn to run alone.
  std::shared_ptr<Job> admit_locked(std::vector<std::shared_ptr<Job>>& rejected);
  void step();
  // After an engine failure: every job with a running row fails with `why` (mutex_ held).
  void fail_running_locked(const std::string& why, std::vector<std::shared_ptr<Job>>& failed);
  // One row failed alone: its job fails with `why` and its other rows leave the batch (mutex_
  // held; the job's entry in unfinished_ is already erased).
  void fail_job_locked(const RowRef& failed_row, const std::string& why,
                       std::vector<std::shared_ptr<Job>>& failed);
  void finish(const std::vector<std::shared_ptr<Job>>& jobs);

  LanguageModel& model_;
  int64_t vocab_;
  int max_batch_size_;
  size_t max_queue_size_;
  double batch_window_ms_;
  BatchEngine engine_;  // used by the scheduler thread only
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> admitting_;  // taken from the queue, some rows not yet admitted
  size_t admitting_next_ = 0;       // its next row
  std::unordered_map<uint64_t, RowRef> rows_;        // engine id -> row of a job
  std::unordered_map<const Job*, size_t> unfinished_;  // rows not yet done per running job
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace megatron::inference
