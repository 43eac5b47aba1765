// The host references (reference.h) and the shared host/device rules (plan_math.h), compiled as
// host code, against the CPU backend: runs in CI without a GPU. With identity_test (GPU ==
// reference, on the GPU machine) it makes the chain GPU == CPU backend.
#include "kernels/cuda/reference.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compute_backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/shard.h"
#include "kernels/testing/backend_state.h"
#include "kernels/cuda/plan_math.h"
#include "kernels/philox.h"

namespace samplerd {
namespace gpu {
namespace {

std::vector<uint64_t> ToVector(const samplerd::Plan& plan) {
  std::vector<uint64_t> out(plan.size());
  for (uint64_t p = 0; p < plan.size(); ++p) out[p] = plan[p];
  return out;
}

// Weight patterns of the identity tests: random, ties, zeros, extreme ratios.
std::vector<float> Weights(const std::string& kind, uint64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> w(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (kind == "random") {
      w[i] = unit(rng) + 1e-3f;
    } else if (kind == "ties") {
      w[i] = static_cast<float>(1 + rng() % 3);
    } else if (kind == "zeros") {
      w[i] = (i % 3 == 1) ? 0.0f : unit(rng) + 0.5f;
    } else {  // "extreme": 2^-60 .. 2^60 (a ratio of 2^120, within kMaxWeightRatio).
      w[i] = std::ldexp(1.0f, static_cast<int>(rng() % 121) - 60);
    }
  }
  if (n > 0 && kind == "zeros") w[0] = 1.0f;  // At least one positive weight.
  return w;
}

uint64_t Positive(const std::vector<float>& w) {
  uint64_t count = 0;
  for (float x : w) count += x > 0;
  return count;
}

TEST(ReferenceTest, PlansEqualTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  int checked = 0;
  // 70000 passes the CPU selection's small-input path (65536); 5000 and 70000 have 8 and 128
  // shuffle buckets.
  for (uint64_t n : {1ull, 2ull, 7ull, 100ull, 5000ull, 70000ull}) {
    for (const char* kind : {"uniform", "random", "ties", "zeros", "extreme"}) {
      const std::vector<float> w =
          std::string(kind) == "uniform" ? std::vector<float>() : Weights(kind, n, 11);
      const uint64_t positive = w.empty() ? n : Positive(w);
      for (bool replacement : {false, true}) {
        for (uint64_t m : {uint64_t{1}, n / 10, positive - 1, positive, n, 2 * n}) {
          if (m == 0 || (!replacement && m > positive)) continue;
          PlanSpec spec;
          spec.num_samples = n;
          spec.samples_per_epoch = m;
          spec.seed = 0x5eed0000 + n;
          spec.replacement = replacement;
          const uint64_t epoch = 3;
          absl::StatusOr<samplerd::Plan> plan = testutil::PlanWith(*cpu, spec, epoch, w);
          ASSERT_TRUE(plan.ok()) << plan.status();
          reference::PlanInputs in;
          in.n = n;
          in.m = m;
          in.seed = spec.seed;
          in.epoch = epoch;
          in.replacement = replacement;
          in.weights = w.empty() ? nullptr : w.data();
          // M == N without replacement ignores the weights (every index once), as the CPU.
          if (!replacement && m == n) in.weights = nullptr;
          ASSERT_EQ(reference::Plan(in, ShuffleBucketBits), ToVector(*plan))
              << "n " << n << " m " << m << " weights " << kind << " replacement "
              << replacement;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Past 2^24 inputs the CPU partitions in two levels (shuffle.h): M = N = 2^24 + 1 (b = 15).
TEST(ReferenceTest, PlanPastTheCpuTwoLevelPartitionEqualsTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  PlanSpec spec;
  spec.num_samples = spec.samples_per_epoch = (uint64_t{1} << 24) + 1;
  spec.seed = 99;
  absl::StatusOr<samplerd::Plan> plan = cpu->PlanEpoch(spec, 5, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  reference::PlanInputs in;
  in.n = in.m = spec.num_samples;
  in.seed = spec.seed;
  in.epoch = 5;
  EXPECT_EQ(reference::Plan(in, ShuffleBucketBits), ToVector(*plan));
}

TEST(ReferenceTest, SequentialPlanEqualsTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  PlanSpec spec;
  spec.num_samples = spec.samples_per_epoch = 1000;
  spec.order = SampleOrder::kSequential;
  absl::StatusOr<samplerd::Plan> plan = cpu->PlanEpoch(spec, 0, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  reference::PlanInputs in;
  in.n = in.m = 1000;
  in.sequential = true;
  EXPECT_EQ(reference::Plan(in, ShuffleBucketBits), ToVector(*plan));
}

TEST(ReferenceTest, ShardPositionsEqualTheCpuArithmetic) {
  for (uint64_t m = 1; m <= 40; ++m) {
    for (uint32_t r = 1; r <= 7; ++r) {
      for (bool interleaved : {true, false}) {
        for (int uneven : {kUnevenPad, kUnevenDropLast, kUnevenUneven}) {
          ShardSpec cpu_spec;
          cpu_spec.world_size = r;
          cpu_spec.partition = interleaved ? PartitionMode::kInterleaved : PartitionMode::kContiguous;
          cpu_spec.uneven = uneven == kUnevenPad        ? UnevenMode::kPad
                            : uneven == kUnevenDropLast ? UnevenMode::kDropLast
                                                        : UnevenMode::kUneven;
          const ShardLayout layout{r, interleaved, uneven};
          for (uint32_t rank = 0; rank < r; ++rank) {
            absl::StatusOr<uint64_t> length = samplerd::ShardLength(m, cpu_spec, rank);
            ASSERT_TRUE(length.ok());
            ASSERT_EQ(reference::ShardLength(m, layout, rank), *length);
            for (uint64_t p = 0; p < *length; ++p) {
              ASSERT_EQ(ShardPlanPosition(m, layout, rank, p),
                        ShardToPlanPosition(m, cpu_spec, rank, p))
                  << "m " << m << " R " << r << " rank " << rank << " pos " << p;
            }
          }
        }
      }
    }
  }
}

TEST(PlanMathTest, BucketBitsGiveBucketsOfAtMost1024OnAverage) {
  EXPECT_EQ(ShuffleBucketBits(1), 0);
  EXPECT_EQ(ShuffleBucketBits(1024), 0);
  EXPECT_EQ(ShuffleBucketBits(1025), 1);
  EXPECT_EQ(ShuffleBucketBits(2048), 1);
  EXPECT_EQ(ShuffleBucketBits(2049), 2);
  EXPECT_EQ(ShuffleBucketBits(1000000000), 20);  // 954 inputs per bucket.
  EXPECT_EQ(ShuffleBucketBits(uint64_t{1} << 40), 30);
}

TEST(PlanMathTest, SwapWordsFollowTheDefinition) {
  // u_t = word t mod 4 of RandomBlock(seed, epoch, 4, B * 2^40 + t / 4).
  SwapWords words(9, 4, 77);
  for (uint64_t t = 0; t < 12; ++t) {
    const Philox4x32Counter block =
        RandomBlock(9, 4, RandomStream::kShuffleSwap, (uint64_t{77} << 40) + t / 4);
    EXPECT_EQ(words.Next(), block.v[t % 4]) << t;
  }
}

TEST(PlanMathTest, BucketOfIsTheTopBitsOfTheShuffleWord) {
  for (uint64_t k = 0; k < 16; ++k) {
    const uint32_t word = RandomBlock(5, 6, RandomStream::kShuffle, k / 4).v[k % 4];
    EXPECT_EQ(ShuffleBucketOf(5, 6, 20, k), word >> 12);
    EXPECT_EQ(ShuffleBucketOf(5, 6, 0, k), 0u);
  }
}

TEST(ReferenceTest, ShuffleIsAPermutationWithTheNewRule) {
  for (uint64_t m : {1ull, 2ull, 1024ull, 1025ull, 100000ull}) {
    std::vector<uint64_t> inputs(m);
    for (uint64_t k = 0; k < m; ++k) inputs[k] = 3 * k;
    std::vector<uint64_t> out = reference::Shuffle(1, 2, inputs, ShuffleBucketBits(m));
    ASSERT_EQ(out.size(), m);
    if (m > 100) {
      EXPECT_NE(out, inputs);  // Not the identity.
    }
    std::sort(out.begin(), out.end());
    EXPECT_EQ(out, inputs);
  }
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd
