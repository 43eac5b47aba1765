// Loss statistics (loss_stats.h): the layout the server's memory budget counts on, and the epoch
// marker's range.
#include "kernels/loss_stats.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

static_assert(sizeof(SampleLossStats) == 8, "8 bytes per sample (docs/SAMPLING.md, memory)");

TEST(EpochMarkerTest, NeverZeroAndDistinctOver65535Epochs) {
  EXPECT_EQ(EpochMarker(0), 1);
  EXPECT_EQ(EpochMarker(65534), 65535);
  EXPECT_EQ(EpochMarker(65535), 1);  // Wraps after 65535 epochs, skipping 0 ("never seen").
  for (uint64_t e = 1'000'000; e < 1'000'000 + 65535; ++e) {
    ASSERT_NE(EpochMarker(e), 0);
    ASSERT_NE(EpochMarker(e), EpochMarker(e + 1));
  }
}

}  // namespace
}  // namespace samplerd
