// The job state machine on its own: no gRPC, the CPU backend, plain calls.
#include "server/job.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/testing/backend_state.h"
#include "kernels/testing/test_util.h"
#include "server/testing/gated_backend.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::BatchAt;
using testutil::GatedBackend;

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

  std::vector<uint64_t> Shard(Job& job, uint64_t epoch, uint32_t rank) {
    return testutil::ShardOf(job, *backend_, epoch, rank);
  }

  static float One(uint64_t) { return 1.0f; }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
};

TEST_F(JobTest, EpochClosesWhenEveryRankEndedIt) {
  auto job = MakeJob(100, 2, v1::LOSS);
  auto lease = testutil::AwaitShard(*job, 0, 0, 1, 2, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->shard_length, 50u);
  const auto batch = BatchAt(0, 1, 0, Shard(*job, 0, 1), {1, 2, 3}, One);
  v1::LossReportSummary summary;
  ASSERT_TRUE(job->ReportLosses(batch.view(), &summary).ok());
  EXPECT_EQ(summary.accepted(), 3u);

  auto first = job->EndEpoch(0, 0, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->epoch_closed());
  EXPECT_EQ(job->EndEpoch(0, 0, 0)->ranks_ended(), 1u);  // Idempotent.
  auto last = job->EndEpoch(0, 0, 1);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->epoch_closed());
  auto next = testutil::AwaitShard(*job, 1, 0, 0, 2, Soon());  // Waits for the background plan.
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->view.plan->epoch, 1u);
  EXPECT_EQ(job->Describe().current_epoch(), 1u);
  // Epoch 0 is closed now: its shard is gone, its losses are stale, ending it is a retry.
  EXPECT_EQ(testutil::AwaitShard(*job, 0, 0, 0, 2, Soon()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::LossReportSummary stale;
  ASSERT_TRUE(job->ReportLosses(batch.view(), &stale).ok());
  EXPECT_EQ(stale.stale(), 3u);
  EXPECT_TRUE(job->EndEpoch(0, 0, 1).ok());
}

TEST_F(JobTest, PlanComputedAheadEqualsAFreshPlan) {
  auto job = MakeJob(1000, 1, v1::LOSS);  // M = N without replacement: plans ignore weights.
  ASSERT_TRUE(job->EndEpoch(0, 0, 0).ok());
  auto lease = testutil::AwaitShard(*job, 1, 0, 0, 1, Soon());
  ASSERT_TRUE(lease.ok());
  auto fresh = backend_->PlanEpoch(job->config().plan, 1, {});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(testutil::PlanIndices(*lease->view.plan), testutil::PlanIndices(*fresh));
}

TEST_F(JobTest, WaitingReadersEndAtTheDeadlineOrOnClose) {
  auto job = MakeJob(100, 2);
  // Not served yet: AcquireShard never waits; a reader waits with OnEpochSettled.
  EXPECT_EQ(job->AcquireShard(1, 0, 0, 2).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(
      testutil::AwaitShard(*job, 1, 0, 0, 2, absl::Now() + absl::Milliseconds(50)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  absl::Notification woken;
  ASSERT_NE(job->OnEpochSettled(1, absl::InfiniteFuture(), [&] { woken.Notify(); }), 0u);
  EXPECT_FALSE(woken.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  job->Close(absl::UnavailableError("shutting down"));
  EXPECT_TRUE(woken.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(job->AcquireShard(1, 0, 0, 2).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(JobTest, ADeadlineNamesWhatTheEpochWaitsFor) {
  // The next epoch waits for the ranks that have not ended the current one: name them.
  auto job = MakeJob(100, 4);
  ASSERT_TRUE(job->EndEpoch(0, 0, 1).ok());
  ASSERT_TRUE(job->EndEpoch(0, 0, 3).ok());
  const absl::Status next =
      testutil::AwaitShard(*job, 1, 0, 0, 4, absl::Now() + absl::Milliseconds(50)).status();
  EXPECT_EQ(next.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(next.message(), HasSubstr("epoch 1 of job 'j'"));
  EXPECT_THAT(next.message(), HasSubstr("ranks 0, 2 of world_size 4 have not ended it"));

  // A job awaiting its upload says which upload.
  v1::JobSpec spec;
  spec.set_num_samples(10);
  spec.set_world_size(1);
  spec.mutable_policy()->set_base(v1::STATIC);
  auto awaiting = Job::Create("s", *MakeJobConfig(spec, JobLimits()), backend_.get());
  ASSERT_TRUE(awaiting.ok());
  const absl::Status first =
      testutil::AwaitShard(**awaiting, 0, 0, 0, 1, absl::Now() + absl::Milliseconds(50)).status();
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(first.message(), HasSubstr("waits for UploadWeights"));
}

TEST_F(JobTest, ADeadlineWhilePlanningSaysSo) {
  GatedBackend gated(backend_.get());
  v1::JobSpec spec;
  spec.set_num_samples(100);
  spec.set_world_size(1);
  spec.set_samples_per_epoch(50);  // Weighted plans: not computed ahead.
  spec.mutable_policy()->set_loss(v1::LOSS);
  auto job = Job::Create("p", *MakeJobConfig(spec, JobLimits()), &gated);
  ASSERT_TRUE(job.ok());
  gated.Hold();
  ASSERT_TRUE((*job)->EndEpoch(0, 0, 0).ok());
  gated.AwaitHeldCall();
  const absl::Status s =
      testutil::AwaitShard(**job, 1, 0, 0, 1, absl::Now() + absl::Milliseconds(50)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("epoch 1 is still being planned"));
  gated.Release();
  EXPECT_TRUE(testutil::AwaitShard(**job, 1, 0, 0, 1, Soon()).ok());
}

TEST_F(JobTest, StatusShowsNoWeightsWhileTheEpochShownIsPlanned) {
  // Issue 23 item 8: right after the last EndEpoch the status said epoch 1 with epoch 0's
  // weights until plan_ready.
  GatedBackend gated(backend_.get());
  v1::JobSpec spec;
  spec.set_num_samples(100);
  spec.set_world_size(1);
  spec.set_samples_per_epoch(50);
  spec.mutable_policy()->set_loss(v1::LOSS);
  auto job = Job::Create("w", *MakeJobConfig(spec, JobLimits()), &gated);
  ASSERT_TRUE(job.ok());
  const v1::JobStatus before = (*job)->Status();
  ASSERT_TRUE(before.job().plan_ready());
  ASSERT_TRUE(before.has_weights());
  gated.Hold();
  ASSERT_TRUE((*job)->EndEpoch(0, 0, 0).ok());
  gated.AwaitHeldCall();
  const v1::JobStatus planning = (*job)->Status();
  EXPECT_EQ(planning.job().current_epoch(), 1u);
  EXPECT_FALSE(planning.job().plan_ready());
  EXPECT_FALSE(planning.has_weights()) << planning.weights().DebugString();
  gated.Release();
  ASSERT_TRUE(testutil::AwaitShard(**job, 1, 0, 0, 1, Soon()).ok());
  const v1::JobStatus ready = (*job)->Status();
  EXPECT_TRUE(ready.job().plan_ready());
  EXPECT_TRUE(ready.has_weights());
  EXPECT_GT(ready.weights().effective_sample_size(), 0.0);
}

TEST_F(JobTest, AReportedPositionCountsAsStreamed) {
  // A client checks a loaded state's position against indices_streamed (issue 23 item 1): a
  // position with a loss was streamed, also if the server stopped between a stream's Write and
  // its RecordStreamed.
  auto job = MakeJob(100, 2, v1::LOSS);
  const std::vector<uint64_t> zero = Shard(*job, 0, 0);
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 0, zero, {3, 9}, One).view(), &s).ok());
  EXPECT_EQ(job->Status().ranks(0).indices_streamed(), 10u);
  EXPECT_TRUE(job->RecordStreamed(0, 0, 0, 20).ok());
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 0, zero, {4}, One).view(), &s).ok());
  EXPECT_EQ(job->Status().ranks(0).indices_streamed(), 20u);  // Never lowered.
  EXPECT_EQ(job->Status().ranks(1).indices_streamed(), 0u);
}

TEST_F(JobTest, WithoutALossPolicyNoPerSampleStatisticsAreKept) {
  // Losses are acknowledged (a generic training loop may report them) but not kept: positions
  // are deduplicated, indices are not.
  auto job = MakeJob(100, 1, v1::NONE);
  const std::vector<uint64_t> shard = Shard(*job, 0, 0);
  const auto batch = BatchAt(0, 0, 0, shard, {7, 7, 8}, One);
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses(batch.view(), &s).ok());
  EXPECT_EQ(s.accepted(), 2u);  // Position 7 twice in one batch: once.
  EXPECT_EQ(s.duplicates(), 1u);
  ASSERT_TRUE(job->ReportLosses(batch.view(), &s).ok());  // A retried batch.
  EXPECT_EQ(s.accepted(), 2u);
  EXPECT_EQ(s.duplicates(), 4u);
  EXPECT_EQ(job->Status().samples_seen(), 0u);
}

TEST_F(JobTest, OneLossPerPositionAndPerSamplePerEpoch) {
  // M = 5 over 2 ranks, padded: shards of 3; rank 1's position 2 is plan position 5 mod 5 = 0,
  // which rank 0 was served at its position 0 (interleaved).
  auto job = MakeJob(100, 2, v1::LOSS, 5);
  const std::vector<uint64_t> zero = Shard(*job, 0, 0), one = Shard(*job, 0, 1);
  ASSERT_EQ(one[2], zero[0]);
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 0, zero, {0, 1}, One).view(), &s).ok());
  EXPECT_EQ(s.accepted(), 2u);
  const auto more = BatchAt(0, 1, 0, one, {0, 2}, One);  // Its position 2: that sample again.
  ASSERT_TRUE(job->ReportLosses(more.view(), &s).ok());
  EXPECT_EQ(s.accepted(), 3u);
  EXPECT_EQ(s.duplicates(), 1u);
  ASSERT_TRUE(job->ReportLosses(more.view(), &s).ok());  // A retried batch.
  EXPECT_EQ(s.duplicates(), 3u);
  EXPECT_EQ(job->Status().samples_seen(), 3u);
  EXPECT_EQ(job->Status().ranks(1).losses_accepted(), 1u);
}

