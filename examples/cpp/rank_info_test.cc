#include "examples/cpp/rank_info.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ResolveRankInfoTest, DefaultsToRankZeroOfOne) {
  absl::StatusOr<RankInfo> r = ResolveRankInfo({}, Env({}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 0u);
  EXPECT_EQ(r->world_size, 1u);
  EXPECT_EQ(r->local_rank, 0);
}

TEST(ResolveRankInfoTest, TakesTheLauncherEnvironment) {
  absl::StatusOr<RankInfo> r =
      ResolveRankInfo({}, Env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 5u);
  EXPECT_EQ(r->world_size, 8u);
  EXPECT_EQ(r->local_rank, 1);
}

TEST(ResolveRankInfoTest, LocalRankDefaultsToTheRank) {
  EXPECT_EQ(ResolveRankInfo({}, Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}}))->local_rank, 3);
}

TEST(ResolveRankInfoTest, FlagsWinOverTheEnvironment) {
  RankFlags flags;
  flags.rank = 1;
  flags.world_size = 2;
  flags.local_rank = 0;
  absl::StatusOr<RankInfo> r =
      ResolveRankInfo(flags, Env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 1u);
  EXPECT_EQ(r->world_size, 2u);
  EXPECT_EQ(r->local_rank, 0);
}

TEST(ResolveRankInfoTest, RefusesBadValuesNamingTheirSource) {
  EXPECT_THAT(ResolveRankInfo({}, Env({{"RANK", "one"}})).status().message(),
              HasSubstr("environment variable RANK = 'one' is not a decimal integer"));
  EXPECT_THAT(ResolveRankInfo({}, Env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})).status().message(),
              HasSubstr("environment variable RANK: rank 4 is outside [0, world size 4)"));
  RankFlags flags;
  flags.world_size = -3;
  EXPECT_THAT(ResolveRankInfo(flags, Env({})).status().message(),
              HasSubstr("--world_size: world size -3 is outside [1, 1048576]"));
  flags = RankFlags();
  flags.rank = 2;
  EXPECT_THAT(ResolveRankInfo(flags, Env({})).status().message(),
              HasSubstr("--rank: rank 2 is outside [0, world size 1)"));
  EXPECT_THAT(ResolveRankInfo({}, Env({{"LOCAL_RANK", "-2"}})).status().message(),
              HasSubstr("LOCAL_RANK: local rank -2"));
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
