// The job state machine on its own: no gRPC, the CPU backend, plain calls.
#include "server/job.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_registry.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

class JobTest : public ::testing::Test {
 protected:
  std::unique_ptr<Job> MakeJob(uint64_t n, uint32_t world, v1::LossPolicy loss = v1::NONE,
                               uint64_t m = 0) {
    v1::JobSpec spec;
    spec.set_num_samples(n);
    spec.set_world_size(world);
    spec.set_samples_per_epoch(m);
    spec.set_seed(5);
    spec.mutable_policy()->set_loss(loss);
    auto config = MakeJobConfig(spec, JobLimits());
    EXPECT_TRUE(config.ok()) << config.status();
    auto job = Job::Create("j", *config, backend_.get());
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  static absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
};

TEST_F(JobTest, EpochClosesWhenEveryRankEndedIt) {
  auto job = MakeJob(100, 2, v1::LOSS);
  auto lease = job->AcquireShard(0, 1, 2, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->shard_length, 50u);
  const std::vector<uint64_t> idx = {1, 2, 3};
  const std::vector<float> loss = {1, 2, 3};
  v1::LossReportSummary summary;
  ASSERT_TRUE(job->ReportLosses({0, 1, 0, idx, loss}, &summary).ok());
  EXPECT_EQ(summary.accepted(), 3u);

  auto first = job->EndEpoch(0, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->epoch_closed());
  EXPECT_EQ(job->EndEpoch(0, 0)->ranks_ended(), 1u);  // Idempotent.
  auto last = job->EndEpoch(0, 1);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->epoch_closed());
  auto next = job->AcquireShard(1, 0, 2, Soon());  // Waits for the background plan.
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->view.plan->epoch, 1u);
  EXPECT_EQ(job->Describe().current_epoch(), 1u);
  // Epoch 0 is closed now: its shard is gone, its losses are stale, ending it is a retry.
  EXPECT_EQ(job->AcquireShard(0, 0, 2, Soon()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::LossReportSummary stale;
  ASSERT_TRUE(job->ReportLosses({0, 0, 9, idx, loss}, &stale).ok());
  EXPECT_EQ(stale.stale(), 3u);
  EXPECT_TRUE(job->EndEpoch(0, 1).ok());
}

TEST_F(JobTest, PlanComputedAheadEqualsAFreshPlan) {
  auto job = MakeJob(1000, 1, v1::LOSS);  // M = N without replacement: plans ignore weights.
  ASSERT_TRUE(job->EndEpoch(0, 0).ok());
  auto lease = job->AcquireShard(1, 0, 1, Soon());
  ASSERT_TRUE(lease.ok());
  auto fresh = backend_->PlanEpoch(job->config().plan, 1, {});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(lease->view.plan->ToVector(), fresh->ToVector());
}

TEST_F(JobTest, WaitingReadersEndAtTheDeadlineOrOnClose) {
  auto job = MakeJob(100, 2);
  EXPECT_EQ(job->AcquireShard(1, 0, 2, absl::Now() + absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Notification done;
  std::thread reader([&] {
    EXPECT_EQ(job->AcquireShard(1, 0, 2, Soon()).status().code(), absl::StatusCode::kUnavailable);
    done.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done.HasBeenNotified());
  job->Close(absl::UnavailableError("shutting down"));
  reader.join();
  EXPECT_TRUE(done.HasBeenNotified());
}

TEST_F(JobTest, OneLossPerSamplePerEpoch) {
  auto job = MakeJob(100, 2, v1::LOSS);
  const std::vector<uint64_t> idx = {7, 7, 8};
  const std::vector<float> loss = {1, 1, 1};
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses({0, 0, 0, idx, loss}, &s).ok());
  EXPECT_EQ(s.accepted(), 2u);  // The second 7 is a duplicate.
  EXPECT_EQ(s.duplicates(), 1u);
  const std::vector<uint64_t> more = {7, 9};
  ASSERT_TRUE(job->ReportLosses({0, 1, 0, more, {1, 1}}, &s).ok());  // 7 already has one.
  EXPECT_EQ(s.accepted(), 3u);
  EXPECT_EQ(s.duplicates(), 2u);
  ASSERT_TRUE(job->ReportLosses({0, 1, 0, more, {1, 1}}, &s).ok());  // A retried batch.
  EXPECT_EQ(s.duplicates(), 4u);
  EXPECT_EQ(job->Status().samples_seen(), 3u);
}

TEST(JobRegistryTest, CreateIsIdempotentAndBounded) {
  auto backend = NewCpuBackend(1);
  JobRegistry registry(JobRegistry::Limits{2, JobLimits()}, backend.get());
  v1::JobSpec spec;
  spec.set_num_samples(10);
  spec.set_world_size(1);
  auto a = registry.Create("a", spec);
  ASSERT_TRUE(a.ok());
  auto again = registry.Create("a", spec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(a->get(), again->get());
  ASSERT_TRUE(registry.Create("b", spec).ok());
  auto full = registry.Create("c", spec);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("--max_jobs"));
  // Deleting wakes a waiter with NOT_FOUND and frees the slot.
  absl::StatusCode waiter_code = absl::StatusCode::kOk;
  std::thread waiter([&] {
    waiter_code = (*a)->AcquireShard(1, 0, 1, absl::Now() + absl::Seconds(10)).status().code();
  });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(registry.Delete("a").ok());
  waiter.join();
  EXPECT_EQ(waiter_code, absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Create("c", spec).ok());
}

}  // namespace
}  // namespace samplerd