// The CPU backend, with loss statistics that record every Apply and fail like a device when
// told to.
class ProbedBackend final : public GatedBackend {
 public:
  using GatedBackend::GatedBackend;

  struct Call {
    uint64_t epoch;
    std::vector<uint64_t> indices;
    std::vector<float> losses;
  };

  absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                 double ema_decay) override {
    auto inner = GatedBackend::NewLossStats(num_samples, ema_decay);
    if (!inner.ok()) return inner.status();
    return std::make_unique<Probed>(*std::move(inner), this);
  }
  using GatedBackend::RecomputeWeights;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats,
      absl::Span<const float> irreducible) override {
    const auto* probed = dynamic_cast<const Probed*>(stats);
    return GatedBackend::RecomputeWeights(policy, closed_epoch, base, current,
                                          probed != nullptr ? probed->inner() : stats, irreducible);
  }

  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::atomic<bool> fail{false};

 private:
  class Probed final : public BackendLossStats {
   public:
    Probed(std::unique_ptr<BackendLossStats> inner, ProbedBackend* backend)
        : inner_(std::move(inner)), backend_(backend) {}
    uint64_t size() const override { return inner_->size(); }
    absl::StatusOr<uint64_t> Apply(uint64_t epoch, absl::Span<const uint64_t> indices,
                                   absl::Span<const float> losses) override {
      if (backend_->fail) return absl::InternalError("cudaErrorLaunchFailure: launch failed");
      {
        absl::MutexLock lock(&backend_->mu_);
        backend_->calls_.push_back({epoch, std::vector<uint64_t>(indices.begin(), indices.end()),
                                    std::vector<float>(losses.begin(), losses.end())});
      }
      return inner_->Apply(epoch, indices, losses);
    }
    uint64_t SamplesSeen() const override { return inner_->SamplesSeen(); }
    absl::StatusOr<std::vector<SampleLossStats>> ToHost() const override {
      return inner_->ToHost();
    }
    absl::Status Restore(absl::Span<const SampleLossStats> stats) override {
      return inner_->Restore(stats);
    }
    const BackendLossStats* inner() const { return inner_.get(); }

   private:
    const std::unique_ptr<BackendLossStats> inner_;
    ProbedBackend* const backend_;
  };

  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Job> LossJob(ComputeBackend* backend, uint64_t n) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(1);
  spec.set_seed(5);
  spec.mutable_policy()->set_loss(v1::LOSS);
  auto config = MakeJobConfig(spec, JobLimits());
  EXPECT_TRUE(config.ok()) << config.status();
  auto job = Job::Create("j", *config, backend);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *std::move(job) : nullptr;
}

