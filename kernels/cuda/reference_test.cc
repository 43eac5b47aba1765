// The host references (reference.h) and the shared host/device rules (kernels/plan_math.h),
// compiled as host code, against the CPU backend: runs in CI without a GPU. With identity_test (GPU
// == reference, on the GPU machine) it makes the chain GPU == CPU backend.
#include "kernels/cuda/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compute_backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/recompute_params.h"
#include "kernels/loss_groups.h"
#include "kernels/loss_stats.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"
#include "kernels/testing/backend_state.h"
#include "kernels/testing/policy_cases.h"
#include "kernels/testing/weight_cases.h"
#include "kernels/weight_math.h"
#include "kernels/weight_policy.h"

namespace samplerd {
namespace gpu {
namespace {

using testutil::PatternWeights;
using testutil::VariedStats;

std::vector<uint64_t> ToVector(const samplerd::Plan& plan) {
  std::vector<uint64_t> out(plan.size());
  for (uint64_t p = 0; p < plan.size(); ++p) out[p] = plan[p];
  return out;
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
          std::string(kind) == "uniform" ? std::vector<float>() : PatternWeights(kind, n, 11);
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
          ASSERT_EQ(reference::Plan(in, plan_math::ShuffleBucketBits), ToVector(*plan))
              << "n " << n << " m " << m << " weights " << kind << " replacement " << replacement;
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
  EXPECT_EQ(reference::Plan(in, plan_math::ShuffleBucketBits), ToVector(*plan));
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
  EXPECT_EQ(reference::Plan(in, plan_math::ShuffleBucketBits), ToVector(*plan));
}

// The device's draw table keeps prefix sums per block of kDrawBlock samples and recomputes a
// block's q at each draw (BlockQuantisedSum, DrawInBlock): for every t in [0, T) that matters
// (each prefix value, the one below it, random ones) the block found by the largest block
// prefix <= t and DrawInBlock give the definition's draw, the i with prefix[i] <= t <
// prefix[i + 1] on the full prefix sums (reference::QuantisedPrefix).
TEST(PlanMathTest, BlockDrawsEqualTheFullPrefixDraws) {
  std::mt19937_64 rng(17);
  for (const std::string kind : {"random", "ties", "zeros", "extreme"}) {
    for (const uint64_t n : {1, 2, 7, 8, 9, 16, 17, 1000, 4099}) {
      SCOPED_TRACE(kind + " n=" + std::to_string(n));
      std::vector<float> w = PatternWeights(kind, n, static_cast<uint32_t>(n));
      if (kind == "zeros" && n > 20) {
        std::fill(w.begin() + 8, w.begin() + 20, 0.0f);  // Whole blocks of zeros too.
      }
      const std::vector<uint64_t> prefix = reference::QuantisedPrefix(w.data(), n);
      uint32_t max_bits = 0;
      for (float x : w) max_bits = std::max(max_bits, weight_math::SummaryBits(x));
      const double scale = plan_math::QuantisationScale(n, max_bits);
      const uint64_t blocks = plan_math::DrawBlocks(n);
      std::vector<uint64_t> block_prefix(blocks + 1, 0);
      for (uint64_t b = 0; b < blocks; ++b) {
        block_prefix[b + 1] = block_prefix[b] + plan_math::BlockQuantisedSum(w.data(), n, scale, b);
        ASSERT_EQ(block_prefix[b + 1], prefix[std::min(n, (b + 1) * plan_math::kDrawBlock)]) << b;
      }
      EXPECT_EQ(plan_math::BlockQuantisedSum(w.data(), n, scale, blocks), 0u);
      const uint64_t total = prefix[n];
      std::vector<uint64_t> ts;
      for (const uint64_t v : prefix) {
        if (v < total) ts.push_back(v);
        if (v > 0 && v - 1 < total) ts.push_back(v - 1);
      }
      for (int k = 0; k < 1000; ++k) ts.push_back(MulHi64(rng(), total));
      for (const uint64_t t : ts) {
        const uint64_t want =
            static_cast<uint64_t>(std::upper_bound(prefix.begin(), prefix.end(), t) -
                                  prefix.begin()) -
            1;
        const uint64_t b =
            static_cast<uint64_t>(std::upper_bound(block_prefix.begin(), block_prefix.end(), t) -
                                  block_prefix.begin()) -
            1;
        ASSERT_EQ(plan_math::DrawInBlock(w.data(), n, scale, b, block_prefix[b], t), want)
            << "t=" << t;
        ASSERT_GT(w[want], 0.0f);
      }
    }
  }
}

// The device's layout of the loss statistics (DeviceLossStats) holds exactly the
// SampleLossStats: Split then Join gives the same bytes, the bits say count > 0 and
// EmaDefined, and splitting in pieces of a multiple of 32 samples (CudaLossStats::Restore) gives
// the same arrays as one split.
TEST(LossStatsLayoutTest, SplitAndJoinKeepEveryByte) {
  for (const uint64_t n : {1, 31, 32, 33, 1000, 4097}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<SampleLossStats> stats = VariedStats(n, 7, EpochMarker(3));
    if (n > 2) {
      stats[1] = {std::numeric_limits<float>::quiet_NaN(), 0, 0};  // Never seen, junk EMA.
      stats[2] = {0.25f, 0, 9};  // Restored with a marker but no count: defined, not seen.
    }
    const uint64_t words = LossStatsWords(n);
    std::vector<float> ema(n);
    std::vector<uint32_t> meta(n), seen(words), defined(words);
    SplitLossStats(stats.data(), n, ema.data(), meta.data(), seen.data(), defined.data());
    std::vector<SampleLossStats> back(n);
    JoinLossStats(ema.data(), meta.data(), n, back.data());
    ASSERT_EQ(std::memcmp(back.data(), stats.data(), n * sizeof(SampleLossStats)), 0);
    for (uint64_t i = 0; i < n; ++i) {
      const bool seen_bit = (seen[i / 32] >> (i % 32)) & 1,
                 defined_bit = (defined[i / 32] >> (i % 32)) & 1;
      ASSERT_EQ(seen_bit, stats[i].count > 0) << i;
      ASSERT_EQ(defined_bit, weight_math::EmaDefined(stats[i].count, stats[i].last_epoch)) << i;
    }
    const uint64_t piece = 64;
    std::vector<float> ema2(n);
    std::vector<uint32_t> meta2(n), seen2(words), defined2(words);
    for (uint64_t first = 0; first < n; first += piece) {
      const uint64_t count = std::min(piece, n - first);
      SplitLossStats(stats.data() + first, count, ema2.data() + first, meta2.data() + first,
                     seen2.data() + first / 32, defined2.data() + first / 32);
    }
    EXPECT_EQ(std::memcmp(ema2.data(), ema.data(), n * sizeof(float)), 0);
    EXPECT_EQ(meta2, meta);
    EXPECT_EQ(seen2, seen);
    EXPECT_EQ(defined2, defined);
    EXPECT_EQ(LossStatsBytes(n), 8 * n + 8 * words);
  }
}

TEST(ReferenceTest, ShuffleIsAPermutationWithTheNewRule) {
  for (uint64_t m : {1ull, 2ull, 1024ull, 1025ull, 100000ull}) {
    std::vector<uint64_t> inputs(m);
    for (uint64_t k = 0; k < m; ++k) inputs[k] = 3 * k;
    std::vector<uint64_t> out = reference::Shuffle(1, 2, inputs, plan_math::ShuffleBucketBits(m));
    ASSERT_EQ(out.size(), m);
    if (m > 100) {
      EXPECT_NE(out, inputs);  // Not the identity.
    }
    std::sort(out.begin(), out.end());
    EXPECT_EQ(out, inputs);
  }
}

// ---- Weights: the recompute, the summary, applied losses, importance weights
// ----------------------

// The CPU backend's RecomputeWeights through its handles (compute_backend.h).
std::vector<float> CpuRecompute(ComputeBackend& cpu, const WeightPolicyParams& policy,
                                uint64_t closed_epoch, const std::vector<float>& base,
                                const std::vector<float>& current,
                                const std::vector<SampleLossStats>& stats) {
  std::shared_ptr<const BackendWeights> base_handle, current_handle;
  if (!base.empty()) {
    auto made = cpu.MakeWeights(base);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return {};
    base_handle = *made;
  }
  if (!current.empty()) {
    auto made = cpu.MakeWeights(current);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return {};
    current_handle = *made;
  }
  auto loss_stats = cpu.NewLossStats(stats.size(), 0.9);
  EXPECT_TRUE(loss_stats.ok()) << loss_stats.status();
  if (!loss_stats.ok()) return {};
  const absl::Status restored = (*loss_stats)->Restore(stats);
  EXPECT_TRUE(restored.ok()) << restored;
  auto out = cpu.RecomputeWeights(policy, closed_epoch, base_handle.get(), current_handle.get(),
                                  loss_stats->get());
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  auto host = (*out)->ToHost();
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? **host : std::vector<float>();
}

// Doubles in [0, 1) from a 64-bit LCG seeded with `state`: the randomised rounds' parameters.
std::function<double()> UnitStream(uint64_t state) {
  return [state]() mutable {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0;
  };
}

// reference::RecomputeWeights (what the device is compared with) == the CPU backend, bit for
// bit: both policies, random parameters, sizes around the chunk (4096) and the CPU's groups
// (65536), with and without base and current weights, nothing seen, everything seen.
TEST(ReferenceTest, RecomputeEqualsTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  std::function<double()> next = UnitStream(5);
  const uint64_t sizes[] = {1, 2, 513, 4095, 4096, 4097, 65537, 140001};
  const uint64_t closed_epoch = 5;
  for (int round = 0; round < 48; ++round) {
    const uint64_t n = sizes[round % 8];
    const WeightPolicyParams policy = testutil::RandomLossPolicy(round, next);
    std::vector<float> base = round % 2 ? PatternWeights("zeros", n, round) : std::vector<float>();
    std::vector<float> current = round % 4 == 1
                                     ? std::vector<float>()
                                     : PatternWeights(round % 3 ? "random" : "extreme", n, 99);
    std::vector<SampleLossStats> stats = VariedStats(n, round, EpochMarker(closed_epoch));
    if (round % 8 == 5) stats.assign(n, SampleLossStats{});  // Nothing seen yet.
    if (round % 8 == 6) {  // Everything seen, in the closed epoch.
      for (SampleLossStats& s : stats) s = {0.25f + (&s - stats.data()) % 3, 2, EpochMarker(5)};
    }
    const RecomputeParams params = DeviceRecomputeParams(policy, closed_epoch);
    const reference::Recomputed want =
        reference::RecomputeWeights(params, n, base.empty() ? nullptr : base.data(),
                                    current.empty() ? nullptr : current.data(), stats.data());
    ASSERT_EQ(want.weights.size(), n) << "round " << round << ": the check failed";
    const std::vector<float> got = CpuRecompute(*cpu, policy, closed_epoch, base, current, stats);
    ASSERT_EQ(got.size(), n) << "round " << round;
    ASSERT_EQ(std::memcmp(got.data(), want.weights.data(), n * sizeof(float)), 0)
        << "round " << round << ", n " << n;
  }
}

// Loss within groups: reference::RecomputeWeights == the CPU backend, bit for bit, with class
// balanced bases of skewed classes (some of equal count: one group), uploaded weights with zeros
// (many groups), sizes around the chunk and past the CPU's per-thread split.
TEST(ReferenceTest, RecomputeWithinGroupsEqualsTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(3);
  std::function<double()> next = UnitStream(11);
  const uint64_t sizes[] = {1, 7, 513, 4097, 65537, 140001};
  const uint64_t closed_epoch = 3;
  for (int round = 0; round < 24; ++round) {
    const uint64_t n = sizes[round % 6];
    WeightPolicyParams policy = testutil::RandomLossPolicy(3 * round, next);  // kLoss.
    policy.base = BaseWeightKind::kClassBalanced;
    policy.loss_within_groups = true;
    std::vector<float> base(n);
    if (round % 3 == 2) {
      // Uploaded weights: up to 997 distinct values and some zeros (excluded samples).
      for (uint64_t i = 0; i < n; ++i) {
        base[i] = i % 17 == 5 ? 0.0f : static_cast<float>(1 + (i * 2654435761u) % 997) / 64;
      }
    } else {
      std::vector<uint32_t> labels(n);
      for (uint64_t i = 0; i < n; ++i) labels[i] = static_cast<uint32_t>((i * i + round) % 13);
      ASSERT_TRUE(ClassBalancedWeights(labels, 0.0, absl::MakeSpan(base)).ok());
    }
    std::vector<SampleLossStats> stats = VariedStats(n, round, EpochMarker(closed_epoch));
    if (round % 6 == 4) stats.assign(n, SampleLossStats{});  // Nothing seen yet.
    const RecomputeParams params = DeviceRecomputeParams(policy, closed_epoch);
    ASSERT_TRUE(params.within_groups);
    const reference::Recomputed want =
        reference::RecomputeWeights(params, n, base.data(), nullptr, stats.data());
    ASSERT_EQ(want.weights.size(), n) << "round " << round << ": the check failed";
    const std::vector<float> got = CpuRecompute(*cpu, policy, closed_epoch, base, {}, stats);
    ASSERT_EQ(got.size(), n) << "round " << round;
    ASSERT_EQ(std::memcmp(got.data(), want.weights.data(), n * sizeof(float)), 0)
        << "round " << round << ", n " << n;
  }
}

// Irreducible losses for n samples: zeros, values around the EMAs of VariedStats ([0.1, 4.1)),
// above them (the reducible loss clamps at 0), tiny and huge ones.
std::vector<float> IrreducibleLosses(uint64_t n, uint64_t seed) {
  const std::vector<float> u = testutil::RandomWeights(n, seed, 0.0);  // [0.1, 4.1)
  std::vector<float> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    switch (i % 7) {
      case 0:
        out[i] = 0.0f;
        break;
      case 1:
        out[i] = 1e-30f * u[i];
        break;
      case 2:
        out[i] = 1e30f * u[i];
        break;
      default:
        out[i] = u[i];
    }
  }
  return out;
}

// The CPU backend's recompute through RecomputeWeightsOnHost (which takes the irreducible
// losses), or an empty vector if it failed.
std::vector<float> HostRecompute(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                 const std::vector<float>& base,
                                 const std::vector<SampleLossStats>& stats,
                                 const std::vector<float>& irreducible, int threads) {
  std::vector<float> out(stats.size());
  const absl::Status s = RecomputeWeightsOnHost(threads, policy, closed_epoch, base, {}, stats,
                                                absl::MakeSpan(out), irreducible);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? out : std::vector<float>();
}

// REDUCIBLE_LOSS: reference::RecomputeWeights == the CPU backend, bit for bit, with random
// parameters, with and without base weights (class-balanced, uploaded with zeros), within
// groups, with the effective sample size floor, nothing seen, sizes around the chunk and the
// CPU's groups.
TEST(ReferenceTest, ReducibleLossEqualsTheCpuBackend) {
  std::function<double()> next = UnitStream(17);
  const uint64_t sizes[] = {1, 2, 513, 4097, 65537, 140001};
  const uint64_t closed_epoch = 5;
  for (int round = 0; round < 36; ++round) {
    const uint64_t n = sizes[round % 6];
    WeightPolicyParams policy = testutil::RandomLossPolicy(3 * round, next);  // kLoss.
    policy.loss = LossWeightKind::kReducibleLoss;
    std::vector<float> base;
    if (round % 3 == 1) {
      std::vector<uint32_t> labels(n);
      for (uint64_t i = 0; i < n; ++i) labels[i] = static_cast<uint32_t>((i * i + round) % 13);
      base.resize(n);
      ASSERT_TRUE(ClassBalancedWeights(labels, 0.0, absl::MakeSpan(base)).ok());
      policy.base = BaseWeightKind::kClassBalanced;
      policy.loss_within_groups = round % 2 == 0;
    } else if (round % 3 == 2) {
      base = PatternWeights("zeros", n, round);
      policy.base = BaseWeightKind::kStatic;
    }
    if (round % 4 == 3) policy.min_effective_fraction = 0.2 + 0.8 * next();
    std::vector<SampleLossStats> stats = VariedStats(n, round, EpochMarker(closed_epoch));
    if (round % 9 == 4) stats.assign(n, SampleLossStats{});  // Nothing seen yet.
    const std::vector<float> irreducible = IrreducibleLosses(n, 100 + round);
    RecomputeParams params = DeviceRecomputeParams(policy, closed_epoch);
    params.irreducible = irreducible.data();
    LossGroupTable groups;
    if (params.within_groups) {
      ASSERT_TRUE(FindLossGroups(base.data(), n, kMaxLossGroups, &groups));
      params.group_keys = groups.keys.data();
      params.group_counts = groups.counts.data();
      params.num_groups = groups.size();
    }
    const reference::Recomputed want = reference::RecomputeWeights(
        params, n, base.empty() ? nullptr : base.data(), nullptr, stats.data());
    ASSERT_EQ(want.weights.size(), n) << "round " << round << ": the check failed";
    const std::vector<float> got =
        HostRecompute(policy, closed_epoch, base, stats, irreducible, 1 + round % 3);
    ASSERT_EQ(got.size(), n) << "round " << round;
    ASSERT_EQ(std::memcmp(got.data(), want.weights.data(), n * sizeof(float)), 0)
        << "round " << round << ", n " << n;
  }
}

// Irreducible losses of 0 (either sign) make REDUCIBLE_LOSS the LOSS policy, bit for bit
// (docs/SAMPLING.md): max(ema - 0, 0) is the EMA, -0 as +0.
TEST(ReferenceTest, ZeroIrreducibleLossesAreTheLossPolicy) {
  std::function<double()> next = UnitStream(23);
  for (int round = 0; round < 6; ++round) {
    const uint64_t n = round % 2 ? 4097 : 513;
    WeightPolicyParams policy = testutil::RandomLossPolicy(3 * round, next);  // kLoss.
    const std::vector<SampleLossStats> stats = VariedStats(n, round, EpochMarker(5));
    const std::vector<float> loss = HostRecompute(policy, 5, {}, stats, {}, 2);
    std::vector<float> zeros(n, 0.0f);
    for (uint64_t i = 0; i < n; i += 3) zeros[i] = -0.0f;
    policy.loss = LossWeightKind::kReducibleLoss;
    const std::vector<float> reducible = HostRecompute(policy, 5, {}, stats, zeros, 2);
    ASSERT_EQ(loss.size(), n);
    ASSERT_EQ(reducible.size(), n);
    EXPECT_EQ(std::memcmp(loss.data(), reducible.data(), n * sizeof(float)), 0) << round;
  }
}

// The effective sample size floor: peaked LOSS weights (alpha 8) whose ESS is far below the
// floor without it; with it the weights meet the floor, and the reference computes the same
// bits (the same bisection on the same sums).
TEST(ReferenceTest, EssFloorIsMetAndEqualsTheReference) {
  const uint64_t n = 20001, closed_epoch = 2;
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) {
    stats[i] = {static_cast<float>(1 + (i * 2654435761u) % 1000) / 100, 1, EpochMarker(2)};
  }
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kReducibleLoss}) {
    WeightPolicyParams policy;
    policy.loss = kind;
    policy.alpha = 8;
    policy.clamp_lo = 0.001;
    policy.clamp_hi = 1000;
    const std::vector<float> irreducible =
        kind == LossWeightKind::kReducibleLoss ? std::vector<float>(n, 0.5f) : std::vector<float>();
    const std::vector<float> without = HostRecompute(policy, closed_epoch, {}, stats, irreducible, 2);
    ASSERT_EQ(without.size(), n);
    const double ess_without = samplerd::SummarizeWeights(without).effective_sample_size;
    for (double fraction : {0.3, 0.95, 1.0}) {
      ASSERT_LT(ess_without, fraction * n) << "the floor would not be needed";
      policy.min_effective_fraction = fraction;
      const std::vector<float> got = HostRecompute(policy, closed_epoch, {}, stats, irreducible, 3);
      ASSERT_EQ(got.size(), n);
      const double ess = samplerd::SummarizeWeights(got).effective_sample_size;
      EXPECT_GE(ess, fraction * n) << "fraction " << fraction;
      // Close to the floor (the smallest mix that meets it, within the bisection's 2^-20),
      // unless the floor is 1 (only mix = 1 meets it: all weights equal).
      if (fraction < 1) EXPECT_LT(ess, (fraction + 0.01) * n) << "fraction " << fraction;
      RecomputeParams params = DeviceRecomputeParams(policy, closed_epoch);
      params.irreducible = irreducible.empty() ? nullptr : irreducible.data();
      const reference::Recomputed want =
          reference::RecomputeWeights(params, n, nullptr, nullptr, stats.data());
      ASSERT_EQ(want.weights.size(), n);
      EXPECT_EQ(std::memcmp(got.data(), want.weights.data(), n * sizeof(float)), 0)
          << "fraction " << fraction;
    }
  }
}

