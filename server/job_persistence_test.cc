// A persisted job against the same job kept in memory: after any prefix of calls, a job restored
// from its journal is in the same state and goes on to make the same plans.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job.h"
#include "server/job_config.h"
#include "server/persistence/job_journal.h"
#include "server/persistence/record_log.h"
#include "server/testing/gated_backend.h"
#include "server/testing/job_observation.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::AwaitKept;
using testutil::Observable;

constexpr uint32_t kWorld = 3;
constexpr uint64_t kN = 3000;

class JobPersistenceTest : public ::testing::Test {
 protected:
  // Weighted selection of M = N/2 without replacement: the plans depend on the weights, which
  // depend on every loss applied.
  static JobConfig Config(v1::BasePolicy base = v1::UNIFORM) {
    v1::JobSpec spec;
    spec.set_num_samples(kN);
    spec.set_world_size(kWorld);
    spec.set_samples_per_epoch(kN / 2);
    spec.set_seed(11);
    spec.mutable_policy()->set_base(base);
    spec.mutable_policy()->set_loss(v1::LOSS);
    auto config = MakeJobConfig(spec, JobLimits());
    EXPECT_TRUE(config.ok()) << config.status();
    return *config;
  }

  std::unique_ptr<Job> Create(bool persisted, v1::BasePolicy base = v1::UNIFORM) {
    std::unique_ptr<JobJournal> journal;
    if (persisted) {
      auto created = JobJournal::Create(dir_);
      EXPECT_TRUE(created.ok()) << created.status();
      journal = *std::move(created);
    }
    auto job = Job::Create("j", Config(base), &backend_, std::move(journal));
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  absl::StatusOr<std::unique_ptr<Job>> Restore(v1::BasePolicy base = v1::UNIFORM) {
    auto recovered = JobJournal::Recover(dir_);
    if (!recovered.ok()) return recovered.status();
    return Job::Restore("j", Config(base), &backend_, *std::move(recovered));
  }

  std::vector<uint64_t> Shard(Job& job, uint64_t epoch, uint32_t rank) {
    return testutil::ShardOf(job, backend_, epoch, rank);
  }

  // Reports a loss derived from (epoch, index) for shard positions [from, to) of `rank`, as one
  // batch with sequence number `seq`, and syncs.
  static v1::LossReportSummary Report(Job& job, uint64_t epoch, uint32_t rank, uint64_t seq,
                                      const std::vector<uint64_t>& shard, size_t from, size_t to) {
    const auto batch = testutil::BatchOfRange(epoch, rank, seq, shard, from, to, [&](uint64_t i) {
      return static_cast<float>((i * 7 + epoch) % 11) / 4;
    });
    // Both forms of positions go through the log: a list for odd seqs, first_position else.
    LossBatchView view = batch.view();
    if (seq % 2 == 0) {
      view.positions = {};
      view.consecutive = true;
      view.first_position = from;
    }
    v1::LossReportSummary summary;
    EXPECT_TRUE(job.ReportLosses(view, &summary).ok());
    EXPECT_TRUE(job.Sync().ok());
    return summary;
  }

  // One full epoch: every rank reads its shard, reports it in two batches and ends the epoch.
  void FullEpoch(Job& job, uint64_t epoch) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      const std::vector<uint64_t> shard = Shard(job, epoch, r);
      ASSERT_TRUE(job.RecordStreamed(epoch, 0, r, shard.size()).ok());
      Report(job, epoch, r, 1, shard, 0, shard.size() / 2);
      Report(job, epoch, r, 2, shard, shard.size() / 2, shard.size());
      ASSERT_TRUE(job.EndEpoch(epoch, 0, r).ok());
    }
  }

  // Part of an epoch: rank 0 done and ended, rank 1 half reported and streamed, rank 2 nothing.
  void PartialEpoch(Job& job, uint64_t epoch) {
    const std::vector<uint64_t> s0 = Shard(job, epoch, 0);
    Report(job, epoch, 0, 1, s0, 0, s0.size());
    ASSERT_TRUE(job.EndEpoch(epoch, 0, 0).ok());
    const std::vector<uint64_t> s1 = Shard(job, epoch, 1);
    ASSERT_TRUE(job.RecordStreamed(epoch, 0, 1, s1.size() / 2).ok());
    Report(job, epoch, 1, 1, s1, 0, s1.size() / 2);
  }

  void FinishPartialEpoch(Job& job, uint64_t epoch) {
    const std::vector<uint64_t> s1 = Shard(job, epoch, 1);
    Report(job, epoch, 1, 2, s1, s1.size() / 2, s1.size());
    ASSERT_TRUE(job.EndEpoch(epoch, 0, 1).ok());
    const std::vector<uint64_t> s2 = Shard(job, epoch, 2);
    Report(job, epoch, 2, 1, s2, 0, s2.size());
    ASSERT_TRUE(job.EndEpoch(epoch, 0, 2).ok());
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path() + "/j";  // The job's directory.
  std::unique_ptr<ComputeBackend> cpu_ = NewCpuBackend(2);
  // The CPU backend, with gates a test may hold (otherwise every call goes straight through).
  testutil::GatedBackend backend_{cpu_.get()};
};