TEST_F(JobTest, ABatchsNewPairsAreAppliedInOneCallInArrivalOrder) {
  ProbedBackend probed(backend_.get());
  auto job = LossJob(&probed, 100);
  ASSERT_NE(job, nullptr);
  const std::vector<uint64_t> shard = Shard(*job, 0, 0);
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 0, shard, {0, 1}, One).view(), &s).ok());
  // Position 1 again, twice, between new positions 2 and 3: only 2 and 3 are applied, in order.
  testutil::OwnedLossBatch mixed = BatchAt(0, 0, 1, shard, {1, 2, 1, 3}, One);
  mixed.losses = {10, 20, 30, 40};
  ASSERT_TRUE(job->ReportLosses(mixed.view(), &s).ok());
  EXPECT_EQ(s.accepted(), 4u);
  EXPECT_EQ(s.duplicates(), 2u);
  // A batch of positions all reported before applies nothing.
  ASSERT_TRUE(job->ReportLosses(mixed.view(), &s).ok());
  const std::vector<ProbedBackend::Call> calls = probed.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].indices, (std::vector<uint64_t>{shard[0], shard[1]}));
  EXPECT_EQ(calls[1].epoch, 0u);
  EXPECT_EQ(calls[1].indices, (std::vector<uint64_t>{shard[2], shard[3]}));
  EXPECT_EQ(calls[1].losses, (std::vector<float>{20, 40}));
  EXPECT_EQ(job->Status().samples_seen(), 4u);
}

