// EpochLoop against a real in-process samplerd over real gRPC (loopback, port 0): ranks in
// threads run two epochs (every loss accepted once, shards complete and disjoint, epochs
// closed), an elastic group reads the resized epoch in its deal, a step's error stops the loop
// and a Resume from the checkpoint finishes the run, Resume's checks against the job's state (a
// checkpoint at the end of a closed epoch goes on with the next epoch; one short of it, or one
// that predates a rewind, is refused naming what to do), a Run of an epoch the rank had half
// streamed (a restart without its checkpoint) warns and counts the positions served again, or is
// refused with restart_warnings_are_errors, bad arguments are refused at the call, and the
// device path (skipped without a GPU, after checking its refusal).
#include "client/cpp/epoch_loop.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/cuda_support.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"
#include "tests/loop_server_test_base.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

float LossOf(uint64_t index) { return (index % 100) * 0.01f; }

// A reusable barrier for the rank threads (absl::Barrier is single-use).
class Barrier {
 public:
  explicit Barrier(int parties) : parties_(parties) {}
  void Wait() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.SignalAll();
      return;
    }
    while (generation_ == generation) all_arrived_.Wait(&mu_);
  }

 private:
  const int parties_;
  absl::Mutex mu_;
  absl::CondVar all_arrived_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// What one rank's loop saw.
struct RankRecord {
  absl::Status result;
  std::vector<std::vector<uint64_t>> indices;  // Per epoch, in the order handed to the step.
  std::vector<ShardEnd> ends;
};

class EpochLoopTest : public LoopServerTest {
 protected:
  Options ServerOptions() const override {
    Options options = testutil::LoopbackTestOptions();
    options.rewind_epochs = 3;  // In memory: RewindJob to the last epoch starts.
    return options;
  }

  // A step that records the batch, checks that it follows the previous one, and reports
  // LossOf(index) for each index.
  static EpochLoop::Step RecordingStep(RankRecord& record) {
    return [&record](const EpochBatch& batch, LossSink& losses) -> absl::Status {
      if (record.indices.size() <= batch.epoch) record.indices.resize(batch.epoch + 1);
      std::vector<uint64_t>& seen = record.indices[batch.epoch];
      if (batch.position != seen.size()) {
        return absl::InternalError(
            absl::StrCat("batch at position ", batch.position, " after ", seen.size(), " indices"));
      }
      seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
      std::vector<float> values;
      for (uint64_t index : batch.indices) values.push_back(LossOf(index));
      return losses.Report(values);
    };
  }

  // A step that must not run (Resume refused before reading).
  static absl::Status NoStep(const EpochBatch& batch, LossSink&) {
    ADD_FAILURE() << "a step ran at epoch " << batch.epoch << " position " << batch.position;
    return absl::OkStatus();
  }

  // `body(rank)` for ranks 0 .. world_size - 1, each in a thread of its own.
  static void InThreads(uint32_t world_size, const std::function<void(uint32_t)>& body) {
    std::vector<std::thread> ranks;
    for (uint32_t r = 0; r < world_size; ++r) ranks.emplace_back(body, r);
    for (std::thread& t : ranks) t.join();
  }

  // A one-rank trainer of `job` (world size 1) that checkpoints at the start of the step at
  // `position` of epoch 0 and then dies there (`die`) or trains the rest of the epoch and ends
  // it. Returns the checkpoint.
  ReaderPosition CheckpointInEpoch0(const std::string& job, uint64_t position, bool die) {
    ReaderPosition saved;
    std::unique_ptr<EpochLoop> loop = NewLoop(job, 0, 1);
    if (loop == nullptr) return saved;
    RankRecord record;
    const EpochLoop::Step recording = RecordingStep(record);
    absl::Status s = loop->Run(0, 1, [&](const EpochBatch& batch, LossSink& losses) {
      if (batch.position == position) {
        absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
        if (!checkpoint.ok()) return checkpoint.status();
        saved = *checkpoint;
        if (die) return absl::AbortedError("injected: the process dies");
      }
      return recording(batch, losses);
    });
    EXPECT_EQ(s.code(), die ? absl::StatusCode::kAborted : absl::StatusCode::kOk) << s;
    EXPECT_EQ(saved.position, position);
    return saved;
  }

  // `loop` resumes position 0 of `from`'s epoch and reads the whole shard of the one rank.
  static void ExpectResumesTheEpochWhole(EpochLoop& loop, const ReaderPosition& from) {
    ReaderPosition start = from;
    start.position = 0;
    RankRecord record;
    absl::Status resumed = loop.Resume(start, 1, RecordingStep(record));
    ASSERT_TRUE(resumed.ok()) << resumed;
    ASSERT_EQ(record.indices.size(), from.epoch + 1);
    EXPECT_EQ(record.indices[from.epoch].size(), kSamples);
  }

  // GetJobStatus: the current epoch's progress, also while it is planned (none then: issue 33;
  // no need to wait for plan_ready).
  v1::JobStatus StatusOf(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  // Runs `world_size` ranks of `job` in threads for epochs 0 and 1. At each shard end, every
  // rank waits for the others, checks the server's per-rank progress of the epoch (nobody has
  // ended it yet: the hook runs before EndEpoch), and waits again.
  std::vector<RankRecord> RunRanks(const std::string& job, uint32_t world_size) {
    std::vector<RankRecord> records(world_size);
    std::vector<std::unique_ptr<EpochLoop>> loops;
    for (uint32_t r = 0; r < world_size; ++r) loops.push_back(NewLoop(job, r, world_size));
    for (const auto& loop : loops) {
      if (loop == nullptr) return records;
    }
    Barrier barrier(world_size);
    std::vector<std::thread> ranks;
    for (uint32_t r = 0; r < world_size; ++r) {
      ranks.emplace_back([&, r] {
        RankRecord& record = records[r];
        record.result =
            loops[r]->Run(0, 2, RecordingStep(record), [&](const ShardEnd& end) -> absl::Status {
              record.ends.push_back(end);
              barrier.Wait();
              absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job);
              barrier.Wait();
              if (!status.ok()) return status.status();
              if (status->job().current_epoch() != end.epoch) {
                return absl::InternalError(
                    absl::StrCat("server at epoch ", status->job().current_epoch()));
              }
              EXPECT_EQ(status->ranks_size(), static_cast<int>(world_size));
              for (const v1::RankProgress& progress : status->ranks()) {
                EXPECT_EQ(progress.indices_streamed(), end.shard_length)
                    << "epoch " << end.epoch << " rank " << progress.rank();
                EXPECT_EQ(progress.losses_accepted(), end.shard_length)
                    << "epoch " << end.epoch << " rank " << progress.rank();
                EXPECT_FALSE(progress.ended());
              }
              return absl::OkStatus();
            });
      });
    }
    for (std::thread& t : ranks) t.join();
    return records;
  }

  // Every index of the job exactly once in each epoch, across the ranks' shards.
  static void ExpectCompleteAndDisjoint(const std::vector<RankRecord>& records, uint64_t epoch) {
    std::vector<uint64_t> all;
    for (const RankRecord& record : records) {
      ASSERT_GT(record.indices.size(), epoch);
      all.insert(all.end(), record.indices[epoch].begin(), record.indices[epoch].end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), kSamples) << "epoch " << epoch;
    for (uint64_t i = 0; i < kSamples; ++i) ASSERT_EQ(all[i], i) << "epoch " << epoch;
  }
};

TEST_F(EpochLoopTest, RanksInThreadsRunTwoEpochsReportingEveryLossOnce) {
  constexpr uint32_t kWorld = 3;
  CreateJob("j", kWorld);
  const std::vector<RankRecord> records = RunRanks("j", kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    const RankRecord& record = records[r];
    ASSERT_TRUE(record.result.ok()) << "rank " << r << ": " << record.result;
    ASSERT_EQ(record.ends.size(), 2u);
    const uint64_t shard = kSamples / kWorld;
    for (uint64_t e = 0; e < 2; ++e) {
      EXPECT_EQ(record.ends[e].epoch, e);
      EXPECT_EQ(record.ends[e].deal, 0u);
      EXPECT_EQ(record.ends[e].shard_length, shard);
      EXPECT_EQ(record.ends[e].batches, (shard + 511) / 512);
      EXPECT_EQ(record.indices[e].size(), shard);
      // The server's summaries: everything accepted, nothing twice.
      EXPECT_EQ(record.ends[e].losses.accepted, (e + 1) * shard);
      EXPECT_EQ(record.ends[e].losses.duplicates + record.ends[e].losses.stale, 0u);
    }
  }
  ExpectCompleteAndDisjoint(records, 0);
  ExpectCompleteAndDisjoint(records, 1);
  // Both epochs closed by the loops' EndEpoch calls, and each loss counted.
  auto status = client_->GetJobStatus("j");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->job().current_epoch(), 2u);
  EXPECT_EQ(status->samples_seen(), kSamples);
}

TEST_F(EpochLoopTest, ElasticGroupReadsTheResizedEpochInItsDealThenDealZero) {
  CreateJob("elastic", 2);
  // The group restarts with three ranks: its first rank resizes before the loops are created.
  auto resized = client_->ResizeJob("elastic", 0, 3);
  ASSERT_TRUE(resized.ok()) << resized.status();
  ASSERT_EQ(resized->world_size(), 3u);
  ASSERT_GT(resized->deal(), 0u);  // Otherwise this test would not exercise the deal.
  const std::vector<RankRecord> records = RunRanks("elastic", 3);
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(records[r].result.ok()) << "rank " << r << ": " << records[r].result;
    ASSERT_EQ(records[r].ends.size(), 2u);
    EXPECT_EQ(records[r].ends[0].deal, resized->deal());
    EXPECT_EQ(records[r].ends[1].deal, 0u);
  }
  ExpectCompleteAndDisjoint(records, 0);
  ExpectCompleteAndDisjoint(records, 1);
  auto job = client_->GetJob("elastic");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->current_epoch(), 2u);
  EXPECT_EQ(job->world_size(), 3u);
}

TEST_F(EpochLoopTest, StepErrorStopsTheLoopAndResumeFromTheCheckpointFinishes) {
  CreateJob("one", 1);
  std::unique_ptr<EpochLoop> loop = NewLoop("one", 0, 1);
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->Checkpoint().status().code(), absl::StatusCode::kFailedPrecondition);

  RankRecord record;
  const EpochLoop::Step recording = RecordingStep(record);
  int steps = 0;
  absl::Status failed = loop->Run(0, 2, [&](const EpochBatch& batch, LossSink& losses) {
    if (++steps == 3) return absl::DataLossError("injected: the dataset shard is unreadable");
    return recording(batch, losses);
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(failed.message(), HasSubstr("injected: the dataset shard is unreadable"));
  EXPECT_THAT(failed.message(),
              HasSubstr("job \"one\" epoch 0 rank 0: step at shard position 1024"));
  EXPECT_EQ(steps, 3);  // Stopped at the error.

  // The failed batch is not in the checkpoint: it is read again.
  absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->epoch, 0u);
  EXPECT_EQ(checkpoint->position, 1024u);
  auto status = client_->GetJobStatus("one");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->job().current_epoch(), 0u);
  ASSERT_EQ(status->ranks_size(), 1);
  EXPECT_EQ(status->ranks(0).losses_accepted(), 1024u);
  EXPECT_FALSE(status->ranks(0).ended());

  // A restarted trainer: a new loop resumes from the checkpoint and runs to the end of epoch 1.
  loop.reset();
  loop = NewLoop("one", 0, 1);
  ASSERT_NE(loop, nullptr);
  std::vector<ShardEnd> ends;
  absl::Status resumed = loop->Resume(*checkpoint, 2, recording, [&](const ShardEnd& end) {
    ends.push_back(end);
    return absl::OkStatus();
  });
  ASSERT_TRUE(resumed.ok()) << resumed;
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0].batches, (kSamples - 1024 + 511) / 512);
  // Every loss of both epochs accepted once: the first 1024 by the first loop, the rest now.
  EXPECT_EQ(ends[1].losses.accepted, 2 * kSamples - 1024);
  EXPECT_EQ(ends[1].losses.duplicates, 0u);
  ASSERT_EQ(record.indices.size(), 2u);
  EXPECT_EQ(record.indices[0].size(), kSamples);
  EXPECT_EQ(record.indices[1].size(), kSamples);
  std::vector<RankRecord> records = {record};
  ExpectCompleteAndDisjoint(records, 0);
  ExpectCompleteAndDisjoint(records, 1);
  absl::StatusOr<ReaderPosition> next = loop->Checkpoint();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch, 2u);
  EXPECT_EQ(next->position, 0u);
  status = client_->GetJobStatus("one");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->job().current_epoch(), 2u);
}

// The trainers checkpoint in the ShardEnd hook of epoch 0 (position = shard length), every rank
// ends the epoch, and the processes die before their next checkpoint. Restarted, each resumes
// its position: nothing of epoch 0 is left, so the loops go on with epoch 1 from its start and
// train it whole. (Before Resume checked positions, it opened epoch 0 again and the server said
// FAILED_PRECONDITION "epoch = 0 of job 'boundary' is closed".)
TEST_F(EpochLoopTest, EndOfShardCheckpointOfAnotherGroupSizeResumesWithTheNextEpoch) {
  // An elastic restart right after an epoch boundary: 2 ranks checkpoint at the end of epoch 0's
  // shards, the epoch closes, the group comes back with 1 rank. Its loop resumes rank 0's
  // position and trains epoch 1, dealt to it whole; a mid-epoch position of the old group stays
  // refused (it names no position of the new shards). Before, both were refused by CheckOwner
  // (the world size).
  constexpr uint32_t kWorld = 2;
  CreateJob("elastic", kWorld);
  std::vector<ReaderPosition> saved(kWorld);
  InThreads(kWorld, [&](uint32_t r) {
    std::unique_ptr<EpochLoop> loop = NewLoop("elastic", r, kWorld);
    ASSERT_NE(loop, nullptr);
    RankRecord record;
    absl::Status s = loop->Run(0, 1, RecordingStep(record), [&](const ShardEnd&) -> absl::Status {
      absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
      if (!checkpoint.ok()) return checkpoint.status();
      saved[r] = *checkpoint;
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
  });
  ASSERT_EQ(StatusOf("elastic").job().current_epoch(), 1u);
  absl::StatusOr<v1::Job> resized = client_->ResizeJob("elastic", 1, 1);
  ASSERT_TRUE(resized.ok()) << resized.status();

  std::unique_ptr<EpochLoop> loop = NewLoop("elastic", 0, 1);
  ASSERT_NE(loop, nullptr);
  ReaderPosition short_of_end = saved[0];
  short_of_end.position = 100;
  absl::Status refused = loop->Resume(short_of_end, 1, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("world_size"));

  RankRecord record;
  absl::Status resumed = loop->Resume(saved[0], 2, RecordingStep(record));
  ASSERT_TRUE(resumed.ok()) << resumed;
  ASSERT_EQ(record.indices.size(), 2u);
  EXPECT_TRUE(record.indices[0].empty());
  EXPECT_EQ(record.indices[1].size(), kSamples);  // Epoch 1, the whole plan to one rank.
}

TEST_F(EpochLoopTest, EndOfShardCheckpointOfAClosedEpochResumesWithTheNextEpoch) {
  constexpr uint32_t kWorld = 2;
  constexpr uint64_t kShard = kSamples / kWorld;
  CreateJob("boundary", kWorld);
  std::vector<std::string> saved(kWorld);
  InThreads(kWorld, [&](uint32_t r) {
    std::unique_ptr<EpochLoop> loop = NewLoop("boundary", r, kWorld);
    ASSERT_NE(loop, nullptr);
    RankRecord record;
    absl::Status s = loop->Run(0, 1, RecordingStep(record), [&](const ShardEnd&) -> absl::Status {
      absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
      if (!checkpoint.ok()) return checkpoint.status();
      saved[r] = checkpoint->Serialize();
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
  });
  ASSERT_EQ(StatusOf("boundary").job().current_epoch(), 1u);  // Epoch 0 closed.

  std::vector<ReaderPosition> positions;
  for (uint32_t r = 0; r < kWorld; ++r) {
    absl::StatusOr<ReaderPosition> position = ReaderPosition::Parse(saved[r]);
    ASSERT_TRUE(position.ok()) << position.status();
    EXPECT_EQ(position->epoch, 0u);
    EXPECT_EQ(position->position, kShard);
    EXPECT_EQ(position->shard_length, kShard) << saved[r];  // What tells the end of the shard.
    positions.push_back(*position);
  }
  {
    // The same position without its shard's length (as a version 2 writer saved it): whether it
    // was at the end is unknown, so it is refused as one short of the end, and nothing changes.
    ReaderPosition unknown = positions[0];
    unknown.shard_length.reset();
    std::unique_ptr<EpochLoop> loop = NewLoop("boundary", 0, kWorld);
    ASSERT_NE(loop, nullptr);
    absl::Status refused = loop->Resume(unknown, 2, NoStep);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("the shard's length is unknown"));
    EXPECT_EQ(StatusOf("boundary").ranks(0).indices_streamed(), 0u);
  }

  // The restarted group.
  std::vector<RankRecord> records(kWorld);
  std::vector<std::string> next(kWorld);
  InThreads(kWorld, [&](uint32_t r) {
    std::unique_ptr<EpochLoop> loop = NewLoop("boundary", r, kWorld);
    ASSERT_NE(loop, nullptr);
    RankRecord& record = records[r];
    record.result = loop->Resume(positions[r], 2, RecordingStep(record), [&](const ShardEnd& end) {
      record.ends.push_back(end);
      return absl::OkStatus();
    });
    absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
    if (checkpoint.ok()) next[r] = checkpoint->Serialize();
  });
  for (uint32_t r = 0; r < kWorld; ++r) {
    const RankRecord& record = records[r];
    ASSERT_TRUE(record.result.ok()) << "rank " << r << ": " << record.result;
    ASSERT_EQ(record.ends.size(), 1u) << "rank " << r;  // Epoch 1 only: no hook for epoch 0.
    EXPECT_EQ(record.ends[0].epoch, 1u);
    EXPECT_EQ(record.ends[0].shard_length, kShard);
    ASSERT_EQ(record.indices.size(), 2u);
    EXPECT_TRUE(record.indices[0].empty());
    EXPECT_EQ(record.indices[1].size(), kShard);
    EXPECT_EQ(record.ends[0].losses.accepted, kShard);
    EXPECT_EQ(record.ends[0].losses.duplicates, 0u);
    EXPECT_THAT(next[r], HasSubstr(" epoch=2 deal=0 "));
    EXPECT_THAT(next[r], HasSubstr(" position=0"));
  }
  ExpectCompleteAndDisjoint(records, 1);
  v1::JobStatus status = StatusOf("boundary");
  EXPECT_EQ(status.job().current_epoch(), 2u);
  EXPECT_EQ(status.samples_seen(), kSamples);
}

// A trainer checkpoints in the middle of epoch 0, trains the rest and ends the epoch, then dies.
// Positions 2048 to the end of its shard can no longer be served: Resume refuses, naming job,
// epoch, rank, position and the two ways on, and changes nothing. The first way (a rewind to the
// epoch's start, then position 0) then trains epoch 0 whole.
TEST_F(EpochLoopTest, MidEpochCheckpointOfAClosedEpochIsRefusedNamingTheWaysOn) {
  CreateJob("closed", 1);
  const ReaderPosition saved = CheckpointInEpoch0("closed", 2048, /*die=*/false);
  ASSERT_EQ(StatusOf("closed").job().current_epoch(), 1u);

  std::unique_ptr<EpochLoop> loop = NewLoop("closed", 0, 1);
  ASSERT_NE(loop, nullptr);
  absl::Status refused = loop->Resume(saved, 2, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("job \"closed\" epoch 0 rank 0: cannot resume "
                                           "position 2048: epoch 0 has closed since (job "
                                           "\"closed\" is at epoch 1)"));
  EXPECT_THAT(refused.message(), HasSubstr("positions 2048 to 5999 of its shard"));
  EXPECT_THAT(refused.message(), HasSubstr("SamplerClient::RewindJob(\"closed\", 0)"));
  EXPECT_THAT(refused.message(), HasSubstr("samplerctl rewind closed 0"));
  EXPECT_THAT(refused.message(), HasSubstr("continue with epoch 1 without this position "
                                           "(EpochLoop::Run(1, ...))"));
  v1::JobStatus status = StatusOf("closed");
  EXPECT_EQ(status.job().current_epoch(), 1u);
  EXPECT_EQ(status.ranks(0).indices_streamed(), 0u);  // Nothing read.

  // The first way on: rewind, then every rank from position 0 of epoch 0.
  absl::StatusOr<v1::Job> rewound = client_->RewindJob("closed", 0);
  ASSERT_TRUE(rewound.ok()) << rewound.status();
  EXPECT_EQ(rewound->current_epoch(), 0u);
  ExpectResumesTheEpochWhole(*loop, saved);
  EXPECT_EQ(StatusOf("closed").job().current_epoch(), 1u);
}

// A trainer checkpoints in the middle of epoch 0 and dies; the job is rewound to the start of
// epoch 0 (which clears the rank's record: the losses before the position are gone). Resuming
// the mid-epoch position would skip them silently (it did, before Resume checked positions):
// it is refused, naming what the server streamed and what to do; position 0 then resumes.
TEST_F(EpochLoopTest, MidEpochPositionThatPredatesARewindIsRefused) {
  CreateJob("rewound", 1);
  const ReaderPosition saved = CheckpointInEpoch0("rewound", 1024, /*die=*/true);
  ASSERT_GE(StatusOf("rewound").ranks(0).indices_streamed(), 1024u);
  absl::StatusOr<v1::Job> rewound = client_->RewindJob("rewound", 0);
  ASSERT_TRUE(rewound.ok()) << rewound.status();

  std::unique_ptr<EpochLoop> loop = NewLoop("rewound", 0, 1);
  ASSERT_NE(loop, nullptr);
  absl::Status refused = loop->Resume(saved, 1, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("job \"rewound\" epoch 0 rank 0: cannot resume "
                                           "position 1024 (deal 0): the server streamed this "
                                           "rank only 0 positions of epoch 0"));
  EXPECT_THAT(refused.message(), HasSubstr("predates a rewind of the job"));
  EXPECT_THAT(refused.message(), HasSubstr("position 0"));
  EXPECT_THAT(refused.message(), HasSubstr("EpochLoop::Run(0, ...)"));
  v1::JobStatus status = StatusOf("rewound");
  EXPECT_EQ(status.ranks(0).indices_streamed(), 0u);
  EXPECT_EQ(status.ranks(0).losses_accepted(), 0u);

  ExpectResumesTheEpochWhole(*loop, saved);
  status = StatusOf("rewound");
  EXPECT_EQ(status.job().current_epoch(), 1u);
  EXPECT_EQ(status.samples_seen(), kSamples);
}

// A position without its shard's length (a version 2 text) in an epoch the server still
// answers about: Resume asks GetJob for the rank's shard length, so a position past it is
// refused as such (INVALID_ARGUMENT, before anything is read), and one within it resumes.
TEST_F(EpochLoopTest, PositionWithoutShardLengthIsCheckedWithTheServersLength) {
  CreateJob("v2", 1);
  const ReaderPosition saved = CheckpointInEpoch0("v2", 1024, /*die=*/true);
  absl::StatusOr<ReaderPosition> v2 = ReaderPosition::Parse(
      "samplerd.ReaderPosition version=2 job=v2 epoch=0 deal=0 rank=0 world_size=1 position=7000");
  ASSERT_TRUE(v2.ok()) << v2.status();
  std::unique_ptr<EpochLoop> loop = NewLoop("v2", 0, 1);
  ASSERT_NE(loop, nullptr);
  absl::Status refused = loop->Resume(*v2, 1, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("job \"v2\" epoch 0 rank 0: cannot resume position "
                                           "7000: position is past the shard's length 6000"));

  v2->position = saved.position;
  RankRecord record;
  record.indices.assign(1, std::vector<uint64_t>(saved.position));  // The first process's part.
  absl::Status resumed = loop->Resume(*v2, 1, RecordingStep(record));
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(record.indices[0].size(), kSamples);
  v1::JobStatus status = StatusOf("v2");
  EXPECT_EQ(status.job().current_epoch(), 1u);
  EXPECT_EQ(status.samples_seen(), kSamples);
}

// A trainer dies in the middle of epoch 0 (losses of positions 0 to 1023 accepted) and its
// replacement Runs epoch 0 without resuming the checkpoint. Before, it was served from position
// 0 again with no refusal and no warning: 1024 positions trained twice, silently. Now Run warns
// (job, epoch, rank, count), counts them in restart_summary(), and reads on; a Resume of the
// checkpoint replays nothing before it and warns of nothing.
TEST_F(EpochLoopTest, RunOfAHalfStreamedEpochWarnsAndCountsThePositionsServedAgain) {
  CreateJob("again", 1);
  const ReaderPosition saved = CheckpointInEpoch0("again", 1024, /*die=*/true);
  ASSERT_EQ(StatusOf("again").ranks(0).losses_accepted(), 1024u);

  std::vector<std::string> warnings;
  EpochLoopOptions options;
  options.on_restart_warning = [&](const std::string& message) { warnings.push_back(message); };
  {
    std::unique_ptr<EpochLoop> resumed = NewLoop("again", 0, 1, options);
    ASSERT_NE(resumed, nullptr);
    RankRecord record;
    // Resume of the checkpoint, stopped at its first step: not a restart without a state.
    absl::Status stopped = resumed->Resume(saved, 1, [](const EpochBatch&, LossSink&) {
      return absl::CancelledError("injected: stop at the first step");
    });
    EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled) << stopped;
    EXPECT_THAT(warnings, ::testing::IsEmpty());
    EXPECT_EQ(resumed->restart_summary().served_again, 0u);
  }

  std::unique_ptr<EpochLoop> loop = NewLoop("again", 0, 1, options);
  ASSERT_NE(loop, nullptr);
  RankRecord record;
  absl::Status ran = loop->Run(0, 1, RecordingStep(record));
  ASSERT_TRUE(ran.ok()) << ran;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("job \"again\" epoch 0 rank 0 (deal 0): the server already "
                                     "has 1024 losses of this rank in this epoch"));
  EXPECT_THAT(warnings[0], HasSubstr("1024 positions are served and trained again"));
  EXPECT_THAT(warnings[0], HasSubstr("EpochLoop::Resume"));
  EXPECT_EQ(loop->restart_summary().served_again, 1024u);
  // Read on, from position 0: the whole shard, the first 1024 losses duplicates.
  ASSERT_EQ(record.indices.size(), 1u);
  EXPECT_EQ(record.indices[0].size(), kSamples);
  v1::JobStatus status = StatusOf("again");
  EXPECT_EQ(status.job().current_epoch(), 1u);
  EXPECT_EQ(status.samples_seen(), kSamples);

  // The next epoch, from its start: nothing of it was reported before, nothing is said.
  ASSERT_TRUE(loop->Run(1, 1, RecordingStep(record)).ok());
  EXPECT_EQ(warnings.size(), 1u);
  EXPECT_EQ(loop->restart_summary().served_again, 1024u);
}

// A rank that ended epoch 0 while the group's other rank is still in it dies before epoch 1
// opens, and its replacement Runs epoch 0 without its checkpoint: the server streams an open
// epoch to a rank that ended it, so the whole shard would be trained again. Before, the rule
// skipped ranks that had ended the epoch (nothing said, nothing counted); now the shard's
// losses are counted (here refused, with restart_warnings_are_errors) before anything is read.
TEST_F(EpochLoopTest, RunOfAnEpochTheRankHasEndedCountsItsWholeShard) {
  constexpr uint32_t kWorld = 2;
  constexpr uint64_t kShard = kSamples / kWorld;
  CreateJob("ended", kWorld);
  {
    std::unique_ptr<EpochLoop> first = NewLoop("ended", 0, kWorld);
    ASSERT_NE(first, nullptr);
    RankRecord record;
    const absl::Status ran = first->Run(0, 1, RecordingStep(record));
    ASSERT_TRUE(ran.ok()) << ran;
  }
  v1::JobStatus status = StatusOf("ended");
  ASSERT_EQ(status.job().current_epoch(), 0u);  // Rank 1 is still in it.
  ASSERT_TRUE(status.ranks(0).ended());

  EpochLoopOptions options;
  options.restart_warnings_are_errors = true;
  std::unique_ptr<EpochLoop> loop = NewLoop("ended", 0, kWorld, options);
  ASSERT_NE(loop, nullptr);
  const absl::Status refused = loop->Run(0, 1, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("job \"ended\" epoch 0 rank 0 (deal 0): the server already "
                                     "has ",
                                     kShard, " losses of this rank in this epoch")));
  EXPECT_EQ(loop->restart_summary().served_again, kShard);
}

// The same restart with EpochLoopOptions::restart_warnings_are_errors: Run refuses with
// FAILED_PRECONDITION in the warning's words, before anything is read; the count says it too.
TEST_F(EpochLoopTest, RunOfAHalfStreamedEpochIsRefusedWhenRestartWarningsAreErrors) {
  CreateJob("strict", 1);
  CheckpointInEpoch0("strict", 1024, /*die=*/true);
  const uint64_t streamed = StatusOf("strict").ranks(0).indices_streamed();

  EpochLoopOptions options;
  options.restart_warnings_are_errors = true;
  options.on_restart_warning = [](const std::string& message) {
    ADD_FAILURE() << "warned instead of refusing: " << message;
  };
  std::unique_ptr<EpochLoop> loop = NewLoop("strict", 0, 1, options);
  ASSERT_NE(loop, nullptr);
  absl::Status refused = loop->Run(0, 1, NoStep);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("job \"strict\" epoch 0 rank 0 (deal 0): the server "
                                           "already has 1024 losses of this rank"));
  EXPECT_THAT(refused.message(),
              HasSubstr("refused: EpochLoopOptions::restart_warnings_are_errors"));
  EXPECT_EQ(loop->restart_summary().served_again, 1024u);
  v1::JobStatus status = StatusOf("strict");
  EXPECT_EQ(status.ranks(0).indices_streamed(), streamed);  // Nothing read.
  EXPECT_EQ(status.ranks(0).losses_accepted(), 1024u);
}

TEST_F(EpochLoopTest, ShardEndHookErrorStopsBeforeTheEpochEnds) {
  CreateJob("hook", 1);
  std::unique_ptr<EpochLoop> loop = NewLoop("hook", 0, 1);
  ASSERT_NE(loop, nullptr);
  RankRecord record;
  absl::Status s = loop->Run(0, 2, RecordingStep(record), [](const ShardEnd&) {
    return absl::CancelledError("injected: evaluation failed");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(), HasSubstr("end-of-shard hook"));
  EXPECT_THAT(s.message(), HasSubstr("injected: evaluation failed"));
  auto status = client_->GetJobStatus("hook");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->job().current_epoch(), 0u);
  ASSERT_EQ(status->ranks_size(), 1);
  EXPECT_FALSE(status->ranks(0).ended());
  EXPECT_EQ(status->ranks(0).losses_accepted(), kSamples);  // Flushed before the hook.
}

TEST_F(EpochLoopTest, BadArgumentsAreRefusedAtTheCall) {
  CreateJob("bad", 2);
  auto code_of = [&](std::shared_ptr<SamplerClient> client, const std::string& job, uint32_t rank,
                     uint32_t world, EpochLoopOptions options, const std::string& names) {
    auto loop = EpochLoop::Create(std::move(client), job, rank, world, options);
    EXPECT_THAT(loop.status().message(), HasSubstr(names));
    return loop.status().code();
  };
  EXPECT_EQ(code_of(nullptr, "bad", 0, 2, {}, "client"), absl::StatusCode::kInvalidArgument);
  EpochLoopOptions zero;
  zero.batch_size = 0;
  EXPECT_EQ(code_of(client_, "bad", 0, 2, zero, "batch_size = 0"),
            absl::StatusCode::kInvalidArgument);
  EpochLoopOptions too_big;
  too_big.queue_capacity = 1024;
  too_big.batch_size = 1025;
  EXPECT_EQ(code_of(client_, "bad", 0, 2, too_big, "batch_size = 1025"),
            absl::StatusCode::kInvalidArgument);
  EpochLoopOptions stream_only;
  stream_only.device_stream = reinterpret_cast<cudaStream_t>(0x1);
  EXPECT_EQ(code_of(client_, "bad", 0, 2, stream_only, "device_indices"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(client_, "bad", 2, 2, {}, "rank = 2"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(client_, "nope", 0, 2, {}, "nope"), absl::StatusCode::kNotFound);
  EXPECT_EQ(code_of(client_, "bad", 0, 3, {}, "world"), absl::StatusCode::kFailedPrecondition);

  // The sink refuses what would report other positions than the batch's, or twice.
  std::unique_ptr<EpochLoop> loop = NewLoop("bad", 1, 2);
  ASSERT_NE(loop, nullptr);
  absl::Status s = loop->Run(0, 1, [](const EpochBatch& batch, LossSink& losses) {
    absl::Status short_report = losses.Report({0.5f, 0.5f, 0.5f});
    EXPECT_EQ(short_report.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(short_report.message(), HasSubstr("losses.size() = 3"));
    EXPECT_EQ(losses.ReportFromDevice(nullptr).code(), absl::StatusCode::kFailedPrecondition);
    std::vector<float> values(batch.indices.size(), 0.25f);
    if (absl::Status ok = losses.Report(values); !ok.ok()) return ok;
    absl::Status twice = losses.Report(values);
    EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(twice.message(), HasSubstr("already reported"));
    return absl::AbortedError("stop after one batch");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  // A position of another rank is refused before anything is read.
  absl::StatusOr<ReaderPosition> checkpoint = loop->Checkpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ReaderPosition other = *checkpoint;
  other.rank = 0;
  absl::Status wrong = loop->Resume(other, 1, [](const EpochBatch&, LossSink&) {
    ADD_FAILURE() << "a step ran";
    return absl::OkStatus();
  });
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("position.rank = 0"));
}

TEST_F(EpochLoopTest, DeviceBatchesAndLossesFromTheDevice) {
  CreateJob("dev", 1);
  if (absl::Status gpu = GpuAvailable(); !gpu.ok()) {
    // Without a GPU the loop refuses device delivery with the runtime's reason, and reads
    // nothing.
    EpochLoopOptions options;
    options.device_indices = reinterpret_cast<int64_t*>(0x100);  // Never dereferenced.
    std::unique_ptr<EpochLoop> loop = NewLoop("dev", 0, 1, options);
    ASSERT_NE(loop, nullptr);
    absl::Status s = loop->Run(0, 1, [](const EpochBatch&, LossSink&) {
      ADD_FAILURE() << "a step ran";
      return absl::OkStatus();
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    GTEST_SKIP() << "device delivery not run: " << gpu.message();
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr size_t kBatch = 512;
  int64_t* d_indices = nullptr;
  float* d_losses = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_indices), kBatch * sizeof(int64_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_losses), kBatch * sizeof(float)), cudaSuccess);
  EpochLoopOptions options;
  options.batch_size = kBatch;
  options.device_indices = d_indices;
  options.device_stream = stream;
  std::unique_ptr<EpochLoop> loop = NewLoop("dev", 0, 1, options);
  ASSERT_NE(loop, nullptr);
  uint64_t mismatches = 0;
  std::vector<ShardEnd> ends;
  absl::Status s = loop->Run(
      0, 1,
      [&](const EpochBatch& batch, LossSink& losses) -> absl::Status {
        EXPECT_EQ(batch.device_indices, d_indices);
        const size_t n = batch.indices.size();
        std::vector<int64_t> on_device(n);
        std::vector<float> values(n);
        for (size_t k = 0; k < n; ++k) values[k] = LossOf(batch.indices[k]);
        // The device copy holds the host batch; the losses go up on the same stream.
        if (cudaMemcpyAsync(on_device.data(), d_indices, n * sizeof(int64_t),
                            cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
            cudaMemcpyAsync(d_losses, values.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                            stream) != cudaSuccess ||
            cudaStreamSynchronize(stream) != cudaSuccess) {
          return absl::InternalError("cuda copy failed");
        }
        for (size_t k = 0; k < n; ++k) {
          mismatches += static_cast<uint64_t>(on_device[k]) != batch.indices[k];
        }
        return losses.ReportFromDevice(d_losses);
      },
      [&](const ShardEnd& end) {
        ends.push_back(end);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(mismatches, 0u);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].losses.accepted, kSamples);
  cudaFree(d_indices);
  cudaFree(d_losses);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace samplerd
