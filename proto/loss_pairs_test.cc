#include "proto/loss_pairs.h"

#include <cmath>
#include <cstdint>
#include <limits>
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

}  // namespace
}  // namespace samplerd