TEST_F(JobTest, ABackendFailureApplyingLossesFailsTheJob) {
  ProbedBackend probed(backend_.get());
  auto job = LossJob(&probed, 100);
  ASSERT_NE(job, nullptr);
  const std::vector<uint64_t> shard = Shard(*job, 0, 0);
  probed.fail = true;
  v1::LossReportSummary s;
  const absl::Status failed = job->ReportLosses(BatchAt(0, 0, 0, shard, {0, 1}, One).view(), &s);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("cudaErrorLaunchFailure"));
  EXPECT_EQ(s.accepted(), 0u);  // Nothing acknowledged.
  // The job is Failed: every later call says so, naming what failed.
  probed.fail = false;
  const absl::Status later = job->ReportLosses(BatchAt(0, 0, 1, shard, {2}, One).view(), &s);
  EXPECT_EQ(later.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(later.message()),
              HasSubstr("applying the losses of epoch 0 failed: INTERNAL: cudaErrorLaunchFailure"));
  EXPECT_EQ(job->EndEpoch(0, 0, 0).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(testutil::AwaitShard(*job, 0, 0, 0, 1, Soon()).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(probed.calls().empty());
}

TEST_F(JobTest, ARewindOfAFailedJobThatCannotGoOnKeepsTheFirstFailure) {
  // Issue 26: rewinding a Failed job to a start that is not kept must leave the job Failed with
  // the cause of its failure, not with the rewind's error.
  ProbedBackend probed(backend_.get());
  v1::JobSpec spec;
  spec.set_num_samples(100);
  spec.set_world_size(1);
  spec.set_seed(5);
  spec.mutable_policy()->set_loss(v1::LOSS);
  JobLimits limits;
  limits.rewind_epochs = 0;  // No start is kept: every rewind's target is not found.
  auto config = MakeJobConfig(spec, limits);
  ASSERT_TRUE(config.ok()) << config.status();
  auto job = Job::Create("j", *config, &probed);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<uint64_t> shard = Shard(**job, 0, 0);
  probed.fail = true;
  v1::LossReportSummary s;
  ASSERT_EQ((*job)->ReportLosses(BatchAt(0, 0, 0, shard, {0}, One).view(), &s).code(),
            absl::StatusCode::kInternal);
  probed.fail = false;
  const absl::Status rewind = (*job)->Rewind(0);
  EXPECT_EQ(rewind.code(), absl::StatusCode::kFailedPrecondition) << rewind;
  EXPECT_THAT(std::string(rewind.message()), HasSubstr("keeps no epoch start"));
  const absl::Status later = (*job)->EndEpoch(0, 0, 0).status();
  EXPECT_EQ(later.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(later.message()),
              HasSubstr("applying the losses of epoch 0 failed: INTERNAL: cudaErrorLaunchFailure"));
}

TEST_F(JobTest, ARetryIsRecognisedByItsPositionsWhateverItsSeq) {
  // Issue 11, defect 1: a restarted reporter numbers its batches from 0 again. Its new positions
  // are applied; positions the previous process reported are duplicates, whatever the seq.
  auto job = MakeJob(200, 1, v1::LOSS);
  const std::vector<uint64_t> shard = Shard(*job, 0, 0);
  v1::LossReportSummary first;
  ASSERT_TRUE(
      job->ReportLosses(testutil::BatchOfRange(0, 0, 0, shard, 0, 50, One).view(), &first).ok());
  ASSERT_TRUE(
      job->ReportLosses(testutil::BatchOfRange(0, 0, 1, shard, 50, 100, One).view(), &first).ok());
  EXPECT_EQ(first.accepted(), 100u);
  // The new process: seq 0 again, for the other 100 positions, then a repeat of 90..109.
  v1::LossReportSummary second;
  ASSERT_TRUE(
      job->ReportLosses(testutil::BatchOfRange(0, 0, 0, shard, 100, 200, One).view(), &second)
          .ok());
  EXPECT_EQ(second.accepted(), 100u);
  EXPECT_EQ(second.duplicates(), 0u);
  ASSERT_TRUE(
      job->ReportLosses(testutil::BatchOfRange(0, 0, 1, shard, 90, 110, One).view(), &second).ok());
  EXPECT_EQ(second.accepted(), 100u);
  EXPECT_EQ(second.duplicates(), 20u);
  EXPECT_EQ(job->Status().samples_seen(), 200u);
}

TEST_F(JobTest, ConsecutivePositionsAreTheSameIdentityAsAList) {
  auto job = MakeJob(100, 1, v1::LOSS);
  const std::vector<uint64_t> shard = Shard(*job, 0, 0);
  const std::vector<uint64_t> indices(shard.begin() + 10, shard.begin() + 20);
  const std::vector<float> losses(10, 1.0f);
  LossBatchView consecutive{0, 0, 0, indices, losses, {}, /*consecutive=*/true, 10};
  v1::LossReportSummary s;
  ASSERT_TRUE(job->ReportLosses(consecutive, &s).ok());
  EXPECT_EQ(s.accepted(), 10u);
  // The same positions listed one by one: duplicates.
  ASSERT_TRUE(
      job->ReportLosses(testutil::BatchOfRange(0, 0, 1, shard, 10, 20, One).view(), &s).ok());
  EXPECT_EQ(s.duplicates(), 10u);
  // Shifted by one: the served indices are not at those positions.
  consecutive.first_position = 11;
  const absl::Status shifted = job->ReportLosses(consecutive, &s);
  EXPECT_EQ(shifted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shifted.message()),
              HasSubstr("was not served to rank 0 at position 11 (first_position + 0)"));
}

