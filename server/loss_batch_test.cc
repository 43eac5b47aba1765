#include "server/loss_batch.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

absl::Status Check(uint32_t rank, const std::vector<uint64_t>& indices,
                   const std::vector<float>& losses, uint64_t n = 10) {
  LossBatchView batch;
  batch.rank = rank;
  batch.indices = indices;
  batch.losses = losses;
  return ValidateLossBatch(batch, n, ShardSpec{2});
}

TEST(LossBatchTest, AcceptsAWellFormedBatch) { EXPECT_TRUE(Check(1, {0, 9}, {0.0f, 2.5f}).ok()); }

TEST(LossBatchTest, NamesTheFirstBadFieldAndValue) {
  struct Case {
    absl::Status status;
    const char* message;
  };
  const float nan = std::nanf("");
  const Case cases[] = {
      {Check(2, {1}, {1}), "rank = 2 is outside [0, world_size = 2)"},
      {Check(0, {1, 2}, {1}), "indices: 2 entries but losses: 1"},
      {Check(0, {}, {}), "indices: empty batch"},
      {Check(0, {3, 10}, {1, 1}), "indices[1] = 10 is outside [0, num_samples = 10)"},
      {Check(0, {3, 4}, {1, nan}), "losses[1] = nan"},
      {Check(0, {3}, {-1}), "losses[0] = -1"},
      {Check(0, {3}, {std::numeric_limits<float>::infinity()}), "losses[0] = inf"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(c.status.message(), HasSubstr(c.message));
  }
}

TEST(LossBatchTest, AtMostTheLimitOfPairs) {
  std::vector<uint64_t> indices(kMaxLossBatchPairs, 1);
  std::vector<float> losses(kMaxLossBatchPairs, 1.0f);
  EXPECT_TRUE(Check(0, indices, losses).ok());
  indices.push_back(1);
  losses.push_back(1.0f);
  const absl::Status s = Check(0, indices, losses);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1048577 pairs in one batch; at most 1048576"));
}

}  // namespace
}  // namespace samplerd
