// The scheduler on its own: continuous batching (a job submitted mid-generation joins the running
// batch and can finish first), FIFO admission of rows, beam search alone, jobs larger than the
// batch, engine failures reported on the job, and the bound on the queue.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "fake_model.h"
#include "inference/server_queue.h"

namespace megatron::inference {
namespace {

using testing::FakeModel;

void slow_logits(std::span<const int32_t> prefix, std::span<float> logits) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  testing::hashed_logits(prefix, logits);
}

// Waits until the scheduler has taken every queued job (the first one is then running).
void wait_until_dequeued(const Scheduler& scheduler) {
  while (scheduler.stats().queued > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

std::shared_ptr<Job> sampling_job(std::vector<std::vector<int32_t>> prompts, int64_t n) {
  auto job = std::make_shared<Job>();
  for (auto& p : prompts) {
    SequenceRequest r;
    r.prompt = std::move(p);
    r.tokens_to_generate = n;
    r.sampling.top_k = 1;
    job->rows.push_back(std::move(r));
  }
  return job;
}

std::vector<int32_t> alone(std::vector<int32_t> prompt, int64_t n) {
  FakeModel model(32, 64);
  auto job = sampling_job({std::move(prompt)}, n);
  return generate(model, job->rows, 30, SpecialTokens{})[0].tokens;
}

TEST(Scheduler, QueuedJobsAndLargeOnesGetTheirAnswers) {
  FakeModel model(32, 64, slow_logits);
  Scheduler scheduler(model, 30, SpecialTokens{}, 4, 16);
  auto first = sampling_job({{1, 2}}, 10);  // occupies the engine while the others queue
  ASSERT_TRUE(scheduler.submit(first));
  wait_until_dequeued(scheduler);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(sampling_job({{i + 3}}, 4));
  jobs.push_back(sampling_job({{9}, {10}, {11}, {12}, {13}, {14}}, 3));  // larger than a batch
  for (auto& j : jobs) ASSERT_TRUE(scheduler.submit(j));
  first->wait();
  for (auto& j : jobs) j->wait();
  EXPECT_EQ(first->results.at(0).tokens, alone({1, 2}, 10));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(jobs[size_t(i)]->results.at(0).tokens, alone({i + 3}, 4));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(jobs[3]->results.at(size_t(i)).tokens, alone({i + 9}, 3));
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.jobs_done, 5);
  EXPECT_EQ(stats.running, 0);
  // Never more rows in a forward than the batch holds.
  for (int64_t b : model.batch_sizes) EXPECT_LE(b, 4);
}

// Deterministic, no timing: the short job is submitted from the long job's token callback (on
// the scheduler thread, between steps), so it joins the running batch at the next step.
TEST(Scheduler, AJobSubmittedMidGenerationJoinsAndFinishesFirst) {
  FakeModel model(32, 64);
  Scheduler scheduler(model, 30, SpecialTokens{}, 4, 16);
  auto short_job = sampling_job({{7, 8, 9}}, 2);
  std::atomic<int64_t> long_tokens{0}, long_tokens_when_short_done{-1};
  short_job->on_finished = [&](Job&) { long_tokens_when_short_done = long_tokens.load(); };
  auto long_job = sampling_job({{1, 2}}, 40);
  long_job->rows[0].on_token = [&](std::span<const int32_t> tokens, float) {
    long_tokens = int64_t(tokens.size()) - 2;
    if (long_tokens == 3) {
      EXPECT_TRUE(scheduler.submit(short_job));
    }
    return true;
  };
  ASSERT_TRUE(scheduler.submit(long_job));
  short_job->wait();
  long_job->wait();
  // Admitted at the step after token 3; its prefill gives token 1, the next decode token 2.
  EXPECT_GE(long_tokens_when_short_done.load(), 3);
  EXPECT_LE(long_tokens_when_short_done.load(), 6);
  EXPECT_EQ(short_job->results.at(0).tokens, alone({7, 8, 9}, 2));
  EXPECT_EQ(long_job->results.at(0).tokens, alone({1, 2}, 40));
  EXPECT_EQ(scheduler.stats().steps, 40);  // the long job's steps; the short one rode along
}

// Rows are admitted first come, first served: a later job never overtakes an earlier one, even
// when the earlier job has more rows than there are free slots.
TEST(Scheduler, RowsAreAdmittedInArrivalOrder) {
  std::mutex mutex;
  std::vector<int32_t> prefilled;  // first prompt token of each sequence, in prefill order
  std::atomic<bool> gate{false};
  FakeModel model(32, 64, [&](std::span<const int32_t> prefix, std::span<float> logits) {
    if (prefix.size() == 1) {
      std::lock_guard lock(mutex);
      prefilled.push_back(prefix[0]);
    }
    while (!gate) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    testing::hashed_logits(prefix, logits);
  });
  Scheduler scheduler(model, 30, SpecialTokens{}, 2, 16);
  auto blocker = sampling_job({{1}}, 3);
  ASSERT_TRUE(scheduler.submit(blocker));
  wait_until_dequeued(scheduler);  // its prefill waits at the gate
  auto big = sampling_job({{10}, {11}, {12}}, 2);
  auto small1 = sampling_job({{20}}, 2), small2 = sampling_job({{21}}, 2);
  for (auto& j : {big, small1, small2}) ASSERT_TRUE(scheduler.submit(j));
  gate = true;
  for (auto& j : {blocker, big, small1, small2}) j->wait();
  EXPECT_EQ(prefilled, (std::vector<int32_t>{1, 10, 11, 12, 20, 21}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(big->results.at(size_t(i)).tokens, alone({10 + i}, 2));
  EXPECT_EQ(small2->results.at(0).tokens, alone({21}, 2));
}

TEST(Scheduler, BatchWindowLetsLateJobsJoin) {
  FakeModel model(32, 64);
  Scheduler scheduler(model, 30, SpecialTokens{}, 4, 16, 300.0);
  auto a = sampling_job({{1}}, 2), b = sampling_job({{2}}, 2);
  ASSERT_TRUE(scheduler.submit(a));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a waits in the window for company
  ASSERT_TRUE(scheduler.submit(b));
  a->wait();
  b->wait();
  // Both prefilled in the first step, both decoded in the second.
  EXPECT_EQ(scheduler.stats().steps, 2);
  EXPECT_EQ(b->results.at(0).tokens, alone({2}, 2));
}

TEST(Scheduler, BeamSearchRunsAloneAndFailuresAreReported) {
  FakeModel model(32, 16);
  Scheduler scheduler(model, 30, SpecialTokens{}, 8, 16);
  auto beam = std::make_shared<Job>();
  beam->kind = Job::Kind::BeamSearch;
  beam->beam.prompt = {1, 2};
  beam->beam.tokens_to_generate = 3;
  beam->beam.beam_width = 2;
  beam->beam.stop_token = 29;
  auto bad = sampling_job({{1, 2, 3}}, 40);  // longer than the model allows: engine error
  ASSERT_TRUE(scheduler.submit(beam));
  ASSERT_TRUE(scheduler.submit(bad));
  beam->wait();
  bad->wait();
  EXPECT_TRUE(beam->error.empty());
  EXPECT_EQ(beam->hypotheses.size(), 2u);
  EXPECT_NE(bad->error.find("maximum sequence length"), std::string::npos) << bad->error;
  auto good = sampling_job({{4}}, 2);
  ASSERT_TRUE(scheduler.submit(good));
  good->wait();
  EXPECT_TRUE(good->error.empty());
}

// An engine failure mid-step fails the jobs with running rows (and a job whose later rows were
// still waiting for a slot); the scheduler starts over with an empty batch and keeps serving.
TEST(Scheduler, AnEngineFailureFailsTheRunningJobsAndServingGoesOn) {
  // No timing: the neighbour is submitted from the doomed job's first token callback (on the
  // scheduler thread, between steps), so it joins the running batch at the next step; the failure
  // waits until the neighbour's first row has run beside the doomed row.
  std::atomic<bool> neighbour_running{false};
  FakeModel model(32, 64, [&](std::span<const int32_t> prefix, std::span<float> logits) {
    if (prefix[0] == 1) neighbour_running = true;
    MG_CHECK(prefix[0] != 13 || prefix.size() < 4 || !neighbour_running, "injected failure");
    testing::hashed_logits(prefix, logits);
  });
  Scheduler scheduler(model, 30, SpecialTokens{}, 2, 16);
  auto doomed = sampling_job({{13}}, 20);          // fails once both run, from its third step
  auto neighbour = sampling_job({{1}, {2}}, 8);    // one row running beside it, one waiting
  std::atomic<bool> submitted{false}, accepted{false};
  doomed->rows[0].on_token = [&](std::span<const int32_t>, float) {
    if (!submitted.exchange(true)) accepted = scheduler.submit(neighbour);
    return true;
  };
  ASSERT_TRUE(scheduler.submit(doomed));
  doomed->wait();
  ASSERT_TRUE(accepted);
  neighbour->wait();
  EXPECT_NE(doomed->error.find("injected failure"), std::string::npos) << doomed->error;
  EXPECT_NE(neighbour->error.find("injected failure"), std::string::npos) << neighbour->error;
  auto after = sampling_job({{4}, {5}, {6}}, 3);
  ASSERT_TRUE(scheduler.submit(after));
  after->wait();
  EXPECT_TRUE(after->error.empty()) << after->error;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(after->results.at(size_t(i)).tokens, alone({4 + i}, 3));
  EXPECT_EQ(scheduler.stats().running, 0);
}

TEST(Scheduler, BoundedQueueRefusesAndStopFinishesWaitingJobs) {
  FakeModel model(32, 64, slow_logits);
  auto scheduler = std::make_unique<Scheduler>(model, 30, SpecialTokens{}, 1, 2);
  auto running = sampling_job({{1}}, 20);
  ASSERT_TRUE(scheduler->submit(running));
  wait_until_dequeued(*scheduler);
  auto a = sampling_job({{2}}, 2), b = sampling_job({{3}}, 2), c = sampling_job({{4}}, 2);
  EXPECT_TRUE(scheduler->submit(a));
  EXPECT_TRUE(scheduler->submit(b));
  EXPECT_FALSE(scheduler->submit(c));
  EXPECT_EQ(scheduler->stats().rejected, 1);
  scheduler->stop();
  for (auto& j : {running, a, b}) EXPECT_TRUE(j->finished);
  EXPECT_TRUE(running->error.empty());
  EXPECT_NE(b->error.find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace megatron::inference