TEST_F(JobTest, ALossForAnIndexNotServedAtItsPositionIsRefusedAndChangesNothing) {
  // Issue 11, defect 4: rank 0 reporting one of rank 1's samples would take that sample's one
  // loss of the epoch, and rank 1's real loss would then count as a duplicate.
  auto job = MakeJob(100, 2, v1::LOSS);
  const std::vector<uint64_t> zero = Shard(*job, 0, 0), one = Shard(*job, 0, 1);
  testutil::OwnedLossBatch theft = BatchAt(0, 0, 3, zero, {0, 1}, One);
  theft.indices[1] = one[1];
  v1::LossReportSummary s;
  const absl::Status refused = job->ReportLosses(theft.view(), &s);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(absl::StrCat("indices[1] = ", one[1],
                                     " was not served to rank 0 at "
                                     "positions[1] = 1 of epoch 0 (that position holds index ",
                                     zero[1], ")")));
  EXPECT_EQ(s.accepted() + s.duplicates(), 0u);
  EXPECT_EQ(job->Status().samples_seen(), 0u);  // Nothing of the batch was applied.
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 1, 0, one, {1}, One).view(), &s).ok());
  EXPECT_EQ(s.accepted(), 1u);  // The owner's loss counts.
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 3, zero, {0, 1}, One).view(), &s).ok());
  EXPECT_EQ(s.accepted(), 3u);
}

TEST_F(JobTest, StaleEpochsAreAscendingWithoutRepeats) {
  auto job = MakeJob(100, 1, v1::LOSS);
  for (uint64_t e = 0; e < 3; ++e) {
    ASSERT_TRUE(job->EndEpoch(e, 0, 0).ok());
    ASSERT_TRUE(testutil::AwaitShard(*job, e + 1, 0, 0, 1, Soon()).ok());
  }
  const std::vector<uint64_t> idx = {1, 2}, positions = {0, 1};
  const std::vector<float> loss = {1, 1};
  v1::LossReportSummary s;
  for (uint64_t e : {2, 0, 2, 1, 0}) {
    ASSERT_TRUE(job->ReportLosses({e, 0, e, idx, loss, positions}, &s).ok());
  }
  EXPECT_EQ(s.stale(), 10u);
  EXPECT_EQ(s.accepted(), 0u);
  EXPECT_THAT(s.stale_epochs(), ::testing::ElementsAre(0, 1, 2));
  EXPECT_EQ(job->Status().samples_seen(), 0u);
}

TEST_F(JobTest, AWaiterWhoseCallerWentAwayGivesUp) {
  auto job = MakeJob(100, 2);
  std::atomic<bool> ran{false};
  const uint64_t id = job->OnEpochSettled(1, absl::InfiniteFuture(), [&] { ran = true; });
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(job->CancelWait(id));
  ASSERT_TRUE(job->EndEpoch(0, 0, 0).ok());
  ASSERT_TRUE(job->EndEpoch(0, 0, 1).ok());
  ASSERT_TRUE(testutil::AwaitShard(*job, 1, 0, 0, 2, Soon()).ok());
  EXPECT_FALSE(ran.load());
}