TEST_F(JobPersistenceTest, RestoredJobEqualsTheJobThatNeverStopped) {
  auto reference = Create(/*persisted=*/false);
  auto persisted = Create(/*persisted=*/true);
  for (uint64_t e = 0; e < 2; ++e) {
    FullEpoch(*reference, e);
    FullEpoch(*persisted, e);
  }
  PartialEpoch(*reference, 2);
  PartialEpoch(*persisted, 2);
  const std::string before = Observable(*persisted);
  ASSERT_EQ(before, Observable(*reference));
  persisted.reset();  // The process goes away; only the files remain.

  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  Job& job = **restored;
  EXPECT_EQ(Observable(job), before);
  std::vector<std::vector<uint64_t>> epoch2(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    epoch2[r] = Shard(job, 2, r);
    EXPECT_EQ(epoch2[r], Shard(*reference, 2, r));
  }
  // The applied batches are known again: a client resending one after the restart is told it
  // was a duplicate.
  const std::vector<uint64_t> s1 = Shard(job, 2, 1);
  const v1::LossReportSummary resent = Report(job, 2, 1, 1, s1, 0, s1.size() / 2);
  EXPECT_EQ(resent.duplicates(), s1.size() / 2);
  EXPECT_EQ(resent.accepted(), 0u);

  // Training goes on identically: the weights of epoch 3 come from the losses of every epoch,
  // those applied before the restart included.
  FinishPartialEpoch(*reference, 2);
  FinishPartialEpoch(job, 2);
  for (uint32_t r = 0; r < kWorld; ++r) {
    const std::vector<uint64_t> next = Shard(job, 3, r);
    EXPECT_EQ(next, Shard(*reference, 3, r)) << "rank " << r;
    EXPECT_NE(next, epoch2[r]) << "rank " << r;
  }
  EXPECT_EQ(Observable(job), Observable(*reference));
  // Not trivially equal: the plans moved with the weights.
  EXPECT_GT(job.Status().weights().max(), job.Status().weights().min() * 2);
}

TEST_F(JobPersistenceTest, TheCurrentEpochIsRewindableAsSoonAsItIsServed) {
  // Issue 24, defect 5: the snapshot opening an epoch is written in the background; the epoch is
  // rewindable (listed, and RewindJob to it succeeds) from the moment it is served.
  auto job = Create(/*persisted=*/true);
  for (uint64_t e = 0; e < 3; ++e) {
    FullEpoch(*job, e);
    Shard(*job, e + 1, 0);  // Served.
    const std::vector<uint64_t> kept = job->RewindableEpochs();
    EXPECT_NE(std::find(kept.begin(), kept.end(), e + 1), kept.end()) << "epoch " << e + 1;
  }
  const absl::Status rewound = job->Rewind(3);
  EXPECT_TRUE(rewound.ok()) << rewound;
  EXPECT_EQ(job->CurrentEpoch(), 3u);
}

