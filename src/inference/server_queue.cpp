// Request queue and scheduler thread: FIFO batching of sampling jobs, beam search alone.
#include "inference/server_queue.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/log.h"

namespace megatron::inference {

void Job::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return finished; });
}

void Job::mark_finished() {
  if (on_finished) {
    try {
      on_finished(*this);
    } catch (const std::exception& e) {
      log_warn("server: finishing a request failed: ", e.what());
    }
  }
  {
    std::lock_guard lock(mutex_);
    finished = true;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(LanguageModel& model, int64_t vocab, SpecialTokens special,
                     int max_batch_size, size_t max_queue_size, double batch_window_ms)
    : model_(model),
      vocab_(vocab),
      special_(std::move(special)),
      max_batch_size_(std::max(1, max_batch_size)),
      max_queue_size_(std::max<size_t>(1, max_queue_size)),
      batch_window_ms_(std::max(0.0, batch_window_ms)) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(queue_);
  }
  for (auto& job : left) {
    job->error = "the server is shutting down";
    job->mark_finished();
  }
}

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || queue_.size() >= max_queue_size_) {
      ++stats_.rejected;
      return false;
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  SchedulerStats s = stats_;
  s.queued = queue_.size();
  return s;
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> batch;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      // The oldest job always goes; followers join while they fit (FIFO, no overtaking).
      batch.push_back(queue_.front());
      queue_.pop_front();
      if (batch[0]->kind == Job::Kind::Sampling) {
        int64_t rows = int64_t(batch[0]->rows.size());
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::microseconds(int64_t(batch_window_ms_ * 1000.0));
        for (;;) {
          while (!queue_.empty() && queue_.front()->kind == Job::Kind::Sampling &&
                 rows + int64_t(queue_.front()->rows.size()) <= max_batch_size_) {
            rows += int64_t(queue_.front()->rows.size());
            batch.push_back(queue_.front());
            queue_.pop_front();
          }
          // Stop when full, when the next job cannot join (FIFO), or when the window is over.
          if (rows >= max_batch_size_ || !queue_.empty() || stopping_ ||
              cv_.wait_until(lock, deadline) == std::cv_status::timeout)
            break;
        }
        if (stopping_) {
          for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(*it);
          return;
        }
      }
    }
    run_batch(batch);
  }
}

void Scheduler::run_batch(std::vector<std::shared_ptr<Job>>& batch) {
  try {
    if (batch[0]->kind == Job::Kind::BeamSearch) {
      batch[0]->hypotheses = beam_search(model_, batch[0]->beam, vocab_);
    } else {
      // Concatenate the rows of all jobs, run in chunks of max_batch_size, hand results back.
      std::vector<SequenceRequest> rows;
      for (auto& job : batch) rows.insert(rows.end(), job->rows.begin(), job->rows.end());
      std::vector<SequenceResult> results;
      for (size_t begin = 0; begin < rows.size(); begin += size_t(max_batch_size_)) {
        const size_t n = std::min(rows.size() - begin, size_t(max_batch_size_));
        auto part = generate(model_, std::span(rows).subspan(begin, n), vocab_, special_);
        std::move(part.begin(), part.end(), std::back_inserter(results));
      }
      size_t next = 0;
      for (auto& job : batch) {
        job->results.assign(std::make_move_iterator(results.begin() + long(next)),
                            std::make_move_iterator(results.begin() + long(next + job->rows.size())));
        next += job->rows.size();
      }
    }
  } catch (const std::exception& e) {
    // A bad request is rejected before it gets here; this is an engine failure. Report it on
    // every job of the batch and keep serving.
    log_warn("server: generation failed: ", e.what());
    for (auto& job : batch) job->error = str("generation failed: ", e.what());
  }
  {
    // Counted before the jobs are released, so a client that sees its result sees the count.
    std::lock_guard lock(mutex_);
    stats_.jobs_done += int64_t(batch.size());
    ++stats_.batches;
  }
  for (auto& job : batch) job->mark_finished();
}

}  // namespace megatron::inference
