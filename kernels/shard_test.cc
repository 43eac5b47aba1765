// Shard arithmetic (shard.h): DistributedSampler's layout, every mode's partition of the plan
// positions, the rank check.
#include "kernels/shard.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// torch.utils.data.DistributedSampler(shuffle=False), as documented in its source:
//   num_samples = ceil((N - R) / R) if drop_last and N % R else ceil(N / R)
//   total_size = num_samples * R
//   indices = list(range(N)); pad: indices += (indices * ceil(pad / N))[:pad]; drop: [:total]
//   return indices[rank:total_size:R]
std::vector<uint64_t> TorchDistributedSampler(uint64_t n, uint64_t r, uint64_t rank,
                                              bool drop_last) {
  uint64_t num_samples;
  if (drop_last && n % r != 0) {
    // math.ceil((N - R) / R) in Python, where (N - R) may be negative.
    const double x = (static_cast<double>(n) - static_cast<double>(r)) / static_cast<double>(r);
    num_samples = static_cast<uint64_t>(std::max(0.0, std::ceil(x)));
  } else {
    num_samples = (n + r - 1) / r;
  }
  const uint64_t total = num_samples * r;
  std::vector<uint64_t> indices;
  for (uint64_t i = 0; i < n; ++i) indices.push_back(i);
  if (!drop_last) {
    const uint64_t pad = total - n;
    std::vector<uint64_t> repeated;
    const uint64_t copies = (pad + n - 1) / n;
    for (uint64_t c = 0; c < copies; ++c)
      repeated.insert(repeated.end(), indices.begin(), indices.end());
    indices.insert(indices.end(), repeated.begin(), repeated.begin() + pad);
  } else {
    indices.resize(total);
  }
  std::vector<uint64_t> out;
  for (uint64_t p = rank; p < total; p += r) out.push_back(indices[p]);
  return out;
}

// A sequential plan serves index p at plan position p, so its shards are the plan positions of
// ShardToPlanPosition: they must be DistributedSampler(shuffle=False)'s indices.
TEST(ShardTest, SequentialMatchesTorchDistributedSampler) {
  for (uint64_t n : {1, 2, 5, 7, 10, 13, 64, 101}) {
    for (uint32_t r : {1u, 2u, 3u, 4u, 8u, 16u}) {
      for (bool drop_last : {false, true}) {
        ShardSpec shard{r, PartitionMode::kInterleaved,
                        drop_last ? UnevenMode::kDropLast : UnevenMode::kPad};
        for (uint32_t rank = 0; rank < r; ++rank) {
          const std::vector<uint64_t> want = TorchDistributedSampler(n, r, rank, drop_last);
          auto len = ShardLength(n, shard, rank);
          ASSERT_TRUE(len.ok());
          ASSERT_EQ(*len, want.size()) << "n=" << n << " r=" << r << " drop=" << drop_last;
          std::vector<uint64_t> got(*len);
          for (uint64_t k = 0; k < *len; ++k) got[k] = ShardToPlanPosition(n, shard, rank, k);
          EXPECT_EQ(got, want) << "n=" << n << " r=" << r << " rank=" << rank
                               << " drop=" << drop_last;
        }
      }
    }
  }
}

// Every mode: equal lengths (pad, drop) or lengths within one (uneven), positions disjoint,
// union of positions = [0, M) for pad/uneven (pad adds only wrapped positions), ⊆ for drop.
TEST(ShardTest, PositionsPartitionThePlan) {
  for (uint64_t m : {1, 2, 3, 7, 10, 16, 33, 100}) {
    for (uint32_t r : {1u, 2u, 3u, 5u, 8u, 40u}) {
      for (PartitionMode part : {PartitionMode::kInterleaved, PartitionMode::kContiguous}) {
        for (UnevenMode uneven : {UnevenMode::kPad, UnevenMode::kDropLast, UnevenMode::kUneven}) {
          ShardSpec spec{r, part, uneven};
          std::vector<int> uses(m, 0);
          uint64_t min_len = ~uint64_t{0}, max_len = 0, total = 0;
          // Positions before the wrap: each plan position served at most once.
          for (uint32_t rank = 0; rank < r; ++rank) {
            const uint64_t len = *ShardLength(m, spec, rank);
            min_len = std::min(min_len, len);
            max_len = std::max(max_len, len);
            total += len;
            for (uint64_t k = 0; k < len; ++k) {
              const uint64_t p = ShardToPlanPosition(m, spec, rank, k);
              ASSERT_LT(p, m);
              ++uses[p];
            }
          }
          SCOPED_TRACE(testing::Message()
                       << "m=" << m << " r=" << r << " part=" << static_cast<int>(part)
                       << " uneven=" << static_cast<int>(uneven));
          switch (uneven) {
            case UnevenMode::kPad:
              EXPECT_EQ(min_len, max_len);
              EXPECT_EQ(total, (m + r - 1) / r * r);
              for (uint64_t p = 0; p < m; ++p) EXPECT_GE(uses[p], 1) << p;
              // Wrapped positions are the only repeats: total extra uses = total - m.
              break;
            case UnevenMode::kDropLast:
              EXPECT_EQ(min_len, max_len);
              EXPECT_EQ(total, m / r * r);
              for (uint64_t p = 0; p < m; ++p) EXPECT_LE(uses[p], 1) << p;
              break;
            case UnevenMode::kUneven:
              EXPECT_LE(max_len - min_len, 1u);
              EXPECT_EQ(total, m);
              for (uint64_t p = 0; p < m; ++p) EXPECT_EQ(uses[p], 1) << p;
              break;
          }
          uint64_t uses_total = 0;
          for (int u : uses) uses_total += u;
          EXPECT_EQ(uses_total, total);
        }
      }
    }
  }
}

TEST(ShardTest, RankOutsideWorldIsRejected) {
  auto s = ShardLength(10, ShardSpec{4}, 4);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("rank = 4"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("world_size = 4"));
  auto z = ShardLength(10, ShardSpec{0}, 0);
  ASSERT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(z.status().message()), HasSubstr("world_size = 0"));
}

}  // namespace
}  // namespace samplerd