TEST_F(JobPersistenceTest, RestoresAtEveryEpochBoundaryAndMidEpoch) {
  // Restart after every step of the script; the state must match the reference each time.
  auto reference = Create(false);
  auto persisted = Create(true);
  for (uint64_t e = 0; e < 3; ++e) {
    PartialEpoch(*reference, e);
    PartialEpoch(*persisted, e);
    persisted.reset();
    auto mid = Restore();
    ASSERT_TRUE(mid.ok()) << mid.status();
    persisted = *std::move(mid);
    ASSERT_EQ(Observable(*persisted), Observable(*reference)) << "mid-epoch " << e;
    FinishPartialEpoch(*reference, e);
    FinishPartialEpoch(*persisted, e);
    Shard(*reference, e + 1, 0);  // Waits until the reference has planned epoch e + 1.
    persisted.reset();
    auto boundary = Restore();
    ASSERT_TRUE(boundary.ok()) << boundary.status();
    persisted = *std::move(boundary);
    ASSERT_EQ(Observable(*persisted), Observable(*reference)) << "after epoch " << e;
  }
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(Shard(*persisted, 3, r), Shard(*reference, 3, r));
  // Once epoch 3's snapshot is written (after the epoch is published, off the boundary's path),
  // only the current epoch's log remains, and the snapshots of the newest 3 epoch starts at most
  // (JobLimits::rewind_epochs; a snapshot superseded before it was begun is never written).
  // Closing the job waits for the planner's snapshot.
  persisted.reset();
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(files, ::testing::IsSupersetOf({"snapshot-3.bin", "wal-3.log"}));
  EXPECT_THAT(files, ::testing::Each(::testing::AnyOf("snapshot-1.bin", "snapshot-2.bin",
                                                      "snapshot-3.bin", "wal-3.log")));
}

TEST_F(JobPersistenceTest, UploadedWeightsAndAJobAwaitingItsUploadAreRestored) {
  auto persisted = Create(true, v1::STATIC);
  persisted.reset();
  auto awaiting = Restore(v1::STATIC);
  ASSERT_TRUE(awaiting.ok()) << awaiting.status();
  EXPECT_FALSE((*awaiting)->Describe().plan_ready());
  std::vector<float> weights(kN);
  for (uint64_t i = 0; i < kN; ++i) weights[i] = 1.0f + static_cast<float>(i % 13);
  ASSERT_TRUE((*awaiting)->UploadWeights(weights).ok());
  auto reference = Create(false, v1::STATIC);
  ASSERT_TRUE(reference->UploadWeights(weights).ok());
  awaiting->reset();

  auto restored = Restore(v1::STATIC);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Observable(**restored), Observable(*reference));
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(Shard(**restored, 0, r), Shard(*reference, 0, r));
  FullEpoch(**restored, 0);
  FullEpoch(*reference, 0);
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(Shard(**restored, 1, r), Shard(*reference, 1, r));
}

TEST_F(JobPersistenceTest, UnsyncedTailCutShortIsDroppedAndCorruptionIsReported) {
  auto persisted = Create(true);
  FullEpoch(*persisted, 0);
  PartialEpoch(*persisted, 1);
  const std::string acknowledged = Observable(*persisted);
  persisted.reset();
  const std::string log = dir_ + "/wal-1.log";
  const uint64_t size = std::filesystem::file_size(log);

  // A record half written at the crash (never acknowledged): cut, and the rest restored.
  {
    FILE* f = std::fopen(log.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    const char partial[] = {40, 0, 0, 0, 1, 2};  // A header cut short.
    std::fwrite(partial, 1, sizeof(partial), f);
    std::fclose(f);
  }
  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Observable(**restored), acknowledged);
  restored->reset();
  // The torn tail was cut.
  auto contents = ReadRecordLog(log);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_FALSE(contents->torn_tail);
  EXPECT_GE(std::filesystem::file_size(log), size);

  // A flipped byte inside an acknowledged record: DATA_LOSS naming the file, nothing loaded.
  {
    FILE* f = std::fopen(log.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, kRecordLogHeadBytes + 20, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, kRecordLogHeadBytes + 20, SEEK_SET);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
  auto corrupt = Restore();
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("wal-1.log"));
}

TEST_F(JobPersistenceTest, ALogThatDoesNotFitTheSnapshotIsDataLoss) {
  auto persisted = Create(true);
  PartialEpoch(*persisted, 0);
  persisted.reset();
  // A record of epoch 5 in epoch 0's log.
  auto writer = RecordLogWriter::Open(dir_ + "/wal-0.log");
  ASSERT_TRUE(writer.ok());
  state::WalRecord record;
  record.mutable_rank_ended()->set_epoch(5);
  ASSERT_TRUE((*writer)->Append(record.SerializeAsString()).ok());
  writer->reset();
  auto restored = Restore();
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("is of epoch 5"));
}

