// The server's request queue and scheduler. HTTP threads submit jobs; one scheduler thread
// owns the model and runs them. Jobs are served first come, first served: the scheduler takes
// the oldest job and, while the batch has room (max_batch_size rows), the jobs queued right
// behind it (waiting up to batch_window_ms for them to arrive), and decodes them as one batch (every row carries its own sampling settings, so any
// sampling jobs are compatible). Beam search jobs run alone; a job with more rows than the batch
// size runs in consecutive chunks. The queue is bounded: submit() refuses a job when
// max_queue_size jobs are waiting, so an overloaded server answers 503 instead of growing.
// Engine failures are caught and reported on the job; nothing here can take the server down.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  int64_t batches = 0;
  int64_t rejected = 0;
  size_t queued = 0;
};

class Scheduler {
 public:
  // batch_window_ms: after taking the oldest job, wait this long at most for more jobs to fill
  // the batch (clients that resubmit together then share a batch instead of one running alone).
  Scheduler(LanguageModel& model, int64_t vocab, SpecialTokens special, int max_batch_size,
            size_t max_queue_size, double batch_window_ms = 0.0);
  ~Scheduler();  // stops and joins; queued jobs finish with an error
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the job; false (and the job untouched) when the queue is full or stopping.
  bool submit(std::shared_ptr<Job> job);
  void stop();
  SchedulerStats stats() const;

 private:
  void loop();
  void run_batch(std::vector<std::shared_ptr<Job>>& batch);

  LanguageModel& model_;
  int64_t vocab_;
  SpecialTokens special_;
  int max_batch_size_;
  size_t max_queue_size_;
  double batch_window_ms_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace megatron::inference
