// The apportionment (apportion.h) against its definition and bounds (docs/SAMPLING.md,
// "Mixture jobs"): exact shares, windows that add up to M, counts within one sample of the
// cumulative target with constant weights, the bounds under changing weights, zero weights,
// K = 10^6, the state's restore, and bad input.
#include "kernels/mixture/apportion.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/philox.h"

namespace samplerd {
namespace mixture {
namespace {

using ::testing::HasSubstr;

constexpr int128 kUnit = static_cast<int128>(kShareUnit);

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

// Random weights from a fixed stream: some 0, spread over several orders of magnitude.
std::vector<double> RandomWeights(uint64_t k, uint64_t seed, bool zeros) {
  std::vector<double> w(k);
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t r = RandomBits64(seed, 0, RandomStream::kDraw, i);
    w[i] = zeros && r % 5 == 0 ? 0.0 : std::ldexp(static_cast<double>(r >> 40) + 1, -(int)(r % 13));
  }
  bool any = false;
  for (double x : w) any = any || x > 0;
  if (!any) w[0] = 1.0;  // Never all zero.
  return w;
}

TEST(SharesTest, ExactForPowersOfTwo) {
  auto shares = SharesOf({1.0, 1.0, 2.0});
  ASSERT_TRUE(shares.ok()) << shares.status();
  EXPECT_EQ(*shares, (std::vector<uint64_t>{kShareUnit / 4, kShareUnit / 4, kShareUnit / 2}));
  shares = SharesOf({0.0, 3.5e-300, 0.0});  // One positive weight: it holds everything.
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(*shares, (std::vector<uint64_t>{0, kShareUnit, 0}));
}

TEST(SharesTest, LargestRemainderWithTiesToTheLowerGroup) {
  // Thirds: D = 3 floor(D / 3) + 2, so two units are left; the remainders tie, groups 0 and 1
  // take them.
  auto shares = SharesOf({1.0, 1.0, 1.0});
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(*shares,
            (std::vector<uint64_t>{kShareUnit / 3 + 1, kShareUnit / 3 + 1, kShareUnit / 3}));
  // -0 is a zero weight.
  shares = SharesOf({-0.0, 2.0});
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(*shares, (std::vector<uint64_t>{0, kShareUnit}));
}

TEST(SharesTest, AddUpToDAndFollowTheWeights) {
  for (uint64_t k : {1ull, 2ull, 7ull, 1000ull, 100000ull}) {
    const std::vector<double> w = RandomWeights(k, k, /*zeros=*/true);
    auto shares = SharesOf(w);
    ASSERT_TRUE(shares.ok()) << shares.status();
    unsigned __int128 total = 0;
    double wsum = 0;
    for (double x : w) wsum += x;
    for (uint64_t i = 0; i < k; ++i) {
      total += (*shares)[i];
      if (w[i] == 0) EXPECT_EQ((*shares)[i], 0u) << i;
      // The bound of apportion.h is (K + 2) 2^-(93 - BitWidth(K)); doubles' own rounding of
      // w_i / sum is ~1e-16 relative, far above it, so this checks ~1e-12.
      EXPECT_NEAR(std::ldexp(static_cast<double>((*shares)[i]), -63), w[i] / wsum, 1e-12) << i;
    }
    EXPECT_TRUE(total == static_cast<unsigned __int128>(kShareUnit)) << k;
  }
}

TEST(SharesTest, AWeightBelow2ToTheMinus63OfTheTotalMayGetNoShare) {
  // q = (2^92, 1) (the tiny weight rounds up to 1), Q = 2^92 + 1: floors (2^63 - 1, 0) with
  // remainders (2^92 - 2^63 + 1, 2^63); the one unit left goes to group 0.
  auto shares = SharesOf({1.0, 1e-300});
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(*shares, (std::vector<uint64_t>{kShareUnit, 0}));
  // Within 2^-63 of the total it keeps its share: 2^-40 gets D 2^-40 / (1 + 2^-40), floored.
  shares = SharesOf({1.0, std::ldexp(1.0, -40)});
  ASSERT_TRUE(shares.ok());
  EXPECT_GT((*shares)[1], 0u);
  EXPECT_EQ(Sum(*shares), kShareUnit);
}

TEST(SharesTest, BadWeightsNameTheIndexAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<double> weights;
    std::string message;
  } cases[] = {
      {{1.0, -0.5}, "weights[1] = -0.5: a group weight must be finite and >= 0"},
      {{nan}, "weights[0] = nan"},
      {{1.0, 2.0, inf}, "weights[2] = inf"},
      {{0.0, 0.0}, "all 2 group weights are 0"},
      {{}, "weights: 0 group weights"},
  };
  for (const Case& c : cases) {
    auto shares = SharesOf(c.weights);
    ASSERT_FALSE(shares.ok());
    EXPECT_EQ(shares.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(shares.status().message()), HasSubstr(c.message));
  }
  EXPECT_FALSE(SharesOf(std::vector<double>(kMaxGroups + 1, 1.0)).ok());
}

// Cumulative exact targets in units of 1/D, to check |C_k - target_k| < 1 exactly.
struct Tracker {
  std::vector<int128> target;  // sum_t M_t p_k^(t).
  std::vector<uint64_t> count;

  explicit Tracker(uint64_t k) : target(k, 0), count(k, 0) {}
  void Add(const std::vector<uint64_t>& shares, uint64_t m, const WindowCounts& c) {
    for (size_t k = 0; k < shares.size(); ++k) {
      target[k] += static_cast<int128>(m) * shares[k];
      count[k] += c.counts[k];
    }
  }
  int128 Lag(size_t k) const { return target[k] - static_cast<int128>(count[k]) * kUnit; }
};

// Checks one window's proven bounds (apportion.h) on every group and returns the largest lag.
double CheckWindow(const Apportioner& a, const Tracker& tracker, const std::vector<int128>& before,
                   const std::vector<uint64_t>& shares, const WindowCounts& c, uint64_t m) {
  const uint64_t k = shares.size();
  EXPECT_EQ(Sum(c.counts), m);
  double largest = -1;
  for (uint64_t i = 0; i < k; ++i) {
    const int128 lag = tracker.Lag(i);
    EXPECT_TRUE(lag == a.lags()[i]);
    EXPECT_TRUE(lag > -kUnit) << "group " << i;  // Never a whole sample ahead.
    if (c.taken_back == 0) EXPECT_TRUE(lag < kUnit) << "group " << i;
    EXPECT_TRUE(k == 1 || lag < static_cast<int128>(k - 1) * kUnit);
    // A group of share 0 gets samples only while behind its target.
    if (shares[i] == 0 && c.counts[i] > 0) EXPECT_TRUE(before[i] > 0) << "group " << i;
    largest = std::max(largest, std::ldexp(static_cast<double>(lag), -63));
  }
  return largest;
}

TEST(ApportionTest, ConstantWeights) {
  // Random K, weights (some 0) and M (windows below K too): 10^6 windows in all. The lags stay
  // in (-1, 1) sample after every window without a take-back; take-backs are rare and the
  // largest lag measured is printed (and held below 2 samples: a measured bound, not proven).
  uint64_t windows = 0, taken_back_windows = 0;
  double largest = -1;
  for (uint64_t trial = 0; trial < 400; ++trial) {
    const uint64_t r = RandomBits64(trial, 1, RandomStream::kDraw, 0);
    const uint64_t k = 1 + r % 60;
    const uint64_t m = 1 + (r >> 8) % (trial % 2 == 0 ? 7 : 1000);
    const std::vector<double> w = RandomWeights(k, trial, /*zeros=*/true);
    auto shares = SharesOf(w);
    ASSERT_TRUE(shares.ok());
    auto a = Apportioner::Create(k);
    ASSERT_TRUE(a.ok());
    Tracker tracker(k);
    for (uint64_t t = 0; t < 2500; ++t, ++windows) {
      const std::vector<int128> before = a->lags();
      auto c = a->Next(*shares, m);
      ASSERT_TRUE(c.ok());
      tracker.Add(*shares, m, *c);
      taken_back_windows += c->taken_back > 0;
      largest = std::max(largest, CheckWindow(*a, tracker, before, *shares, *c, m));
      if (HasFailure()) FAIL() << "trial " << trial << " window " << t;
    }
  }
  EXPECT_EQ(windows, 1000000u);
  EXPECT_LT(largest, 2.0);
  std::printf("constant weights: %llu of %llu windows took back; largest lag %.4f samples\n",
              static_cast<unsigned long long>(taken_back_windows),
              static_cast<unsigned long long>(windows), largest);
}

TEST(ApportionTest, ChangingWeights) {
  // Weights redrawn every few windows, sometimes to 0 (a group ahead of its target loses its
  // share: the take-back case). The proven bounds hold after every window.
  uint64_t taken_back_windows = 0;
  double largest = -1;
  for (uint64_t trial = 0; trial < 300; ++trial) {
    const uint64_t k = 2 + trial % 9;
    auto a = Apportioner::Create(k);
    ASSERT_TRUE(a.ok());
    Tracker tracker(k);
    std::vector<uint64_t> shares;
    for (uint64_t t = 0; t < 400; ++t) {
      const uint64_t r = RandomBits64(trial, 2, RandomStream::kDraw, t);
      if (t % (1 + trial % 4) == 0) {
        auto s = SharesOf(RandomWeights(k, r, /*zeros=*/true));
        ASSERT_TRUE(s.ok());
        shares = *s;
      }
      const uint64_t m = 1 + (r >> 20) % 5;
      const std::vector<int128> before = a->lags();
      auto c = a->Next(shares, m);
      ASSERT_TRUE(c.ok());
      tracker.Add(shares, m, *c);
      taken_back_windows += c->taken_back > 0;
      largest = std::max(largest, CheckWindow(*a, tracker, before, shares, *c, m));
      if (HasFailure()) FAIL() << "trial " << trial << " window " << t;
    }
  }
  std::printf("changing weights: %llu of 120000 windows took back; largest lag %.4f samples\n",
              static_cast<unsigned long long>(taken_back_windows), largest);
}

TEST(ApportionTest, TakeBackWhenTwoGroupsAheadLoseTheirShare) {
  // Windows of 1 sample with 3 equal groups: groups 0 and 1 get the first two samples (ties to
  // the lower number), each 2/3 of a sample ahead. Then all weight goes to group 2 and a window
  // of 2: a = (-2/3, -2/3, 1/3 + 2) D... base = (0, 0, 2): S = 2 = M, no take-back yet.
  auto a = Apportioner::Create(3);
  ASSERT_TRUE(a.ok());
  auto thirds = SharesOf({1.0, 1.0, 1.0});
  ASSERT_TRUE(thirds.ok());
  auto c = a->Next(*thirds, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->counts, (std::vector<uint64_t>{1, 0, 0}));
  c = a->Next(*thirds, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->counts, (std::vector<uint64_t>{0, 1, 0}));
  auto last = SharesOf({0.0, 0.0, 1.0});
  ASSERT_TRUE(last.ok());
  c = a->Next(*last, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->counts, (std::vector<uint64_t>{0, 0, 2}));
  EXPECT_EQ(c->taken_back, 0u);
}

TEST(ApportionTest, GoldenCounts) {
  auto shares = SharesOf({3.0, 1.0, 0.0, 2.5, 0.125});
  ASSERT_TRUE(shares.ok());
  auto a = Apportioner::Create(5);
  ASSERT_TRUE(a.ok());
  std::vector<uint64_t> got;
  for (uint64_t m : {10ull, 10ull, 3ull, 1000ull}) {
    auto c = a->Next(*shares, m);
    ASSERT_TRUE(c.ok());
    got.insert(got.end(), c->counts.begin(), c->counts.end());
  }
  EXPECT_EQ(got, (std::vector<uint64_t>{5, 1, 0, 4, 0, 4,   2,   0, 4,   0,
                                        1, 1, 0, 1, 0, 453, 151, 0, 377, 19}));
}

TEST(ApportionTest, AMillionGroups) {
  constexpr uint64_t kGroups = kMaxGroups;
  const std::vector<double> w = RandomWeights(kGroups, 99, /*zeros=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  auto shares = SharesOf(w);
  ASSERT_TRUE(shares.ok());
  const auto t1 = std::chrono::steady_clock::now();
  auto a = Apportioner::Create(kGroups);
  ASSERT_TRUE(a.ok());
  auto c = a->Next(*shares, 10000000);
  ASSERT_TRUE(c.ok());
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(Sum(c->counts), 10000000u);
  std::printf("K = 10^6: shares %.3f s, one window of 10^7 %.3f s (not asserted)\n",
              std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
}

TEST(ApportionTest, BadInputChangesNothing) {
  auto a = Apportioner::Create(3);
  ASSERT_TRUE(a.ok());
  auto shares = SharesOf({1.0, 2.0, 3.0});
  ASSERT_TRUE(shares.ok());
  ASSERT_TRUE(a->Next(*shares, 5).ok());
  const std::vector<int128> before = a->lags();

  auto c = a->Next({kShareUnit, 0}, 5);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("shares: 2 shares for a mixture of 3"));
  c = a->Next({kShareUnit, 1, 0}, 5);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not 2^63"));
  c = a->Next(*shares, kShareUnit + 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("window_size: 9223372036854775809"));
  EXPECT_TRUE(a->lags() == before);

  EXPECT_THAT(std::string(Apportioner::Create(0).status().message()), HasSubstr("groups: 0"));
  EXPECT_THAT(std::string(Apportioner::Create(kMaxGroups + 1).status().message()),
              HasSubstr("groups: 1000001"));
}

TEST(ApportionTest, RestoresSavedLagsAndRefusesCorruptOnes) {
  auto a = Apportioner::Create(4);
  ASSERT_TRUE(a.ok());
  auto shares = SharesOf({1.0, 2.0, 3.0, 0.5});
  ASSERT_TRUE(shares.ok());
  for (int t = 0; t < 7; ++t) ASSERT_TRUE(a->Next(*shares, 3).ok());
  auto restored = Apportioner::FromLags(a->lags());
  ASSERT_TRUE(restored.ok()) << restored.status();
  for (int t = 0; t < 20; ++t) {
    auto x = a->Next(*shares, 5), y = restored->Next(*shares, 5);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->counts, y->counts);
  }
  auto bad = Apportioner::FromLags({3 * kUnit, -kUnit + 1, -kUnit + 1, -kUnit - 2});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  bad = Apportioner::FromLags({-kUnit, kUnit});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("lags[0] = -9223372036854775808"));
  bad = Apportioner::FromLags({5, 0, 0});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("they add up to 5, not 0"));
}

}  // namespace
}  // namespace mixture
}  // namespace samplerd
