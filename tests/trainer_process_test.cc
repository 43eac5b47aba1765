// The C++ trainer library in rank processes of their own against the real samplerd binary,
// SIGKILLed and restarted on the same port and --data_dir, with the client's default options but
// a retry budget of ~1.55 s (5 retries) instead of 300 s: shorter than gRPC's 5 s backup poller,
// so that a client that did not drive its reconnection while backing off fails here, and the
// stays-down case fails fast:
//   * LossReporter ranks (tests/loss_reporter_rank) report while samplerd is down: every loss
//     counts exactly once after the restart, and Close returns.
//   * EpochLoop ranks (tests/epoch_loop_rank) ride through a restart in the middle of an epoch
//     and one between the end of their shard and EndEpoch, and run the next epoch.
//   * A samplerd that stays down: every rank fails within its retries, with an error naming the
//     job, epoch, rank and position, and exits (no hang in Close or the destructors).
// Each kill happens while every rank waits at a known point (tests/child_process.h handshakes),
// and the ranks go on while samplerd is down, so their calls must wait for the restart.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/child_process.h"
#include "tests/samplerd_process.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::ChildProcess;
using testutil::SamplerdProcess;

constexpr char kSamplerd[] = "server/samplerd";
constexpr char kReporterRank[] = "tests/loss_reporter_rank";
constexpr char kLoopRank[] = "tests/epoch_loop_rank";
// Enough retries to ride through a samplerd restart, with a bound: 8 backoffs from 50 ms doubling
// to 2 s are ~7 s. (5, ~1.5 s, did not cover a restart under ThreadSanitizer's slowdown.)
constexpr char kRetries[] = "--max_retries=8";

class TrainerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/trainer_process_test/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    samplerd_ = std::make_unique<SamplerdProcess>(kSamplerd, 0, Flags());
    ASSERT_FALSE(samplerd_->address().empty()) << "no 'samplerd listening on' line";
    port_ = samplerd_->port();
    ASSERT_GT(port_, 0);
    client_ = *SamplerClient::Create(samplerd_->address());
  }

  // samplerd first: a live one may still be writing into dir_ (a snapshot after EndEpoch), and
  // removing a directory that is being written races with it.
  void TearDown() override {
    samplerd_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> Flags() const { return {"--data_dir=" + dir_}; }

  void CreateJob(const std::string& name, uint64_t num_samples, uint32_t world_size) {
    v1::JobSpec spec;
    spec.set_num_samples(num_samples);
    spec.set_world_size(world_size);
    spec.set_seed(11);
    spec.mutable_policy()->set_loss(v1::LOSS);
    absl::StatusOr<v1::Job> job = client_->CreateJob(name, spec);
    ASSERT_TRUE(job.ok()) << job.status();
  }

  // A crash: SIGKILL, nothing of samplerd's shutdown runs.
  void Kill() {
    const int killed = samplerd_->Signal(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL);
  }

  // Starts samplerd again on the same port and directory, a moment after the ranks were let
  // go: their calls meanwhile fail and are retried, as after a real crash.
  void Restart() {
    absl::SleepFor(absl::Milliseconds(100));
    samplerd_ = std::make_unique<SamplerdProcess>(kSamplerd, port_, Flags());
    ASSERT_EQ(samplerd_->port(), port_) << "samplerd did not come back on port " << port_;
  }

  // The current epoch's progress of every rank (GetJobStatus of the restarted server).
  v1::JobStatus Status(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  std::string dir_;
  std::unique_ptr<SamplerdProcess> samplerd_;
  int port_ = 0;
  std::unique_ptr<SamplerClient> client_;
};

std::vector<std::unique_ptr<ChildProcess>> StartRanks(
    uint32_t world, const std::function<std::vector<std::string>(uint32_t)>& args) {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (uint32_t r = 0; r < world; ++r) ranks.push_back(std::make_unique<ChildProcess>(args(r)));
  return ranks;
}

// Waits until every rank printed a line starting with `prefix`; returns the lines.
std::vector<std::string> AwaitAll(std::vector<std::unique_ptr<ChildProcess>>& ranks,
                                  const std::string& prefix) {
  std::vector<std::string> lines;
  for (size_t r = 0; r < ranks.size(); ++r) {
    lines.push_back(ranks[r]->AwaitLine(prefix));
    EXPECT_FALSE(lines.back().empty())
        << "rank " << r << " ended before \"" << prefix << "\": " << ranks[r]->output();
  }
  return lines;
}

void GoAhead(std::vector<std::unique_ptr<ChildProcess>>& ranks) {
  for (auto& rank : ranks) rank->WriteLine("go");
}

TEST_F(TrainerProcessTest, LossReporterRanksCountEveryLossOnceAcrossASamplerdRestart) {
  constexpr uint32_t kWorld = 3;
  constexpr uint64_t kShard = 10'000;
  CreateJob("j", kWorld * kShard, kWorld);
  // Each rank flushes the first half of its shard, waits, then reports the second half (and
  // closes) while samplerd is down.
  auto ranks = StartRanks(kWorld, [&](uint32_t r) {
    return std::vector<std::string>{kReporterRank,
                                    "--address=" + samplerd_->address(),
                                    kRetries,
                                    "--job=j",
                                    absl::StrCat("--rank=", r),
                                    absl::StrCat("--world_size=", kWorld),
                                    absl::StrCat("--pause_at=", kShard / 2)};
  });
  AwaitAll(ranks, "flushed position=");
  Kill();
  GoAhead(ranks);
  Restart();
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ": " << ranks[r]->output();
    // Nothing of the second half reached the killed server: all of it is new to the restarted
    // one, and the first half, acknowledged before the kill, is not sent again.
    EXPECT_THAT(ranks[r]->output(), HasSubstr(absl::StrCat("accepted=", kShard, " duplicates=0")))
        << "rank " << r;
  }
  const v1::JobStatus status = Status("j");
  ASSERT_EQ(status.ranks_size(), kWorld);
  for (const v1::RankProgress& rank : status.ranks()) {
    EXPECT_EQ(rank.losses_accepted(), kShard) << "rank " << rank.rank();
  }
  EXPECT_EQ(status.samples_seen(), kWorld * kShard);  // M = N: every sample once.
}