std::vector<float> StaticWeights(uint64_t salt) {
  std::vector<float> w(kN);
  for (uint64_t i = 0; i < kN; ++i) w[i] = 1.0f + static_cast<float>((i * salt) % 13);
  return w;
}

TEST_F(JobPersistenceTest, AnEndedEpochStartsTheJobSoTheLogNeverOutlivesAReupload) {
  // A rank that ended epoch 0 trained on its plan: a re-upload would have to replace a plan in
  // use, and the log of epoch 0 would hold an EndEpoch of the old plan.
  auto job = Create(true, v1::STATIC);
  ASSERT_TRUE(job->UploadWeights(StaticWeights(1)).ok());
  ASSERT_TRUE(job->EndEpoch(0, 0, 0).ok());
  const absl::Status again = job->UploadWeights(StaticWeights(5));
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  ASSERT_TRUE(job->EndEpoch(0, 0, 1).ok());
  const std::string before = Observable(*job);
  job.reset();
  auto restored = Restore(v1::STATIC);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->Describe().current_epoch(), 0u);
  EXPECT_EQ(Observable(**restored), before);
}

// A resize clears the replaced deal's progress, but not the fact that epoch 0 started: a rank
// streamed and one reported against the uploaded plan. Found by job_fuzz_test: the re-upload
// was accepted, replacing the plan those losses were applied against (they stayed in the
// statistics) while epoch 0's log kept their records, so the restart failed (DATA_LOSS: a
// logged loss no longer matches the plan).
TEST_F(JobPersistenceTest, AResizeDoesNotLetAReuploadReplaceAStartedEpoch) {
  for (const bool persisted : {false, true}) {
    SCOPED_TRACE(persisted ? "on disk" : "in memory");
    auto job = Create(persisted, v1::STATIC);
    ASSERT_TRUE(job->UploadWeights(StaticWeights(1)).ok());
    const std::vector<uint64_t> s0 = Shard(*job, 0, 0);
    ASSERT_TRUE(job->RecordStreamed(0, 0, 0, s0.size() / 2).ok());
    Report(*job, 0, 1, 1, Shard(*job, 0, 1), 0, 5);
    ASSERT_TRUE(job->Resize(0, 2).ok());
    const std::string before = Observable(*job);
    const absl::Status again = job->UploadWeights(StaticWeights(5));
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_EQ(Observable(*job), before);
    if (!persisted) continue;
    job.reset();
    auto restored = Restore(v1::STATIC);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(Observable(**restored), before);
  }
}

// A re-upload after a resize (before anything was read) keeps the deal; its snapshot records
// the world size epoch 0 started with, so that a restart replays the resize logged since on top
// of it, and a rewind to epoch 0 deals it to those ranks, as the job kept in memory does. Found
// by job_fuzz_test: the snapshot recorded the resized world, the replayed resize was then a
// no-op (deal 0, not 1), and the restart failed on the next record (DATA_LOSS: deal 1 does not
// exist).
TEST_F(JobPersistenceTest, AReuploadAfterAResizeKeepsTheDealThroughARestart) {
  auto job = Create(/*persisted=*/true, v1::STATIC);
  auto reference = Create(/*persisted=*/false, v1::STATIC);
  for (Job* j : {job.get(), reference.get()}) {
    ASSERT_TRUE(j->UploadWeights(StaticWeights(1)).ok());
    ASSERT_TRUE(j->Resize(0, 2).ok());
    ASSERT_TRUE(j->UploadWeights(StaticWeights(5)).ok());
    EXPECT_EQ(j->Describe().deal(), 1u);
    const std::vector<uint64_t> s1 = Shard(*j, 0, 1);
    ASSERT_TRUE(j->RecordStreamed(0, 1, 1, 7).ok());
    const auto batch = testutil::BatchOfRange(0, 1, 1, s1, 0, 5, [](uint64_t) { return 1.0f; });
    LossBatchView view = batch.view();
    view.deal = 1;
    v1::LossReportSummary summary;
    ASSERT_TRUE(j->ReportLosses(view, &summary).ok());
    ASSERT_TRUE(j->Sync().ok());
  }
  ASSERT_EQ(Observable(*job), Observable(*reference));
  job.reset();
  auto restored = Restore(v1::STATIC);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Observable(**restored), Observable(*reference));
  AwaitKept(**restored, 0);
  ASSERT_TRUE((*restored)->Rewind(0).ok());
  ASSERT_TRUE(reference->Rewind(0).ok());
  EXPECT_EQ((*restored)->Describe().world_size(), kWorld) << "the world epoch 0 started with";
  EXPECT_EQ(Observable(**restored), Observable(*reference));
  EXPECT_EQ(Shard(**restored, 0, 0), Shard(*reference, 0, 0));
}