// The reference's check finds what the CPU backend rejects: the lowest bad index (whatever the
// field), an all-zero base.
TEST(ReferenceTest, RecomputeCheckFindsWhatTheCpuBackendRejects) {
  const uint64_t n = 10000;
  std::vector<float> base(n, 1.0f);
  std::vector<SampleLossStats> stats(n, SampleLossStats{1.0f, 1, 1});
  base[7000] = -1.0f;
  stats[9000].ema_loss = std::numeric_limits<float>::quiet_NaN();
  stats[100] = {std::numeric_limits<float>::quiet_NaN(), 0, 0};  // Undefined: not an error.
  RecomputeParams params;
  reference::Recomputed r =
      reference::RecomputeWeights(params, n, base.data(), nullptr, stats.data());
  EXPECT_EQ(r.check.first_bad, 7000u);
  EXPECT_TRUE(r.weights.empty());
  base[7000] = 1.0f;
  r = reference::RecomputeWeights(params, n, base.data(), nullptr, stats.data());
  EXPECT_EQ(r.check.first_bad, 9000u);
  stats[9000].ema_loss = 1.0f;
  std::vector<float> zeros(n, 0.0f);
  r = reference::RecomputeWeights(params, n, zeros.data(), nullptr, stats.data());
  EXPECT_EQ(r.check.first_bad, ~uint64_t{0});
  EXPECT_FALSE(r.check.base_positive);
  EXPECT_TRUE(r.weights.empty());
  // The CPU backend refuses the same statistics, naming the sample.
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  stats[9000].ema_loss = -2.0f;
  auto loss_stats = cpu->NewLossStats(n, 0.9);
  ASSERT_TRUE(loss_stats.ok());
  const absl::Status restored = (*loss_stats)->Restore(stats);
  WeightPolicyParams policy;
  policy.loss = LossWeightKind::kLoss;
  if (restored.ok()) {
    auto out = cpu->RecomputeWeights(policy, 5, nullptr, nullptr, loss_stats->get());
    EXPECT_FALSE(out.ok());
    EXPECT_NE(std::string(out.status().message()).find("stats[9000]"), std::string::npos)
        << out.status();
  }
  r = reference::RecomputeWeights(params, n, nullptr, nullptr, stats.data());
  EXPECT_EQ(r.check.first_bad, 9000u);
}