TEST_F(TrainerProcessTest, EpochLoopRanksRideThroughRestartsMidEpochAndBeforeEndEpoch) {
  constexpr uint32_t kWorld = 3;
  constexpr uint64_t kShard = 4'000;
  CreateJob("e", kWorld * kShard, kWorld);
  auto ranks = StartRanks(kWorld, [&](uint32_t r) {
    return std::vector<std::string>{kLoopRank,
                                    "--address=" + samplerd_->address(),
                                    kRetries,
                                    "--job=e",
                                    absl::StrCat("--rank=", r),
                                    absl::StrCat("--world_size=", kWorld),
                                    "--epochs=2",
                                    "--batch=250",
                                    absl::StrCat("--pause_at=", kShard / 2),
                                    "--pause_at_shard_end"};
  });
  // Mid-epoch: the ranks' streams and reporters find samplerd gone.
  AwaitAll(ranks, "checkpoint epoch=0 position=2000");
  Kill();
  GoAhead(ranks);
  Restart();
  // Every loss of epoch 0 counted once, the flushed half restored from the directory.
  for (const std::string& line : AwaitAll(ranks, "shard_end epoch=0")) {
    EXPECT_THAT(line, HasSubstr(absl::StrCat("accepted=", kShard, " duplicates=0")));
  }
  v1::JobStatus status = Status("e");
  EXPECT_EQ(status.job().current_epoch(), 0u);
  for (const v1::RankProgress& rank : status.ranks()) {
    EXPECT_EQ(rank.losses_accepted(), kShard) << "rank " << rank.rank();
    EXPECT_FALSE(rank.ended()) << "rank " << rank.rank();
  }
  // Between the flushed shard and EndEpoch: EndEpoch is retried onto the restarted server, and
  // the last rank's closes the epoch there.
  Kill();
  GoAhead(ranks);
  Restart();
  for (const std::string& line : AwaitAll(ranks, "shard_end epoch=1")) {
    EXPECT_THAT(line, HasSubstr(absl::StrCat("accepted=", 2 * kShard, " duplicates=0")));
  }
  status = Status("e");
  EXPECT_EQ(status.job().current_epoch(), 1u);
  for (const v1::RankProgress& rank : status.ranks()) {
    EXPECT_EQ(rank.losses_accepted(), kShard) << "rank " << rank.rank();
  }
  GoAhead(ranks);
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ": " << ranks[r]->output();
    EXPECT_THAT(ranks[r]->output(), HasSubstr("done\n")) << "rank " << r;
  }
  absl::StatusOr<v1::Job> job = client_->GetJob("e");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->current_epoch(), 2u);
}