TEST_F(JobPersistenceTest, AReuploadThatCannotBePersistedChangesNothing) {
  auto job = Create(true, v1::STATIC);
  ASSERT_TRUE(job->UploadWeights(StaticWeights(1)).ok());
  const std::vector<uint64_t> old_shard = Shard(*job, 0, 0);
  auto reference = Create(false, v1::STATIC);
  ASSERT_TRUE(reference->UploadWeights(StaticWeights(5)).ok());
  ASSERT_NE(old_shard, Shard(*reference, 0, 0));
  // A directory in the snapshot's place: the commit (rename) fails.
  std::filesystem::remove(dir_ + "/snapshot-0.bin");
  std::filesystem::create_directories(dir_ + "/snapshot-0.bin/x");
  EXPECT_FALSE(job->UploadWeights(StaticWeights(5)).ok());
  EXPECT_EQ(Shard(*job, 0, 0), old_shard) << "a failed re-upload published its plan";
}

TEST_F(JobPersistenceTest, StreamsOfADeletedJobEndWithNotFound) {
  auto job = Create(true);
  Shard(*job, 0, 0);
  job->Close(absl::NotFoundError("job 'j' was deleted"));
  ASSERT_TRUE(job->RemovePersistedState().ok());
  const absl::Status s = job->RecordStreamed(0, 0, 0, 10);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
}

// ---- Rewinds (issue 11) -------------------------------------------------------------------------

// A run restored from a checkpoint taken at the start of epoch 2 puts the job back there; the
// epochs after it are planned exactly as the first time, with a journal (on disk) or without
// (in memory).
class RewindTest : public JobPersistenceTest, public ::testing::WithParamInterface<bool> {
 protected:
  // Every rank's shard of `epoch`.
  std::vector<std::vector<uint64_t>> Shards(Job& job, uint64_t epoch) {
    std::vector<std::vector<uint64_t>> shards;
    for (uint32_t r = 0; r < kWorld; ++r) shards.push_back(Shard(job, epoch, r));
    return shards;
  }
};

TEST_P(RewindTest, EpochsAfterARewindArePlannedAsTheFirstTime) {
  auto job = Create(GetParam());
  std::vector<std::vector<std::vector<uint64_t>>> first;
  std::vector<std::string> observed;  // At each epoch's start.
  for (uint64_t e = 0; e < 4; ++e) {
    first.push_back(Shards(*job, e));
    AwaitKept(*job, e);
    observed.push_back(Observable(*job));
    FullEpoch(*job, e);
  }
  first.push_back(Shards(*job, 4));
  AwaitKept(*job, 4);
  // The newest 3 starts are kept (JobLimits::rewind_epochs).
  EXPECT_THAT(job->RewindableEpochs(), ::testing::ElementsAre(2, 3, 4));

  const absl::Status gone = job->Rewind(1);
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gone.message()),
              HasSubstr("epoch = 1 of job 'j': its start is not kept; the oldest kept is 2"));
  EXPECT_EQ(job->Rewind(5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job->CurrentEpoch(), 4u);  // The refusals changed nothing.

  ASSERT_TRUE(job->Rewind(2).ok());
  EXPECT_EQ(Observable(*job), observed[2]);  // Weights, loss statistics, progress: as then.
  EXPECT_THAT(job->RewindableEpochs(), ::testing::ElementsAre(2));
  for (uint64_t e = 2; e < 4; ++e) {
    EXPECT_EQ(Shards(*job, e), first[e]) << "epoch " << e;
    FullEpoch(*job, e);  // The same losses as the first time.
  }
  EXPECT_EQ(Shards(*job, 4), first[4]);
  if (!GetParam()) return;
  // Across a restart: the rewound history is the one on disk.
  AwaitKept(*job, 4);
  job.reset();
  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Shards(**restored, 4), first[4]);
  ASSERT_TRUE((*restored)->Rewind(3).ok());
  EXPECT_EQ(Observable(**restored), observed[3]);
  EXPECT_EQ(Shards(**restored, 3), first[3]);
}