// The summary of the CPU backend's weights (BackendWeights::summary) == the reference's.
TEST(ReferenceTest, SummaryEqualsTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  for (uint64_t n : {1ull, 4095ull, 4097ull, 70000ull}) {
    for (const char* kind : {"random", "ties", "zeros", "extreme"}) {
      std::vector<float> w = PatternWeights(kind, n, 3);
      if (std::string(kind) == "zeros" && n > 2) w[2] = -0.0f;  // -0 is a zero like +0.
      auto made = cpu->MakeWeights(w);
      ASSERT_TRUE(made.ok()) << made.status();
      const WeightSummary& got = (*made)->summary();
      const WeightSummaryValues want = reference::SummarizeWeights(w.data(), n);
      const std::string where = std::string(kind) + " n " + std::to_string(n);
      auto same = [](double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; };
      EXPECT_TRUE(same(got.min, want.min)) << where << ": " << got.min << " vs " << want.min;
      EXPECT_TRUE(same(got.max, want.max)) << where;
      EXPECT_TRUE(same(got.mean, want.mean)) << where << ": " << got.mean << " vs " << want.mean;
      EXPECT_TRUE(same(got.effective_sample_size, want.effective_sample_size)) << where;
      EXPECT_EQ(got.zero_count, want.zero_count) << where;
    }
  }
}

