#include "client/cpp/resume_check.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Rank 1 of 2 of job "j", at position 300 of its shard of epoch 2 (deal 0, length 500).
ReaderPosition Saved() {
  ReaderPosition p;
  p.job = "j";
  p.epoch = 2;
  p.deal = 0;
  p.rank = 1;
  p.world_size = 2;
  p.position = 300;
  p.shard_length = 500;
  return p;
}

// The job at epoch 2, deal 0, epochs 0 to 2 kept, the rank streamed 400 positions.
ServerProgress Server() {
  ServerProgress s;
  s.current_epoch = 2;
  s.current_deal = 0;
  s.rewindable_epochs = {0, 1, 2};
  s.indices_streamed = 400;
  return s;
}

void ExpectResumesAt(const ReaderPosition& from, const ServerProgress& server, ResumeAt at) {
  absl::StatusOr<ResumeAt> decided = CheckResume(from, server);
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_EQ(*decided, at);
}

std::string Refusal(const ReaderPosition& from, const ServerProgress& server,
                    absl::StatusCode code = absl::StatusCode::kFailedPrecondition) {
  absl::StatusOr<ResumeAt> decided = CheckResume(from, server);
  EXPECT_EQ(decided.status().code(), code) << decided.status();
  return std::string(decided.status().message());
}

TEST(ResumeCheckTest, PositionPastItsShardIsInvalid) {
  ReaderPosition from = Saved();
  from.position = 501;
  EXPECT_THAT(Refusal(from, Server(), absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr("job \"j\" epoch 2 rank 1: cannot resume position 501"),
                    HasSubstr("past the shard's length 500")));
}

TEST(ResumeCheckTest, EndOfAClosedEpochsShardGoesOnWithTheNextEpoch) {
  ReaderPosition from = Saved();
  from.epoch = 1;
  from.position = 500;
  ExpectResumesAt(from, Server(), ResumeAt::kNextEpoch);
  // Whatever deal it was read in (the epoch may have been dealt again before it closed).
  from.deal = 3;
  ExpectResumesAt(from, Server(), ResumeAt::kNextEpoch);
  // An empty shard is at its end at position 0.
  from.position = 0;
  from.shard_length = 0;
  ExpectResumesAt(from, Server(), ResumeAt::kNextEpoch);
}

TEST(ResumeCheckTest, EndOfAClosedEpochWhoseNextEpochClosedTooIsRefused) {
  ReaderPosition from = Saved();
  from.epoch = 0;
  from.position = 500;
  EXPECT_THAT(Refusal(from, Server()),
              AllOf(HasSubstr("job \"j\" epoch 1 rank 1: cannot resume position 0"),
                    HasSubstr("the end of epoch 0's shard, position 500"),
                    HasSubstr("epoch 1 has closed since (job \"j\" is at epoch 2)"),
                    HasSubstr("SamplerClient::RewindJob(\"j\", 1)"),
                    HasSubstr("samplerctl rewind j 1"), HasSubstr("EpochLoop::Run(2, ...)")));
}

TEST(ResumeCheckTest, ShortOfTheEndOfAClosedEpochNamesTheTwoWaysOn) {
  ReaderPosition from = Saved();
  from.epoch = 1;
  EXPECT_THAT(
      Refusal(from, Server()),
      AllOf(HasSubstr("job \"j\" epoch 1 rank 1: cannot resume position 300"),
            HasSubstr("epoch 1 has closed since (job \"j\" is at epoch 2)"),
            HasSubstr("positions 300 to 499 of its shard can no longer be served"),
            HasSubstr("SamplerClient::RewindJob(\"j\", 1)"), HasSubstr("samplerctl rewind j 1"),
            HasSubstr("resume every rank from position 0 of epoch 1"),
            HasSubstr("continue with epoch 2 without this position"),
            HasSubstr("EpochLoop::Run(2, ...)")));
  // Position 0 of a closed epoch is short of its end too.
  from.position = 0;
  EXPECT_THAT(Refusal(from, Server()), HasSubstr("positions 0 to 499"));
}