TEST_P(RewindTest, RewindingToTheCurrentEpochRestartsIt) {
  auto job = Create(GetParam());
  AwaitKept(*job, 0);
  const std::string start = Observable(*job);
  const auto shards = Shards(*job, 0);
  PartialEpoch(*job, 0);
  ASSERT_NE(Observable(*job), start);
  ASSERT_TRUE(job->Rewind(0).ok());
  EXPECT_EQ(Observable(*job), start);  // No rank ended, no loss counted.
  EXPECT_EQ(Shards(*job, 0), shards);
  FullEpoch(*job, 0);  // Every loss applies again (positions are new in the restarted epoch).
  EXPECT_EQ(job->Status().samples_seen(), kN / 2);
}

INSTANTIATE_TEST_SUITE_P(OnDiskAndInMemory, RewindTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnDisk" : "InMemory";
                         });

// A rewind waits until the snapshot of the epoch that the last EndEpoch opened is scheduled (the
// boundary copies the epoch's weights to the host first, off the job's lock); the journal's
// rewind then drops that snapshot or waits for it. Before, a rewind ran beside the copy, and the
// snapshot could be written while the rewind removed and created the files it uses.
TEST_F(JobPersistenceTest, ARewindWaitsForTheSnapshotOfTheEpochJustOpened) {
  auto job = Create(/*persisted=*/true);
  FullEpoch(*job, 0);
  AwaitKept(*job, 1);
  // Epoch 1's boundary has copied its weights (its snapshot is on disk), so the gate holds
  // epoch 2's copy. Held, epoch 1's copy kept its planner thread, which the EndEpoch closing
  // epoch 1 joins: FullEpoch(1) never returned and the test hung (1 run in 30 under load).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!std::filesystem::exists(dir_ + "/snapshot-1.bin")) {
    ASSERT_LT(absl::Now(), deadline) << "epoch 1's snapshot was never written";
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::string start = Observable(*job);
  backend_.to_host().Hold();
  FullEpoch(*job, 1);  // Its last EndEpoch opens epoch 2, whose weights' copy is then held.
  backend_.to_host().AwaitHeldCall();
  absl::Notification rewound;
  absl::Status status;
  std::thread rewind([&] {
    status = job->Rewind(1);
    rewound.Notify();
  });
  EXPECT_FALSE(rewound.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the rewind did not wait for the snapshot of epoch 2 to be scheduled";
  backend_.to_host().Release();
  rewind.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Observable(*job), start);
  job.reset();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/snapshot-2.bin"));
  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Observable(**restored), start);
}

// A rewind right after an epoch boundary, again and again: the boundary's snapshot (of the
// epoch just opened, which the rewind abandons) is still to be written each time. The rewind must
// neither fail nor let that snapshot land on disk after it.
TEST_F(JobPersistenceTest, RewindsRightAfterEpochBoundariesKeepTheRewoundHistoryOnDisk) {
  auto job = Create(/*persisted=*/true);
  FullEpoch(*job, 0);
  AwaitKept(*job, 1);
  const std::string start = Observable(*job);
  for (int round = 0; round < 200; ++round) {
    FullEpoch(*job, 1);
    const absl::Status rewound = job->Rewind(1);
    ASSERT_TRUE(rewound.ok()) << "round " << round << ": " << rewound;
  }
  EXPECT_EQ(Observable(*job), start);
  job.reset();
  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Observable(**restored), start);
}

TEST_F(JobPersistenceTest, ARewindInterruptedByAStopIsFinishedByTheNextStart) {
  {
    auto job = Create(true);
    FullEpoch(*job, 0);
    FullEpoch(*job, 1);
    Shard(*job, 2, 0);
  }
  // As a stop right after the marker was committed leaves it: nothing else done yet.
  std::ofstream(dir_ + "/rewind-1").close();
  auto restored = Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->CurrentEpoch(), 1u);
  EXPECT_EQ((*restored)->Status().ranks(0).losses_accepted(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/rewind-1"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/snapshot-2.bin"));
}

}  // namespace
}  // namespace samplerd
