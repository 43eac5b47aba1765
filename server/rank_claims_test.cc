#include "server/rank_claims.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

// Claims of job "j" on a clock the test moves.
class RankClaimsTest : public testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  RankClaims claims_{"j", 1, [this] { return now_; }};
};

TEST_F(RankClaimsTest, ASecondClaimOfARankHeldByALiveClaimantIsRefusedNamingTheHolder) {
  absl::StatusOr<uint64_t> first = claims_.Claim(1, false, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 1u);
  now_ += absl::Seconds(42);
  absl::StatusOr<uint64_t> second = claims_.Claim(1, false, nullptr);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(second.status().message());
  EXPECT_TRUE(absl::StrContains(message, "another live process holds rank 1 of job 'j'"))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "incarnation 1, claimed 42 s ago")) << message;
  EXPECT_TRUE(absl::StrContains(message, "shared_rank=True")) << message;
  // A peer cannot join a rank a non-peer holds either; other ranks are free.
  EXPECT_EQ(claims_.Claim(1, true, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(claims_.Claim(0, false, nullptr).ok());
  EXPECT_EQ(claims_.open(), 2);
}

TEST_F(RankClaimsTest, PeersShareARankAndANonPeerIsRefusedWhileAnyPeerHoldsIt) {
  absl::StatusOr<uint64_t> a = claims_.Claim(3, true, nullptr);
  absl::StatusOr<uint64_t> b = claims_.Claim(3, true, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(*a, *b);
  absl::StatusOr<uint64_t> lone = claims_.Claim(3, false, nullptr);
  ASSERT_EQ(lone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(lone.status().message(), "2 peer claims held")) << lone.status();
  EXPECT_TRUE(claims_.Check(3, *a).ok());
  EXPECT_TRUE(claims_.Check(3, *b).ok());
  claims_.Release(3, *a);
  EXPECT_EQ(claims_.Claim(3, false, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);  // b still holds it.
  claims_.Release(3, *b);
  EXPECT_TRUE(claims_.Claim(3, false, nullptr).ok());  // Free again.
}

TEST_F(RankClaimsTest, AReleasedRankIsClaimedAgainAtOnceWithANewIncarnation) {
  const uint64_t first = *claims_.Claim(1, false, nullptr);
  claims_.Release(1, first);
  EXPECT_EQ(claims_.open(), 0);
  absl::StatusOr<uint64_t> again = claims_.Claim(1, false, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(*again, first);
  claims_.Release(1, first);  // A second release of the old claim changes nothing.
  EXPECT_TRUE(claims_.Check(1, *again).ok());
  EXPECT_EQ(claims_.open(), 1);
}

TEST_F(RankClaimsTest, AClaimReplacingTheCallersOwnLiveClaimTakesItsPlace) {
  // The client's connection broke silently: the server still counts its claim.
  const uint64_t old = *claims_.Claim(1, false, nullptr);
  absl::StatusOr<uint64_t> renewed = claims_.Claim(1, false, nullptr, old);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(claims_.open(), 1);
  EXPECT_EQ(claims_.Check(1, old).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(claims_.Check(1, *renewed).ok());
  claims_.Release(1, old);  // The old call ends later: nothing changes.
  EXPECT_TRUE(claims_.Check(1, *renewed).ok());
  // Naming a number that holds nothing (or another rank's claim) replaces nothing.
  const uint64_t other = *claims_.Claim(2, false, nullptr);
  EXPECT_EQ(claims_.Claim(1, false, nullptr, other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(claims_.Check(2, other).ok());
}

TEST_F(RankClaimsTest, AStaleIncarnationIsAbortedSayingWhenItsClaimEnded) {
  const uint64_t first = *claims_.Claim(1, false, nullptr);
  now_ += absl::Seconds(5);
  claims_.Release(1, first);
  now_ += absl::Seconds(3);
  absl::Status stale = claims_.Check(1, first);
  ASSERT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(stale.message(),
                                "incarnation 1 no longer holds rank 1 of job "
                                "'j' (its ClaimRank call ended 3 s ago"))
      << stale;
  EXPECT_TRUE(absl::StrContains(stale.message(), "claim the rank again")) << stale;
  // An incarnation this server never issued for the rank (a restart, another rank's).
  const uint64_t other = *claims_.Claim(2, false, nullptr);
  absl::Status unknown = claims_.Check(1, other);
  ASSERT_EQ(unknown.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(unknown.message(), "before the server restarted")) << unknown;
  EXPECT_EQ(claims_.Check(1, 99).code(), absl::StatusCode::kAborted);
}

TEST_F(RankClaimsTest, IncarnationZeroIsAcceptedOnlyWhileNobodyHoldsTheRank) {
  EXPECT_TRUE(claims_.Check(1, 0).ok());
  const uint64_t held = *claims_.Claim(1, false, nullptr);
  absl::Status doubled = claims_.Check(1, 0);
  ASSERT_EQ(doubled.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(doubled.message(),
                                "another live process holds rank 1 of job "
                                "'j' (incarnation 1"))
      << doubled;
  EXPECT_TRUE(claims_.Check(0, 0).ok());  // Another rank.
  claims_.Release(1, held);
  EXPECT_TRUE(claims_.Check(1, 0).ok());
  // Peers hold it: still refused without an incarnation.
  ASSERT_TRUE(claims_.Claim(1, true, nullptr).ok());
  EXPECT_EQ(claims_.Check(1, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RankClaimsTest, CloseEndsEveryClaimOnceWithItsReasonAndRefusesLaterClaims) {
  std::vector<std::string> ended;
  auto record = [&](const absl::Status& reason) { ended.emplace_back(reason.message()); };
  const uint64_t a = *claims_.Claim(0, false, record);
  ASSERT_TRUE(claims_.Claim(1, true, record).ok());
  ASSERT_TRUE(claims_.Claim(1, true, record).ok());
  claims_.Release(0, a);  // Released: its callback is not run.
  claims_.Close(absl::NotFoundError("job 'j' was deleted"));
  EXPECT_EQ(ended, std::vector<std::string>(2, "job 'j' was deleted"));
  EXPECT_EQ(claims_.open(), 0);
  EXPECT_EQ(claims_.Claim(2, false, record).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(claims_.Check(1, a).code(), absl::StatusCode::kAborted);
  claims_.Close(absl::UnavailableError("again"));  // A second close changes nothing.
  EXPECT_EQ(ended.size(), 2u);
}

TEST(RankClaimsFirstIncarnation, IncarnationsStartAtTheGivenNumberAndAreNeverZero) {
  RankClaims from_clock("j", 1700000000000000);
  EXPECT_EQ(*from_clock.Claim(0, false, nullptr), 1700000000000000u);
  EXPECT_EQ(*from_clock.Claim(1, false, nullptr), 1700000000000001u);
  RankClaims from_zero("j", 0);
  EXPECT_EQ(*from_zero.Claim(0, false, nullptr), 1u);
}

}  // namespace
}  // namespace samplerd
