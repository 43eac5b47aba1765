#include "proto/loss_pairs.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

absl::Status Check(std::vector<uint64_t> indices, std::vector<float> losses) {
  return ValidateLossPairs(indices, losses, /*num_samples=*/10);
}

TEST(LossPairsTest, AcceptsFiniteNonNegativeLossesOfKnownSamples) {
  EXPECT_TRUE(Check({0, 9}, {0.0f, 2.5f}).ok());
  EXPECT_TRUE(Check({3}, {-0.0f}).ok());
  EXPECT_TRUE(Check({}, {}).ok());  // Emptiness is the batch's rule, not the pairs'.
}

TEST(LossPairsTest, NamesTheFirstOffenderAndItsValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    absl::Status status;
    const char* message;
  } cases[] = {
      {Check({1, 2}, {1}), "indices: 2 entries but losses: 1"},
      {Check({3, 10}, {1, 1}), "indices[1] = 10 is outside [0, num_samples = 10)"},
      {Check({3, 4}, {1, std::nanf("")}), "losses[1] = nan"},
      {Check({3}, {-1}), "losses[0] = -1"},
      {Check({3}, {inf}), "losses[0] = inf"},
      {Check({3, UINT64_MAX}, {1, 1}), "indices[1] = 18446744073709551615 (-1 as int64)"},
      {Check({3, 12}, {std::nanf(""), 1}), "losses[0] = nan"},  // The first offender.
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message));
  }
}

// Batches long enough for the blocked fast path (16 pairs a block, then a tail): every kind of
// bad value at every position of a block and of the tail is found, every edge of the good
// values passes.
TEST(LossPairsTest, LongBatchesFindEveryOffenderWhereverItIs) {
  const uint64_t n = 1000;  // num_samples.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint64_t> indices(37);  // Two blocks of 16 and a tail of 5.
  std::vector<float> losses(indices.size());
  const float good_losses[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max(), 1.5f};
  for (size_t k = 0; k < indices.size(); ++k) {
    indices[k] = k % 2 ? n - 1 : k;
    losses[k] = good_losses[k % 5];
  }
  ASSERT_TRUE(ValidateLossPairs(indices, losses, n).ok());
  const float bad_losses[] = {
      std::nanf(""), -std::nanf(""), inf, -inf, -1.0f, -std::numeric_limits<float>::denorm_min()};
  const uint64_t bad_indices[] = {n, n + 1, uint64_t{1} << 62, uint64_t{1} << 63, UINT64_MAX};
  for (size_t at = 0; at < indices.size(); ++at) {
    for (float bad : bad_losses) {
      std::vector<float> l = losses;
      l[at] = bad;
      const absl::Status s = ValidateLossPairs(indices, l, n);
      EXPECT_THAT(std::string(s.message()), HasSubstr("losses[" + std::to_string(at) + "] = "))
          << "a loss of " << bad << " at " << at;
    }
    for (uint64_t bad : bad_indices) {
      std::vector<uint64_t> i = indices;
      i[at] = bad;
      const absl::Status s = ValidateLossPairs(i, losses, n);
      EXPECT_THAT(std::string(s.message()), HasSubstr("indices[" + std::to_string(at) + "] = "))
          << "index " << bad << " at " << at;
    }
  }
  // No samples: every index is outside.
  EXPECT_THAT(std::string(ValidateLossPairs(indices, losses, 0).message()),
              HasSubstr("indices[0] = 0 is outside [0, num_samples = 0)"));
  // More samples than 2^63 (beyond any job): the fast path may doubt, the exact check decides.
  indices[5] = uint64_t{1} << 63;
  EXPECT_TRUE(ValidateLossPairs(indices, losses, UINT64_MAX).ok());
  indices[5] = UINT64_MAX;
  EXPECT_THAT(std::string(ValidateLossPairs(indices, losses, UINT64_MAX).message()),
              HasSubstr("indices[5] = 18446744073709551615"));
}

}  // namespace
}  // namespace samplerd