// Losses applied by the CPU backend (distinct indices: no duplicates to drop) == ApplyLoss one
// by one, which is what the device's ApplyLosses applies; importance weights == 1.0f / w.
TEST(ReferenceTest, AppliedLossesAndImportanceEqualTheCpuBackend) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(2);
  const uint64_t n = 5000;
  const double decay = 0.9;
  auto loss_stats = cpu->NewLossStats(n, decay);
  ASSERT_TRUE(loss_stats.ok());
  std::vector<SampleLossStats> want(n);
  std::mt19937_64 rng(8);
  for (uint64_t epoch : {0ull, 1ull, 2ull, 70000ull}) {
    std::vector<uint64_t> indices;
    std::vector<float> losses;
    for (uint64_t i = 0; i < n; ++i) {
      if (rng() % 3 == 0) continue;
      indices.push_back(i);
      losses.push_back(static_cast<float>(rng() % 1000) / 7.0f);
    }
    std::shuffle(indices.begin(), indices.end(), rng);
    auto applied = (*loss_stats)->Apply(epoch, indices, losses);
    ASSERT_TRUE(applied.ok()) << applied.status();
    EXPECT_EQ(*applied, indices.size());
    reference::ApplyLosses(want, indices, losses, EpochMarker(epoch), static_cast<float>(decay));
  }
  auto got = (*loss_stats)->ToHost();
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), n);
  EXPECT_EQ(std::memcmp(got->data(), want.data(), n * sizeof(SampleLossStats)), 0);

  const std::vector<float> w = PatternWeights("extreme", n, 4);
  auto weights = cpu->MakeWeights(w);
  ASSERT_TRUE(weights.ok());
  std::vector<uint64_t> indices(777);
  for (uint64_t& i : indices) i = rng() % n;
  std::vector<float> out(indices.size());
  ASSERT_TRUE(cpu->ImportanceWeights(**weights, indices, absl::MakeSpan(out)).ok());
  const std::vector<float> ref = reference::GatherImportance(w.data(), indices);
  EXPECT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd
