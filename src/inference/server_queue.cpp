// Request queue and scheduler thread: continuous batching of sampling rows, beam search alone.
#include "inference/server_queue.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/error.h"
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
      max_batch_size_(std::max(1, max_batch_size)),
      max_queue_size_(std::max<size_t>(1, max_queue_size)),
      batch_window_ms_(std::max(0.0, batch_window_ms)),
      engine_(model, vocab, std::move(special), max_batch_size_) {
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

std::shared_ptr<Job> Scheduler::admit_locked(std::vector<std::shared_ptr<Job>>& rejected) {
  for (;;) {
    if (!admitting_) {
      if (queue_.empty() || stopping_) return nullptr;
      std::shared_ptr<Job> job = queue_.front();
      if (job->kind == Job::Kind::BeamSearch) {
        if (!engine_.idle()) return nullptr;  // it runs alone once the batch has drained
        queue_.pop_front();
        return job;
      }
      if (engine_.free_slots() == 0) return nullptr;  // it stays queued until a slot frees
      queue_.pop_front();
      try {
        for (size_t i = 0; i < job->rows.size(); ++i) engine_.validate(job->rows[i], int64_t(i));
      } catch (const std::exception& e) {
        // A bad request is rejected before it gets here; this one does not fit the model.
        job->error = str("generation failed: ", e.what());
        rejected.push_back(std::move(job));
        continue;
      }
      if (job->rows.empty()) {
        rejected.push_back(std::move(job));
        continue;
      }
      job->results.assign(job->rows.size(), SequenceResult{});
      unfinished_[job.get()] = job->rows.size();
      admitting_ = std::move(job);
      admitting_next_ = 0;
    }
    while (admitting_next_ < admitting_->rows.size() && engine_.free_slots() > 0) {
      const uint64_t id = next_id_++;
      engine_.admit(admitting_->rows[admitting_next_], id, int64_t(admitting_next_));
      rows_[id] = RowRef{admitting_, admitting_next_};
      ++admitting_next_;
    }
    stats_.running = engine_.running();
    if (admitting_next_ < admitting_->rows.size()) return nullptr;  // every slot is taken
    admitting_.reset();
  }
}

void Scheduler::fail_running_locked(const std::string& why,
                                    std::vector<std::shared_ptr<Job>>& failed) {
  log_warn("server: generation failed: ", why);
  engine_.reset();
  for (auto& [id, ref] : rows_) {
    if (unfinished_.erase(ref.job.get()) == 0) continue;
    ref.job->error = str("generation failed: ", why);
    failed.push_back(ref.job);
  }
  rows_.clear();
  // A job whose later rows were still waiting for a slot has failed too.
  if (admitting_ && unfinished_.erase(admitting_.get()) > 0) {
    admitting_->error = str("generation failed: ", why);
    failed.push_back(admitting_);
  }
  admitting_.reset();
  unfinished_.clear();
  stats_.running = 0;
}

void Scheduler::fail_job_locked(const RowRef& failed_row, const std::string& why,
                                std::vector<std::shared_ptr<Job>>& failed) {
  const std::shared_ptr<Job> job = failed_row.job;
  log_warn("server: generation failed for prompt ", failed_row.row, " of a request: ", why);
  job->error = str("generation failed for prompt ", failed_row.row, ": ", why);
  for (auto it = rows_.begin(); it != rows_.end();) {
    if (it->second.job == job) {
      engine_.cancel(it->first);
      it = rows_.erase(it);
    } else {
      ++it;
    }
  }
  if (admitting_ == job) admitting_.reset();
  failed.push_back(job);
}

void Scheduler::finish(const std::vector<std::shared_ptr<Job>>& jobs) {
  if (jobs.empty()) return;
  {
    // Counted before the jobs are released, so a client that sees its result sees the count.
    std::lock_guard lock(mutex_);
    stats_.jobs_done += int64_t(jobs.size());
  }
  for (auto& job : jobs) job->mark_finished();
}

void Scheduler::step() {
  std::vector<BatchEngine::Finished> done;
  std::vector<std::shared_ptr<Job>> finished;
  try {
    done = engine_.step();
  } catch (const std::exception& e) {
    // Requests were validated at admission; this is an engine failure. Report it on every job
    // with a running row and start over with an empty batch.
    std::lock_guard lock(mutex_);
    fail_running_locked(e.what(), finished);
    ++stats_.steps;
  }
  if (finished.empty()) {
    std::lock_guard lock(mutex_);
    for (auto& f : done) {
      auto it = rows_.find(f.id);
      if (it == rows_.end()) continue;  // a row of a job that failed earlier in this step
      RowRef ref = std::move(it->second);
      rows_.erase(it);
      if (!f.result.error.empty()) {
        // This row failed alone: its job fails, its other rows stop; the batch goes on.
        if (unfinished_.erase(ref.job.get()) > 0) fail_job_locked(ref, f.result.error, finished);
        continue;
      }
      ref.job->results[ref.row] = std::move(f.result);
      if (--unfinished_[ref.job.get()] == 0) {
        unfinished_.erase(ref.job.get());
        finished.push_back(std::move(ref.job));
      }
    }
    stats_.running = engine_.running();
    ++stats_.steps;
  }
  finish(finished);
}

void Scheduler::loop() {
  for (;;) {
    std::shared_ptr<Job> beam;
    std::vector<std::shared_ptr<Job>> rejected;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !engine_.idle() || admitting_; });
      if (stopping_ && engine_.idle() && !admitting_) return;
      if (engine_.idle() && !admitting_ && batch_window_ms_ > 0.0) {
        // Wait for company before the first step, while the batch has room (FIFO is kept: the
        // window only delays the start).
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::microseconds(int64_t(batch_window_ms_ * 1000.0));
        auto waiting_rows = [&] {
          size_t n = 0;
          for (const auto& job : queue_)
            n += job->kind == Job::Kind::Sampling ? job->rows.size() : size_t(max_batch_size_);
          return n;
        };
        while (!stopping_ && waiting_rows() < size_t(max_batch_size_) &&
               cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
        }
      }
      try {
        beam = admit_locked(rejected);
      } catch (const std::exception& e) {
        // Requests were validated; the engine could not take one (e.g. no memory for the cache).
        fail_running_locked(e.what(), rejected);
      }
    }
    finish(rejected);
    if (beam) {
      try {
        engine_.reset();  // the engine is idle; the search takes the model's cache
        beam->hypotheses = beam_search(model_, beam->beam, vocab_);
      } catch (const std::exception& e) {
        log_warn("server: beam search failed: ", e.what());
        beam->error = str("generation failed: ", e.what());
      }
      {
        std::lock_guard lock(mutex_);
        ++stats_.steps;
      }
      rejected.assign(1, std::move(beam));
      finish(rejected);
      continue;
    }
    if (!engine_.idle()) step();
  }
}

}  // namespace megatron::inference
