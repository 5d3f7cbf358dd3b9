// The scheduler on its own: FIFO batching of queued jobs, beam search alone, chunking of jobs
// larger than the batch, engine failures reported on the job, and the bound on the queue.
#include <gtest/gtest.h>

#include <chrono>
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

TEST(Scheduler, BatchesQueuedJobsInOrderAndChunksLargeOnes) {
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
  // The three small jobs share one batch; the 6-row job goes in the next (in two chunks).
  EXPECT_EQ(stats.batches, 3);
}

TEST(Scheduler, BatchWindowLetsLateJobsJoin) {
  FakeModel model(32, 64);
  Scheduler scheduler(model, 30, SpecialTokens{}, 4, 16, 200.0);
  auto a = sampling_job({{1}}, 2), b = sampling_job({{2}}, 2);
  ASSERT_TRUE(scheduler.submit(a));
  wait_until_dequeued(scheduler);  // a waits in the window for company
  ASSERT_TRUE(scheduler.submit(b));
  a->wait();
  b->wait();
  EXPECT_EQ(scheduler.stats().batches, 1);
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
