// RankClaim (client/cpp/rank_claim.h) as EpochLoop holds it, against a real in-process samplerd
// over real gRPC (loopback, port 0): a second loop of a claimed rank is refused naming the job and
// the rank before anything is streamed to it, a reader that does not claim is refused, an
// observer reads, the successor of a destroyed loop is accepted at once; declared peers share a
// rank and their losses count once per position. (Claims across real processes, SIGKILL and
// server restarts: tests/python/test_rank_claims.py and trainer_process_test's EpochLoop ranks.)
#include "client/cpp/rank_claim.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "client/cpp/shard_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"
#include "tests/loop_server_test_base.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// The indices one loop was handed, per epoch.
struct RankRecord {
  std::vector<std::vector<uint64_t>> indices;
};

class RankClaimTest : public LoopServerTest {
 protected:
  // A step that records the batch and reports a loss of 1 for each index.
  static EpochLoop::Step RecordingStep(RankRecord& record) {
    return [&record](const EpochBatch& batch, LossSink& losses) -> absl::Status {
      if (record.indices.size() <= batch.epoch) record.indices.resize(batch.epoch + 1);
      std::vector<uint64_t>& seen = record.indices[batch.epoch];
      seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
      return losses.Report(std::vector<float>(batch.indices.size(), 1.0f));
    };
  }
};

TEST_F(RankClaimTest, ASecondLoopOfAClaimedRankIsRefusedWhileTheFirstLives) {
  CreateJob("claimed", 2);
  std::unique_ptr<EpochLoop> first = NewLoop("claimed", 1, 2);
  ASSERT_NE(first, nullptr);
  // A second trainer of rank 1 (a process started twice): refused before anything is streamed.
  absl::StatusOr<std::unique_ptr<EpochLoop>> second = EpochLoop::Create(client_, "claimed", 1, 2);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr("another live process holds rank 1 of job 'claimed' (incarnation "));
  EXPECT_THAT(second.status().message(), HasSubstr("shared_rank=True"));
  // A reader that does not claim cannot read the claimed rank either; an observer can.
  ShardReaderOptions unclaimed;
  unclaimed.job = "claimed";
  unclaimed.rank = 1;
  unclaimed.world_size = 2;
  auto reader = ShardReader::Create(client_, unclaimed);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::Status read = (*reader)->StartEpoch(0);
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_THAT(read.message(), HasSubstr("this request carries no incarnation"));
  StreamShardOptions observe;
  observe.observe = true;
  uint64_t observed = 0;
  EXPECT_TRUE(client_
                  ->StreamShard("claimed", 0, 1, 2, observe,
                                [&](const ShardSlice& slice) {
                                  observed += slice.indices.size();
                                  return absl::OkStatus();
                                })
                  .ok());
  EXPECT_EQ(observed, kSamples / 2);
  auto status = client_->GetJobStatus("claimed");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->ranks(1).losses_accepted(), 0u);
  // The first trainer goes: its successor is accepted.
  first.reset();
  std::unique_ptr<EpochLoop> successor = NewLoop("claimed", 1, 2);
  EXPECT_NE(successor, nullptr);
}

TEST_F(RankClaimTest, DeclaredPeersShareARankAndTheirLossesCountOnce) {
  CreateJob("peers", 1);
  EpochLoopOptions peer;
  peer.peer = true;
  std::vector<std::unique_ptr<EpochLoop>> loops;
  for (int p = 0; p < 2; ++p) {
    loops.push_back(NewLoop("peers", 0, 1, peer));
    ASSERT_NE(loops.back(), nullptr);
  }
  absl::StatusOr<std::unique_ptr<EpochLoop>> lone = EpochLoop::Create(client_, "peers", 0, 1);
  ASSERT_EQ(lone.status().code(), absl::StatusCode::kFailedPrecondition) << lone.status();
  EXPECT_THAT(lone.status().message(), HasSubstr("2 peer claims held"));
  // Both peers read the whole shard of epoch 0 and report every loss: each position counts once.
  std::vector<RankRecord> records(2);
  std::vector<ShardEnd> ends(2);
  for (int p = 0; p < 2; ++p) {
    // Both peers read epoch 0 before either ends it: the first one's end would close it.
    ASSERT_TRUE(loops[p]
                    ->Run(0, 1, RecordingStep(records[p]),
                          [&, p](const ShardEnd& end) {
                            ends[p] = end;
                            return p == 0 ? absl::CancelledError("peer 0 stops before EndEpoch")
                                          : absl::OkStatus();
                          })
                    .code() == (p == 0 ? absl::StatusCode::kCancelled : absl::StatusCode::kOk));
  }
  EXPECT_EQ(records[0].indices, records[1].indices);
  EXPECT_EQ(ends[0].losses.accepted + ends[1].losses.accepted, kSamples);
  EXPECT_EQ(ends[0].losses.duplicates + ends[1].losses.duplicates, kSamples);
  auto status = client_->GetJobStatus("peers");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->job().current_epoch(), 1u);
}

}  // namespace
}  // namespace samplerd