TEST_F(TrainerProcessTest, ASamplerdThatStaysDownFailsEveryRankNamingWhereItStopped) {
  constexpr uint32_t kWorld = 2;
  constexpr uint64_t kShard = 4'000;
  CreateJob("d", kWorld * kShard, kWorld);
  // Rank 0 runs an EpochLoop, rank 1 a bare LossReporter.
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  ranks.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
      kLoopRank, "--address=" + samplerd_->address(), kRetries, "--job=d", "--rank=0",
      absl::StrCat("--world_size=", kWorld), "--batch=250", "--pause_at=2000"}));
  ranks.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
      kReporterRank, "--address=" + samplerd_->address(), kRetries, "--job=d", "--rank=1",
      absl::StrCat("--world_size=", kWorld), "--pause_at=2000"}));
  ASSERT_FALSE(ranks[0]->AwaitLine("checkpoint epoch=0 position=2000").empty())
      << ranks[0]->output();
  ASSERT_FALSE(ranks[1]->AwaitLine("flushed position=2000").empty()) << ranks[1]->output();
  Kill();
  GoAhead(ranks);
  // The loop's first failure is its reader's (shard stream) or its reporter's (at the next
  // Report or the Flush at the end of the shard): both name the job, epoch, rank and position.
  EXPECT_EQ(ranks[0]->Wait(), 1) << ranks[0]->output();
  EXPECT_THAT(ranks[0]->output(), HasSubstr("error Run: UNAVAILABLE: "));
  EXPECT_THAT(ranks[0]->output(), HasSubstr("job \"d\" epoch 0 rank 0"));
  EXPECT_THAT(ranks[0]->output(), HasSubstr("position"));
  // The reporter's error names its batch: the epoch and the positions of the unacknowledged.
  EXPECT_EQ(ranks[1]->Wait(), 1) << ranks[1]->output();
  EXPECT_THAT(ranks[1]->output(), HasSubstr("UNAVAILABLE: LossReporter (job \"d\", rank 1)"));
  EXPECT_THAT(ranks[1]->output(), HasSubstr("(the first: epoch 0, positions [2000, "));
}

// With the client's default retries (300 s), an EpochLoop rank rides through a samplerd that its
// supervisor starts again 5 s after the crash (deploy/systemd: RestartSec=5s): its stream, its
// losses and its EndEpoch wait for the restart. The earlier default (5 retries, ~1.55 s) gave
// up first.
TEST_F(TrainerProcessTest, DefaultRetriesRideThroughARestartFiveSecondsAfterTheCrash) {
  constexpr uint64_t kShard = 4'000;
  CreateJob("s", kShard, 1);
  auto ranks = StartRanks(1, [&](uint32_t) {
    return std::vector<std::string>{kLoopRank,     "--address=" + samplerd_->address(),
                                    "--job=s",     "--rank=0",
                                    "--batch=250", absl::StrCat("--pause_at=", kShard / 2)};
  });
  AwaitAll(ranks, "checkpoint epoch=0 position=2000");
  Kill();
  GoAhead(ranks);
  absl::SleepFor(absl::Seconds(5));  // The supervisor's restart delay.
  Restart();
  EXPECT_EQ(ranks[0]->Wait(), 0) << ranks[0]->output();
  EXPECT_THAT(ranks[0]->output(), HasSubstr("done\n"));
  const v1::JobStatus status = Status("s");
  EXPECT_EQ(status.job().current_epoch(), 1u);  // The rank's EndEpoch reached the restarted one.
  EXPECT_EQ(status.samples_seen(), kShard);     // Every sample's loss, the flushed half restored.
}

}  // namespace
}  // namespace samplerd
