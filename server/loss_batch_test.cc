#include "server/loss_batch.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// Both checks, as a job of N = 10 samples, M = `m` plan positions and 2 ranks makes them
// (shards of M / 2 positions). Without `positions`, the pairs are at shard positions 0, 1, ...
absl::Status Check(uint32_t rank, const std::vector<uint64_t>& indices,
                   const std::vector<float>& losses,
                   std::optional<std::vector<uint64_t>> positions = std::nullopt, uint64_t m = 10) {
  if (!positions.has_value()) {
    positions.emplace(indices.size());
    std::iota(positions->begin(), positions->end(), 0);
  }
  LossBatchView batch;
  batch.rank = rank;
  batch.indices = indices;
  batch.losses = losses;
  batch.positions = *positions;
  if (absl::Status s = ValidateLossBatch(batch, /*num_samples=*/10); !s.ok()) return s;
  return ValidateLossPositions(batch, /*shard_length=*/m / 2);
}

TEST(LossBatchTest, AcceptsAWellFormedBatch) { EXPECT_TRUE(Check(1, {0, 9}, {0.0f, 2.5f}).ok()); }

TEST(LossBatchTest, NamesTheFirstBadFieldAndValue) {
  struct Case {
    absl::Status status;
    const char* message;
  };
  const float nan = std::nanf("");
  const Case cases[] = {
      {Check(0, {1, 2}, {1}), "indices: 2 entries but losses: 1"},
      {Check(0, {}, {}), "indices: empty batch"},
      {Check(0, {3, 10}, {1, 1}), "indices[1] = 10 is outside [0, num_samples = 10)"},
      {Check(0, {3, 4}, {1, nan}), "losses[1] = nan"},
      {Check(0, {3}, {-1}), "losses[0] = -1"},
      {Check(0, {3}, {std::numeric_limits<float>::infinity()}), "losses[0] = inf"},
      {Check(0, {3, 4}, {1, 1}, std::vector<uint64_t>{0}), "positions: 1 entries but indices: 2"},
      {Check(1, {3, 4}, {1, 1}, std::vector<uint64_t>{4, 5}),
       "positions[1] = 5 is outside rank 1's shard [0, 5)"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(c.status.message(), HasSubstr(c.message));
  }
}

TEST(LossBatchTest, ConsecutivePositionsFromFirstPosition) {
  const std::vector<uint64_t> indices = {3, 4};
  const std::vector<float> losses = {1, 1};
  LossBatchView batch;
  batch.rank = 1;
  batch.indices = indices;
  batch.losses = losses;
  batch.consecutive = true;
  batch.first_position = 3;  // Positions 3 and 4 of a shard of 5.
  EXPECT_TRUE(ValidateLossBatch(batch, 10).ok());
  EXPECT_TRUE(ValidateLossPositions(batch, 5).ok());
  EXPECT_EQ(batch.position(1), 4u);
  batch.first_position = 4;  // Positions 4 and 5: past the end.
  absl::Status s = ValidateLossPositions(batch, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("first_position = 4 with 2 pairs passes the end of rank 1's "
                                     "shard [0, 5)"));
  const std::vector<uint64_t> positions = {0, 1};
  batch.first_position = 0;
  batch.positions = positions;  // Both forms at once.
  s = ValidateLossBatch(batch, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("positions: 2 entries and first_position = 0: give one"));
}

TEST(LossBatchTest, PositionsOfALaterDealNameIt) {
  const std::vector<uint64_t> indices = {3};
  const std::vector<float> losses = {1};
  const std::vector<uint64_t> positions = {7};
  LossBatchView batch;
  batch.epoch = 4;
  batch.deal = 2;
  batch.indices = indices;
  batch.losses = losses;
  batch.positions = positions;
  const absl::Status s = ValidateLossPositions(batch, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("positions[0] = 7 is outside rank 0's shard [0, 7) in deal 2 of epoch 4"));
}

TEST(LossBatchTest, AtMostTheLimitOfPairs) {
  std::vector<uint64_t> indices(kMaxLossBatchPairs, 1);
  std::vector<float> losses(kMaxLossBatchPairs, 1.0f);
  const uint64_t m = 4 * kMaxLossBatchPairs;  // Shards long enough for every position.
  EXPECT_TRUE(Check(0, indices, losses, std::nullopt, m).ok());
  indices.push_back(1);
  losses.push_back(1.0f);
  const absl::Status s = Check(0, indices, losses, std::nullopt, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1048577 pairs in one batch; at most 1048576"));
}

}  // namespace
}  // namespace samplerd
