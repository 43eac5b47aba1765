#include "server/job_phase.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

using phase::AwaitingUpload;
using phase::Closed;
using phase::Failed;
using phase::Planning;
using phase::Serving;
using Purpose = Planning::Purpose;

Planning Plan(Purpose purpose, std::optional<phase::Settled> previous = std::nullopt) {
  Planning planning;
  planning.purpose = purpose;
  planning.previous = std::move(previous);
  return planning;
}

TEST(JobPhaseTest, TheEpochLoop) {
  EXPECT_TRUE(MayTransition(AwaitingUpload{}, Plan(Purpose::kUpload, AwaitingUpload{})));
  EXPECT_TRUE(MayTransition(Plan(Purpose::kUpload, AwaitingUpload{}), Serving{}));
  EXPECT_TRUE(MayTransition(Serving{}, Plan(Purpose::kNextEpoch)));
  EXPECT_TRUE(MayTransition(Plan(Purpose::kNextEpoch), Serving{}));
  EXPECT_TRUE(MayTransition(Plan(Purpose::kNextEpoch), Failed{}));
  // Nothing is served before a plan: no shard without an upload.
  EXPECT_FALSE(MayTransition(AwaitingUpload{}, Serving{}));
  EXPECT_FALSE(MayTransition(AwaitingUpload{}, Plan(Purpose::kNextEpoch)));
  EXPECT_FALSE(MayTransition(AwaitingUpload{}, Plan(Purpose::kRewind)));
}

TEST(JobPhaseTest, AFailedPlanningGoesBackOnlyToWhereItCameFrom) {
  // A failed re-upload keeps the published plan; a failed first upload awaits the upload again.
  EXPECT_TRUE(MayTransition(Plan(Purpose::kUpload, Serving{}), Serving{}));
  EXPECT_TRUE(MayTransition(Plan(Purpose::kUpload, AwaitingUpload{}), AwaitingUpload{}));
  EXPECT_FALSE(MayTransition(Plan(Purpose::kUpload, Serving{}), AwaitingUpload{}));
  // The next epoch's planning has nowhere to go back to.
  EXPECT_FALSE(MayTransition(Plan(Purpose::kNextEpoch), AwaitingUpload{}));
}

TEST(JobPhaseTest, RewindResizeAndFailures) {
  EXPECT_TRUE(MayTransition(Serving{}, Plan(Purpose::kRewind, Serving{})));
  EXPECT_TRUE(MayTransition(Failed{}, Plan(Purpose::kRewind, Failed{})));
  // A rewind of a failed job that cannot go on leaves it failed, with its first cause.
  EXPECT_TRUE(MayTransition(Plan(Purpose::kRewind, Failed{}), Failed{}));
  EXPECT_TRUE(MayTransition(Serving{}, Serving{}));  // A resize with nothing done.
  EXPECT_TRUE(MayTransition(Serving{}, Plan(Purpose::kRedeal, Serving{})));
  EXPECT_TRUE(MayTransition(Plan(Purpose::kRedeal, Serving{}), Serving{}));
  EXPECT_TRUE(MayTransition(Serving{}, Failed{}));  // The device failed applying losses.
  // A failure's cause is never overwritten, and only a rewind leaves Failed.
  EXPECT_FALSE(MayTransition(Failed{}, Failed{}));
  EXPECT_FALSE(MayTransition(Failed{}, Serving{}));
  EXPECT_FALSE(MayTransition(Failed{}, Plan(Purpose::kNextEpoch)));
  EXPECT_FALSE(MayTransition(Failed{}, Plan(Purpose::kRedeal, Failed{})));
}

TEST(JobPhaseTest, ClosedIsTerminalAndReachableFromEverywhere) {
  const JobPhase all[] = {AwaitingUpload{}, Plan(Purpose::kNextEpoch), Serving{}, Failed{},
                          Plan(Purpose::kRecovery)};
  for (const JobPhase& from : all) {
    EXPECT_TRUE(MayTransition(from, Closed{})) << PhaseName(from);
    EXPECT_FALSE(MayTransition(Closed{}, from)) << PhaseName(from);
  }
  EXPECT_FALSE(MayTransition(Closed{}, Closed{}));
}

TEST(JobPhaseTest, RecoveryStartsOnlyFromAFreshJob) {
  EXPECT_TRUE(MayTransition(AwaitingUpload{}, Plan(Purpose::kRecovery)));
  EXPECT_FALSE(MayTransition(Serving{}, Plan(Purpose::kRecovery)));
}

TEST(JobPhaseTest, Names) {
  EXPECT_STREQ(PhaseName(Plan(Purpose::kRewind)), "Planning(rewind)");
  EXPECT_STREQ(PhaseName(Plan(Purpose::kRedeal)), "Planning(re-deal)");
  EXPECT_STREQ(PhaseName(Failed{}), "Failed");
  EXPECT_STREQ(PhaseName(FromSettled(AwaitingUpload{})), "AwaitingUpload");
}

}  // namespace
}  // namespace samplerd