TEST(ResumeCheckTest, ShortOfTheEndOfAClosedEpochNoLongerKept) {
  ReaderPosition from = Saved();
  from.epoch = 0;
  ServerProgress server = Server();
  server.rewindable_epochs = {1, 2};
  EXPECT_THAT(Refusal(from, server),
              AllOf(HasSubstr("a rewind to the start of epoch 0 is no longer possible (kept: 1, "
                              "2; samplerd --rewind_epochs)"),
                    Not(HasSubstr("RewindJob")), HasSubstr("EpochLoop::Run(2, ...)")));
  server.rewindable_epochs.clear();
  EXPECT_THAT(Refusal(from, server), HasSubstr("(kept: none;"));
}

TEST(ResumeCheckTest, UnknownShardLengthOfAClosedEpochIsRefused) {
  ReaderPosition from = Saved();  // As read from a version 2 text.
  from.epoch = 1;
  from.position = 500;
  from.shard_length.reset();
  EXPECT_THAT(Refusal(from, Server()),
              AllOf(HasSubstr("cannot resume position 500"),
                    HasSubstr("the positions of its shard from 500 on (the shard's length is "
                              "unknown"),
                    HasSubstr("SamplerClient::RewindJob(\"j\", 1)")));
}

TEST(ResumeCheckTest, AnEpochsStartIsRead) {
  ReaderPosition from = Saved();
  from.position = 0;
  ServerProgress server = Server();
  server.indices_streamed = 0;
  ExpectResumesAt(from, server, ResumeAt::kPosition);
  from.epoch = 3;  // The next epoch: StreamShard waits for it to open.
  from.shard_length.reset();
  ExpectResumesAt(from, server, ResumeAt::kPosition);
}

TEST(ResumeCheckTest, AnotherDealOfTheCurrentEpochIsLeftToTheServer) {
  ReaderPosition from = Saved();
  ServerProgress server = Server();
  server.current_deal = 1;
  server.indices_streamed = 0;
  ExpectResumesAt(from, server, ResumeAt::kPosition);
}

TEST(ResumeCheckTest, APositionTheServerStreamedIsRead) {
  ReaderPosition from = Saved();
  ExpectResumesAt(from, Server(), ResumeAt::kPosition);
  from.position = 400;  // Exactly what was streamed.
  ExpectResumesAt(from, Server(), ResumeAt::kPosition);
  from.position = 500;  // The end of the shard of the current epoch: read (nothing), then ended.
  ServerProgress server = Server();
  server.indices_streamed = 500;
  ExpectResumesAt(from, server, ResumeAt::kPosition);
}

TEST(ResumeCheckTest, APositionPastWhatTheServerStreamedPredatesARewind) {
  ReaderPosition from = Saved();
  ServerProgress server = Server();
  server.indices_streamed = 0;  // Rewound to epoch 2's start.
  EXPECT_THAT(Refusal(from, server),
              AllOf(HasSubstr("job \"j\" epoch 2 rank 1: cannot resume position 300 (deal 0)"),
                    HasSubstr("the server streamed this rank only 0 positions of epoch 2"),
                    HasSubstr("(job \"j\" is at epoch 2, deal 0)"),
                    HasSubstr("predates a rewind of the job (RewindJob)"),
                    HasSubstr("resume from a position saved at the start of the epoch"),
                    HasSubstr("EpochLoop::Run(2, ...)")));
  server.indices_streamed = 299;
  EXPECT_THAT(Refusal(from, server), HasSubstr("streamed this rank only 299 positions"));
}

// Right after an epoch closes (or during a rewind) GetJobStatus shows the new epoch number
// before its plan is ready, with the ranks' progress of what it replaces: not this epoch's.
TEST(ResumeCheckTest, TheRanksProgressIsNotReadBeforeThePlanIsReady) {
  ReaderPosition from = Saved();
  ServerProgress server = Server();  // indices_streamed 400: a stale record.
  server.plan_ready = false;
  EXPECT_THAT(Refusal(from, server), HasSubstr("streamed this rank only 0 positions of epoch 2"));
  from.position = 0;
  ExpectResumesAt(from, server, ResumeAt::kPosition);
}

TEST(ResumeCheckTest, APositionPastTheStartOfALaterEpochIsRefused) {
  // Saved in epoch 3, then the job was rewound to epoch 2.
  ReaderPosition from = Saved();
  from.epoch = 3;
  EXPECT_THAT(Refusal(from, Server()),
              AllOf(HasSubstr("job \"j\" epoch 3 rank 1: cannot resume position 300"),
                    HasSubstr("streamed this rank only 0 positions of epoch 3"),
                    HasSubstr("EpochLoop::Run(2, ...)")));
}

}  // namespace
}  // namespace samplerd