TEST_F(JobTest, EpochOrderOfShardsLossesAndEnds) {
  auto job = MakeJob(100, 3, v1::LOSS);
  const std::vector<uint64_t> idx = {1}, positions = {0};
  const std::vector<float> loss = {1};
  v1::LossReportSummary s;
  // Future epochs: the next one may be waited for; two ahead is refused at once.
  EXPECT_EQ(testutil::AwaitShard(*job, 2, 0, 0, 3, Soon()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job->ReportLosses({1, 0, 0, idx, loss, positions}, &s).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job->EndEpoch(1, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  auto mismatch = testutil::AwaitShard(*job, 0, 0, 0, 4, Soon());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(mismatch.status().message()),
      HasSubstr("world_size = 4 does not match the 3 ranks that epoch 0 of job 'j' is dealt to"));
  EXPECT_EQ(testutil::AwaitShard(*job, 0, 0, 3, 3, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Ranks end in any order; the epoch closes with the last distinct one.
  EXPECT_EQ(job->EndEpoch(0, 0, 2)->ranks_ended(), 1u);
  EXPECT_EQ(job->EndEpoch(0, 0, 2)->ranks_ended(), 1u);
  EXPECT_EQ(job->EndEpoch(0, 0, 0)->ranks_ended(), 2u);
  EXPECT_FALSE(job->Status().ranks(1).ended());
  EXPECT_TRUE(job->Status().ranks(2).ended());
  EXPECT_TRUE(job->EndEpoch(0, 0, 1)->epoch_closed());
  ASSERT_TRUE(testutil::AwaitShard(*job, 1, 0, 0, 3, Soon()).ok());
  auto closed = testutil::AwaitShard(*job, 0, 0, 0, 3, Soon());
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(closed.status().message()),
              HasSubstr("epoch = 0 of job 'j' is closed; the current epoch is 1"));
  // The new epoch starts with fresh per-rank progress.
  const v1::JobStatus fresh = job->Status();
  for (const auto& r : fresh.ranks()) {
    EXPECT_FALSE(r.ended());
    EXPECT_EQ(r.indices_streamed(), 0u);
  }
}

TEST_F(JobTest, StreamingProgressAndTheCloseReason) {
  auto job = MakeJob(100, 2);
  EXPECT_TRUE(job->RecordStreamed(0, 0, 1, 20).ok());
  EXPECT_TRUE(job->RecordStreamed(0, 0, 1, 10).ok());  // A resumed reader behind: highest counts.
  EXPECT_TRUE(job->RecordStreamed(5, 0, 1, 90).ok());  // Another epoch: ignored.
  EXPECT_EQ(job->Status().ranks(1).indices_streamed(), 20u);
  job->Close(absl::NotFoundError("deleted"));
  EXPECT_EQ(job->RecordStreamed(0, 0, 1, 30).code(), absl::StatusCode::kNotFound);
}

// loss_within_groups supports up to kMaxLossGroups distinct base weights: more is refused at
// the upload (naming the limit), before anything is installed, so that no epoch boundary fails.
TEST_F(JobTest, TooManyLossGroupsAreRefusedAtTheUpload) {
  const uint64_t n = kMaxLossGroups + 1;
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(1);
  spec.mutable_policy()->set_base(v1::STATIC);
  spec.mutable_policy()->set_loss(v1::LOSS);
  spec.mutable_policy()->set_loss_within_groups(true);
  auto job = *Job::Create("g", *MakeJobConfig(spec, JobLimits()), backend_.get());
  std::vector<float> weights(n);
  for (uint64_t i = 0; i < n; ++i) weights[i] = 1.0f + static_cast<float>(i) / 65536.0f;
  const absl::Status s = job->UploadWeights(weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than 65536 distinct weights"));
  EXPECT_FALSE(job->Describe().plan_ready());
  weights.back() = 1.0f;  // 65536 groups: accepted.
  EXPECT_TRUE(job->UploadWeights(weights).ok());
}

TEST_F(JobTest, StaticWeightsArriveBeforeTheFirstLossOnly) {
  v1::JobSpec spec;
  spec.set_num_samples(4);
  spec.set_world_size(1);
  spec.set_samples_per_epoch(2);
  spec.mutable_policy()->set_base(v1::STATIC);
  spec.mutable_policy()->set_loss(v1::LOSS);
  auto job = *Job::Create("s", *MakeJobConfig(spec, JobLimits()), backend_.get());
  EXPECT_FALSE(job->Describe().plan_ready());
  EXPECT_EQ(
      testutil::AwaitShard(*job, 0, 0, 0, 1, absl::Now() + absl::Milliseconds(30)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(job->UploadLabels({1, 2, 3, 4}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job->UploadWeights({1, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job->UploadWeights({1, 0, 0, 0}).code(), absl::StatusCode::kFailedPrecondition)
      << "fewer than M positive weights cannot plan M draws without replacement";
  EXPECT_FALSE(job->Describe().plan_ready());
  // A waiting reader gets the plan as soon as the upload lands.
  absl::StatusOr<ShardLease> lease;
  std::thread reader([&] { lease = testutil::AwaitShard(*job, 0, 0, 0, 1, Soon()); });
  absl::SleepFor(absl::Milliseconds(30));
  ASSERT_TRUE(job->UploadWeights({0, 2, 2, 4}).ok());
  reader.join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  // Normalised to mean 1; the zero-weight sample is never drawn.
  EXPECT_THAT(testutil::HostWeights(lease->view.weights.get(), 4),
              ::testing::ElementsAre(0.0f, 1.0f, 1.0f, 2.0f));
  for (uint64_t i : testutil::PlanIndices(*lease->view.plan)) EXPECT_NE(i, 0u);
  EXPECT_TRUE(job->UploadWeights({1, 1, 1, 1}).ok());  // Re-upload before any loss: allowed.
  v1::LossReportSummary s;
  ASSERT_TRUE(job->RecordStreamed(0, 0, 0, 0).ok());  // Nothing handed out yet: still allowed.
  EXPECT_TRUE(job->UploadWeights({1, 1, 1, 1}).ok());
  ASSERT_TRUE(job->RecordStreamed(0, 0, 0, 1).ok());  // A shard index was sent: the plan is fixed.
  const absl::Status after_stream = job->UploadWeights({1, 2, 1, 1});
  EXPECT_EQ(after_stream.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(after_stream.message()), ::testing::HasSubstr("already started"));
  ASSERT_TRUE(job->ReportLosses(BatchAt(0, 0, 0, Shard(*job, 0, 0), {0}, One).view(), &s).ok());
  EXPECT_EQ(job->UploadWeights({1, 1, 1, 1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobTest, ReducibleLossWaitsForItsIrreducibleLossesAndUsesThem) {
  v1::JobSpec spec;
  spec.set_num_samples(4);
  spec.set_world_size(1);
  spec.mutable_policy()->set_base(v1::STATIC);
  spec.mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
  spec.mutable_policy()->set_clamp_lo(1e-6);  // Wide clamps: the factors show.
  spec.mutable_policy()->set_clamp_hi(1e6);
  auto job = *Job::Create("r", *MakeJobConfig(spec, JobLimits()), backend_.get());
  auto no_plan = [&] { return job->AcquireShard(0, 0, 0, 1).status(); };
  EXPECT_THAT(std::string(no_plan().message()),
              HasSubstr("waits for UploadWeights and UploadIrreducibleLosses"));
  // Bad values: named, nothing changes.
  absl::Status s = job->UploadIrreducibleLosses({1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "irreducible_losses: 2 values for num_samples 4");
  s = job->UploadIrreducibleLosses({0, NAN, 0, 0});
  EXPECT_EQ(s.message(), "irreducible_losses[1] = nan: must be finite and >= 0");
  EXPECT_THAT(std::string(no_plan().message()),
              HasSubstr("waits for UploadWeights and UploadIrreducibleLosses"));
  // The base alone does not plan: it waits for the irreducible losses.
  ASSERT_TRUE(job->UploadWeights({1, 1, 1, 1}).ok());
  EXPECT_FALSE(job->Describe().plan_ready());
  EXPECT_THAT(std::string(no_plan().message()), HasSubstr("waits for UploadIrreducibleLosses"));
  ASSERT_TRUE(job->UploadIrreducibleLosses({0, 0, 5, 5}).ok());
  EXPECT_TRUE(job->Describe().plan_ready());
  // Every sample's loss is 1: samples 0 and 1 keep a reducible loss of 1, samples 2 and 3 of 0
  // (1 - 5 clamped): x = 1.001 and 0.001 (epsilon 1e-3), so the first two take ~1000x the weight.
  v1::LossReportSummary summary;
  ASSERT_TRUE(
      job->ReportLosses(BatchAt(0, 0, 0, Shard(*job, 0, 0), {0, 1, 2, 3}, One).view(), &summary)
          .ok());
  ASSERT_TRUE(job->EndEpoch(0, 0, 0).ok());
  auto next = testutil::AwaitShard(*job, 1, 0, 0, 1, Soon());
  ASSERT_TRUE(next.ok()) << next.status();
  const std::vector<float> w = testutil::HostWeights(next->view.weights.get(), 4);
  EXPECT_EQ(w[0], w[1]);
  EXPECT_EQ(w[2], w[3]);
  EXPECT_NEAR(w[0] / w[2], 1.001 / 0.001, 1e-3 * 1001);
  // Started: the irreducible losses are fixed now.
  s = job->UploadIrreducibleLosses({0, 0, 0, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("already started"));
}

TEST_F(JobTest, IrreducibleLossesNeedTheReducibleLossPolicy) {
  auto job = MakeJob(4, 1, v1::LOSS);
  const absl::Status s = job->UploadIrreducibleLosses({0, 0, 0, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "job 'j' has policy.loss = LOSS; UploadIrreducibleLosses needs REDUCIBLE_LOSS");
}

TEST_F(JobTest, AReuploadWithdrawsEpochZeroUntilItsNewPlanIsPublished) {
  v1::JobSpec spec;
  spec.set_num_samples(4);
  spec.set_world_size(1);
  spec.set_samples_per_epoch(2);
  spec.mutable_policy()->set_base(v1::STATIC);
  spec.mutable_policy()->set_loss(v1::LOSS);
  GatedBackend gated(backend_.get());
  auto job = *Job::Create("s", *MakeJobConfig(spec, JobLimits()), &gated);
  ASSERT_TRUE(job->UploadWeights({1, 1, 1, 1}).ok());

  // A re-upload whose plan is being computed: the old plan of epoch 0 is withdrawn. A loss
  // accepted now would be wiped by the new plan (and the upload would succeed after the job
  // started); an epoch closed now would race the upload's publication of epoch 0.
  gated.Hold();
  absl::Status upload;
  std::thread uploader([&] { upload = job->UploadWeights({0, 1, 1, 2}); });
  gated.AwaitHeldCall();
  EXPECT_FALSE(job->Describe().plan_ready());
  v1::LossReportSummary s;
  const std::vector<uint64_t> idx = {1}, positions = {0};
  const std::vector<float> loss = {1};
  const absl::Status report = job->ReportLosses({0, 0, 0, idx, loss, positions}, &s);
  EXPECT_EQ(report.code(), absl::StatusCode::kFailedPrecondition) << report;
  EXPECT_THAT(std::string(report.message()), HasSubstr("still being planned"));
  EXPECT_EQ(job->EndEpoch(0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job->UploadWeights({1, 1, 1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  gated.Release();
  uploader.join();
  ASSERT_TRUE(upload.ok()) << upload;
  auto lease = testutil::AwaitShard(*job, 0, 0, 0, 1, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_THAT(testutil::HostWeights(lease->view.weights.get(), 4),
              ::testing::ElementsAre(0.0f, 1.0f, 1.0f, 2.0f));
  EXPECT_EQ(job->Status().ranks(0).losses_accepted(), 0u);

  // A re-upload that fails to plan leaves the published plan as it was.
  const std::vector<uint64_t> before = testutil::PlanIndices(*lease->view.plan);
  EXPECT_EQ(job->UploadWeights({1, 0, 0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(job->Describe().plan_ready());
  auto after = testutil::AwaitShard(*job, 0, 0, 0, 1, Soon());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testutil::PlanIndices(*after->view.plan), before);
  EXPECT_THAT(testutil::HostWeights(after->view.weights.get(), 4),
              ::testing::ElementsAre(0.0f, 1.0f, 1.0f, 2.0f));
}

TEST_F(JobTest, ManyEpochsWithConcurrentRanks) {
  // Ranks race through 20 epochs: each waits for its shard, reports, ends. No deadlock, every
  // epoch's shards partition its plan.
  const uint32_t world = 4;
  auto job = MakeJob(400, world, v1::LOSS, 200);
  std::vector<std::thread> ranks;
  std::atomic<int> errors{0};
  for (uint32_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      for (uint64_t e = 0; e < 20; ++e) {
        auto lease = testutil::AwaitShard(*job, e, 0, r, world, Soon());
        if (!lease.ok() || lease->view.plan->epoch != e) {
          ++errors;
          return;
        }
        std::vector<uint64_t> shard(lease->shard_length);
        if (!backend_->ExtractShard(*lease->view.plan, lease->shard, r, 0, absl::MakeSpan(shard))
                 .ok()) {
          ++errors;
          return;
        }
        const auto batch = testutil::BatchOfRange(e, r, e, shard, 0, shard.size(),
                                                  [](uint64_t i) { return i < 40 ? 5.0f : 0.5f; });
        v1::LossReportSummary s;
        if (!job->ReportLosses(batch.view(), &s).ok() || s.accepted() != shard.size() ||
            !job->EndEpoch(e, 0, r).ok()) {
          ++errors;
          return;
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(testutil::AwaitShard(*job, 20, 0, 0, world, Soon()).ok());
  const v1::JobStatus status = job->Status();
  EXPECT_EQ(status.job().current_epoch(), 20u);
  EXPECT_GT(status.weights().max(), 2.0);
  EXPECT_NEAR(status.weights().mean(), 1.0, 1e-3);
}

}  // namespace
}  // namespace samplerd
