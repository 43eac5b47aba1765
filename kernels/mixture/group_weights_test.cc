#include "kernels/mixture/group_weights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_losses.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace mixture {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

GroupLayout Layout(std::vector<uint64_t> sizes) {
  absl::StatusOr<GroupLayout> layout = GroupLayout::Create(sizes);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// An epoch's statistics with the given mean loss for each group of a layout of one-sample groups
// (a NaN mean: no loss for that group).
GroupLosses EpochOf(const std::vector<double>& means) {
  const GroupLayout layout = Layout(std::vector<uint64_t>(means.size(), 1));
  GroupLosses out(static_cast<uint32_t>(means.size()));
  for (uint64_t k = 0; k < means.size(); ++k) {
    if (std::isnan(means[k])) continue;
    const float loss = static_cast<float>(means[k]);
    EXPECT_TRUE(out.Add(layout, {k}, {loss}).ok());
  }
  return out;
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& want) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message() << " / want: " << want;
}

TEST(GroupWeightsTest, NormalizeWeights) {
  absl::StatusOr<std::vector<double>> w = NormalizeWeights({1.0, 3.0, -0.0}, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<double>{0.25, 0.75, 0.0}));
  EXPECT_FALSE(std::signbit((*w)[2]));
  ExpectError(NormalizeWeights({1.0}, 2).status(), absl::StatusCode::kInvalidArgument,
              "weights: 1 weights for 2 groups");
  ExpectError(NormalizeWeights({1.0, -1.0}, 2).status(), absl::StatusCode::kInvalidArgument,
              "weights[1]");
  ExpectError(NormalizeWeights({1.0, kInf}, 2).status(), absl::StatusCode::kInvalidArgument,
              "weights[1]");
  ExpectError(NormalizeWeights({std::nan(""), 1.0}, 2).status(), absl::StatusCode::kInvalidArgument,
              "weights[0]");
  ExpectError(NormalizeWeights({0.0, 0.0}, 2).status(), absl::StatusCode::kInvalidArgument,
              "weights");
  // Finite weights whose sum overflows double: still their proportions.
  w = NormalizeWeights({1e308, 1e308, 0.0}, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<double>{0.5, 0.5, 0.0}));
  w = NormalizeWeights({std::numeric_limits<double>::max(), 0x1p1023, 0x1p1022}, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_GT((*w)[2], 0.0);
  EXPECT_DOUBLE_EQ((*w)[0] + (*w)[1] + (*w)[2], 1.0);
}

TEST(GroupWeightsTest, ProjectionByHand) {
  // clip(v - t, 0.2, 0.5) with t = -0.1: 0.5 (capped), 0.3 (free), 0.2 (raised).
  std::vector<double> v = {0.7, 0.2, 0.1};
  ProjectOntoBounds({0, 1, 2}, 1.0, 0.2, 0.5, absl::MakeSpan(v));
  EXPECT_DOUBLE_EQ(v[0], 0.5);
  EXPECT_DOUBLE_EQ(v[1], 0.3);
  EXPECT_DOUBLE_EQ(v[2], 0.2);
  // Within the bounds already: unchanged, bit for bit. Non-members untouched.
  std::vector<double> u = {0.3, 0.3, 0.4, 9.0};
  ProjectOntoBounds({0, 1, 2}, 1.0, 0.2, 0.5, absl::MakeSpan(u));
  EXPECT_EQ(u, (std::vector<double>{0.3, 0.3, 0.4, 9.0}));
  // No upper bound, a lower one: the deficit is taken evenly from the free entries.
  std::vector<double> x = {0.9, 0.1, 0.0};
  ProjectOntoBounds({0, 1, 2}, 1.0, 0.15, kInf, absl::MakeSpan(x));
  EXPECT_DOUBLE_EQ(x[0], 0.7);
  EXPECT_DOUBLE_EQ(x[1], 0.15);
  EXPECT_DOUBLE_EQ(x[2], 0.15);
}

TEST(GroupWeightsTest, ProjectionHoldsTheBoundsAndIsTheNearestPoint) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 3000; ++trial) {
    const uint32_t k = 1 + static_cast<uint32_t>(rng() % 40);
    std::vector<double> v(k);
    double sum = 0;
    for (double& x : v) {
      x = std::pow(unit(rng), 4.0);
      sum += x;
    }
    for (double& x : v) x /= sum;
    const double lo = unit(rng) / k;
    const double hi = trial % 5 == 0 ? kInf : (1.0 + 3.0 * unit(rng)) / k;
    std::vector<uint32_t> members(k);
    for (uint32_t i = 0; i < k; ++i) members[i] = i;
    std::vector<double> got = v;
    ProjectOntoBounds(members, 1.0, lo, hi, absl::MakeSpan(got));
    double total = 0;
    for (double x : got) {
      ASSERT_GE(x, lo);
      ASSERT_LE(x, hi);
      total += x;
    }
    ASSERT_NEAR(total, 1.0, 1e-12) << "trial " << trial;
    // The projection is clip(v - t) for the t of the sum: bisection finds the same point.
    double a = -2, b = 2;
    for (int it = 0; it < 200; ++it) {
      const double t = (a + b) / 2;
      double s = 0;
      for (double x : v) s += std::min(std::max(x - t, lo), hi);
      (s > 1.0 ? a : b) = t;
    }
    for (uint32_t i = 0; i < k; ++i) {
      ASSERT_NEAR(got[i], std::min(std::max(v[i] - a, lo), hi), 1e-12) << "trial " << trial;
    }
  }
}

TEST(GroupWeightsTest, ExcessLossByHand) {
  // Plain DoReMi (no floor), c = 0, the epoch mean as the loss (loss_decay 0): excess (2, 1),
  // w_0 = e^2 / (e^2 + e) = e / (e + 1).
  ExcessLossConfig plain{1.0, 0.0, 0.0, kInf, {}};
  absl::StatusOr<GroupWeights> w = GroupWeights::ExcessLoss({1, 1}, {1, 1}, plain);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Update(EpochOf({3, 2})).ok());
  const double e = std::exp(1.0);
  EXPECT_NEAR(w->weights()[0], e / (e + 1), 1e-15);
  EXPECT_NEAR(w->weights()[1], 1 / (e + 1), 1e-15);
  // With the stall floor (H = 2): a first epoch has no decrease yet, so no excess; then group 0
  // falls by 1 (excess min(2 - 1, 2 x 1) = 1), group 1 stalls at 2 (floor 2: excess 0).
  ExcessLossConfig floored{1.0, 0.0, 0.0, 2.0, {}};
  w = GroupWeights::ExcessLoss({1, 1}, {1, 1}, floored);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Update(EpochOf({3, 2})).ok());
  EXPECT_EQ(w->weights(), (std::vector<double>{0.5, 0.5}));
  ASSERT_TRUE(w->Update(EpochOf({2, 2})).ok());
  EXPECT_EQ(w->Excess(), (std::vector<double>{1.0, 0.0}));
  EXPECT_NEAR(w->weights()[0], e / (e + 1), 1e-15);
  // Smoothing c = 0.1: (0.9 s + 0.05); bounds max_ratio 1.2 (hi = 0.6) cap it at 0.6.
  ExcessLossConfig smooth{1.0, 0.1, 0.0, kInf, {0.0, 1.2}};
  w = GroupWeights::ExcessLoss({1, 1}, {1, 1}, smooth);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Update(EpochOf({1.25, 1})).ok());  // excess (0.25, 0).
  const double s0 = std::exp(0.25) / (std::exp(0.25) + 1);
  EXPECT_NEAR(w->weights()[0], 0.9 * s0 + 0.05, 1e-15);
  ASSERT_TRUE(w->Update(EpochOf({3, 1})).ok());  // excess (2, 0): above 0.6 before the bound.
  EXPECT_EQ(w->weights()[0], 0.6);
  EXPECT_NEAR(w->weights()[1], 0.4, 1e-15);
}

TEST(GroupWeightsTest, Exp3ByHand) {
  Exp3Config config{1.0, 0.0, 0.0, 0.0, {}};
  absl::StatusOr<GroupWeights> w = GroupWeights::Exp3({1, 1}, config);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Update(EpochOf({3, 2})).ok());  // First losses: no decrease, no reward.
  EXPECT_EQ(w->weights(), (std::vector<double>{0.5, 0.5}));
  ASSERT_TRUE(w->Update(EpochOf({2.5, 2})).ok());  // Reward (0.5, 0) at relative probability 1.
  const double s0 = std::exp(0.5) / (std::exp(0.5) + 1);
  EXPECT_NEAR(w->weights()[0], s0, 1e-15);
  // Group 0 falls by 0.5 again, now at relative probability 2 s0: reward 0.5 / (2 s0).
  ASSERT_TRUE(w->Update(EpochOf({2.0, 2})).ok());
  EXPECT_NEAR(w->tracks()[0].reward, 0.5 / (2 * s0), 1e-15);
  const double r = 0.5 / (2 * s0);
  EXPECT_NEAR(w->weights()[0], std::exp(r) / (std::exp(r) + 1), 1e-15);
  // A constant loss earns nothing, however high: group 1 at 2 throughout has reward 0.
  EXPECT_EQ(w->tracks()[1].reward, 0.0);
  // Exploration 0.2: 0.8 s + 0.1.
  Exp3Config explore{1.0, 0.2, 0.0, 0.0, {}};
  w = GroupWeights::Exp3({1, 1}, explore);
  ASSERT_TRUE(w->Update(EpochOf({3, 2})).ok());
  ASSERT_TRUE(w->Update(EpochOf({2.5, 2})).ok());
  EXPECT_NEAR(w->weights()[0], 0.8 * s0 + 0.1, 1e-15);
}

TEST(GroupWeightsTest, GroupsWithoutLossesKeepTheirWeightBitForBit) {
  ExcessLossConfig config{2.0, 0.01, 0.5, 10.0, {0.1, 3.0}};
  absl::StatusOr<GroupWeights> a = GroupWeights::ExcessLoss({0.2, 0.3, 0.5}, {0, 0, 0}, config);
  absl::StatusOr<GroupWeights> b = GroupWeights::Exp3({0.2, 0.3, 0.5}, {2.0, 0.1, 0.5, 0.5, {}});
  ASSERT_TRUE(a.ok() && b.ok());
  for (GroupWeights* w : {&*a, &*b}) {
    const double kept = w->weights()[2];
    for (int epoch = 0; epoch < 5; ++epoch) {
      ASSERT_TRUE(w->Update(EpochOf({5.0 - epoch, 3.0, std::nan("")})).ok());
      EXPECT_EQ(w->weights()[2], kept);
      EXPECT_FALSE(w->tracks()[2].seen);
      EXPECT_NEAR(w->weights()[0] + w->weights()[1], 1 - kept, 1e-15);
    }
    EXPECT_GT(w->weights()[0], w->weights()[1]);  // Group 0's loss falls, group 1's does not.
  }
}

TEST(GroupWeightsTest, BoundsAlwaysHold) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int run = 0; run < 60; ++run) {
    const uint32_t k = 2 + static_cast<uint32_t>(rng() % 30);
    const WeightBounds bounds{unit(rng), run % 3 == 0 ? kInf : 1.0 + 4.0 * unit(rng)};
    std::vector<double> initial(k), reference(k);
    for (uint32_t i = 0; i < k; ++i) {
      initial[i] = unit(rng) < 0.2 ? 0.0 : unit(rng);
      reference[i] = 3 * unit(rng);
    }
    initial[0] = 1;
    absl::StatusOr<GroupWeights> w =
        run % 2 ? GroupWeights::ExcessLoss(initial, reference,
                                           {20 * unit(rng), unit(rng) * 0.1, 0.9 * unit(rng),
                                            1 + 20 * unit(rng), bounds})
                : GroupWeights::Exp3(initial, {50 * unit(rng), 0.1 * unit(rng), 0.9 * unit(rng),
                                               0.9 * unit(rng), bounds});
    ASSERT_TRUE(w.ok()) << w.status();
    const double lo = bounds.min_ratio / k, hi = bounds.max_ratio / k;
    for (int epoch = 0; epoch < 40; ++epoch) {
      std::vector<double> means(k);
      for (double& m : means) m = unit(rng) < 0.1 ? std::nan("") : 6 * unit(rng);
      ASSERT_TRUE(w->Update(EpochOf(means)).ok());
      double total = 0;
      for (double x : w->weights()) {
        ASSERT_GE(x, lo) << "run " << run << " epoch " << epoch;
        ASSERT_LE(x, hi) << "run " << run << " epoch " << epoch;
        total += x;
      }
      ASSERT_NEAR(total, 1.0, 1e-12);
    }
  }
}

// A synthetic pretraining run: five learnable groups whose mean loss falls with the samples they
// receive (floor_k + 3.5 / (1 + s_k / tau_k)) and one unlearnable "random bytes" group at a
// constant 5.55 (ln 256); per-sample losses with Gaussian noise (sd 0.3); 6,000 samples per
// epoch apportioned exactly (SharesOf, Apportioner) from the rule's weights; 150 epochs.
struct SimResult {
  double max_random = 0;   // The largest weight of the random group over the epochs.
  double last_random = 0;  // Its weight after the last epoch.
  double mean_random = 0;  // Its mean weight over the epochs.
};

template <typename Rule>
SimResult Simulate(Rule&& rule, uint64_t seed) {
  constexpr uint32_t kGroups = 6;
  constexpr uint64_t kWindow = 6000;
  constexpr int kEpochs = 150;
  const double floor_loss[5] = {1.0, 1.2, 1.5, 1.8, 2.0};
  const double tau[5] = {2000, 3000, 5000, 8000, 12000};
  const GroupLayout layout = Layout(std::vector<uint64_t>(kGroups, 1'000'000));
  absl::StatusOr<Apportioner> apportioner = Apportioner::Create(kGroups);
  EXPECT_TRUE(apportioner.ok());
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::vector<double> seen(kGroups, 0.0);
  SimResult out;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const std::vector<double> weights = rule.Weights();
    out.max_random = std::max(out.max_random, weights[5]);
    out.mean_random += weights[5] / kEpochs;
    absl::StatusOr<std::vector<uint64_t>> shares = SharesOf(weights);
    EXPECT_TRUE(shares.ok());
    absl::StatusOr<WindowCounts> counts = apportioner->Next(*shares, kWindow);
    EXPECT_TRUE(counts.ok());
    GroupLosses losses(kGroups);
    for (uint32_t k = 0; k < kGroups; ++k) {
      const uint64_t c = counts->counts[k];
      std::vector<uint64_t> indices(c);
      std::vector<float> values(c);
      for (uint64_t i = 0; i < c; ++i) {
        const double mean = k == 5 ? 5.55 : floor_loss[k] + 3.5 / (1.0 + (seen[k] + i) / tau[k]);
        indices[i] = layout.offset(k) + (static_cast<uint64_t>(seen[k]) + i) % 1'000'000;
        values[i] = static_cast<float>(std::max(0.0, mean + noise(rng)));
      }
      seen[k] += c;
      EXPECT_TRUE(losses.Add(layout, indices, values).ok());
    }
    rule.Update(losses);
  }
  out.last_random = rule.Weights()[5];
  return out;
}

struct OnlineRule {
  GroupWeights weights;
  std::vector<double> Weights() const { return weights.weights(); }
  void Update(const GroupLosses& l) { EXPECT_TRUE(weights.Update(l).ok()); }
};

// Loss-proportional group weights (each group's weight its last mean loss): the baseline.
struct LossProportional {
  std::vector<double> w = std::vector<double>(6, 1.0 / 6);
  std::vector<double> Weights() const { return w; }
  void Update(const GroupLosses& l) {
    double sum = 0;
    for (uint32_t k = 0; k < 6; ++k) sum += l.count(k) ? l.Mean(k) : w[k];
    for (uint32_t k = 0; k < 6; ++k) w[k] = (l.count(k) ? l.Mean(k) : w[k]) / sum;
  }
};

// ODM's reward as published (the loss level, importance-weighted), with the same EXP3 update
// (eta 1 per nat, exploration 0.05, reward decay 0.9, no bounds): the failure, for
// contrast.
struct Exp3OnLossLevel {
  std::vector<double> w = std::vector<double>(6, 1.0 / 6);
  std::vector<double> reward = std::vector<double>(6, 0.0);
  std::vector<double> Weights() const { return w; }
  void Update(const GroupLosses& l) {
    std::vector<double> z(6);
    double top = -kInf, total = 0;
    for (uint32_t k = 0; k < 6; ++k) {
      if (l.count(k)) reward[k] = 0.9 * reward[k] + 0.1 * l.Mean(k) / (6 * w[k]);
      z[k] = reward[k];
      top = std::max(top, z[k]);
    }
    for (double& x : z) total += (x = std::exp(x - top));
    for (uint32_t k = 0; k < 6; ++k) w[k] = 0.95 * z[k] / total + 0.05 / 6;
  }
};

TEST(GroupWeightsTest, SimulatedRunTheUnlearnableGroupDoesNotTakeTheMass) {
  // The reference of the excess-loss rule: each group's loss after a uniform run of the same
  // length (25,000 samples each); the random group's reference is its own constant loss (the
  // issue's measured case: the reference protects it).
  const double floor_loss[5] = {1.0, 1.2, 1.5, 1.8, 2.0};
  const double tau[5] = {2000, 3000, 5000, 8000, 12000};
  std::vector<double> reference(6, 5.55);
  for (int k = 0; k < 5; ++k) reference[k] = floor_loss[k] + 3.5 / (1.0 + 150000.0 / 6 / tau[k]);
  const std::vector<double> uniform(6, 1.0);
  const WeightBounds bounded{0.25, 2.0};  // w in [1/24, 1/3].
  const WeightBounds unbounded{0.0, kInf};
  for (uint64_t seed : {1, 2, 3}) {
    const SimResult proportional = Simulate(LossProportional{}, seed);
    const SimResult odm = Simulate(Exp3OnLossLevel{}, seed);
    auto excess = [&](const WeightBounds& b, double horizon) {
      return Simulate(
          OnlineRule{*GroupWeights::ExcessLoss(uniform, reference, {2.0, 1e-3, 0.5, horizon, b})},
          seed);
    };
    auto exp3 = [&](const WeightBounds& b) {
      return Simulate(OnlineRule{*GroupWeights::Exp3(uniform, {20.0, 0.05, 0.9, 0.5, b})}, seed);
    };
    const SimResult a = excess(bounded, 10.0), a_free = excess(unbounded, 10.0);
    const SimResult a_plain = excess(unbounded, kInf);
    const SimResult b = exp3(bounded), b_free = exp3(unbounded);
    std::printf(
        "seed %llu, random group's weight max / mean / last:\n"
        "  loss-proportional        %.3f / %.3f / %.3f\n"
        "  EXP3 on the loss level   %.3f / %.3f / %.3f\n"
        "  excess loss, bounded     %.3f / %.3f / %.3f\n"
        "  excess loss, unbounded   %.3f / %.3f / %.3f\n"
        "  excess loss, no floor    %.3f / %.3f / %.3f\n"
        "  EXP3, bounded            %.3f / %.3f / %.3f\n"
        "  EXP3, unbounded          %.3f / %.3f / %.3f\n",
        static_cast<unsigned long long>(seed), proportional.max_random, proportional.mean_random,
        proportional.last_random, odm.max_random, odm.mean_random, odm.last_random, a.max_random,
        a.mean_random, a.last_random, a_free.max_random, a_free.mean_random, a_free.last_random,
        a_plain.max_random, a_plain.mean_random, a_plain.last_random, b.max_random, b.mean_random,
        b.last_random, b_free.max_random, b_free.mean_random, b_free.last_random);
    // Loss-proportional puts more than the bound (1/3) on the random group, and ODM's reward
    // (the loss level) nearly twice uniform (0.32 here: the importance weighting, reward / (6 w),
    // limits it in this model; the issue measured 90% in a real run).
    EXPECT_GT(proportional.last_random, 1.0 / 3);
    EXPECT_GT(odm.last_random, 0.25);
    // The rules stay within the bound, and even without an upper bound they do not chase the
    // random group: below uniform (1/6) on average, never far above it (EXP3's reward of a
    // constant loss is noise around 0: its weight returns to uniform as the learnable groups
    // converge); the excess-loss rule takes it down to a few percent.
    EXPECT_LE(a.max_random, 1.0 / 3);
    EXPECT_LE(b.max_random, 1.0 / 3);
    EXPECT_LE(b_free.max_random, 0.2);
    EXPECT_LE(b_free.mean_random, 0.15);
    EXPECT_LE(a_free.max_random, 1.0 / 6 + 1e-12);  // The first epoch's uniform weights.
    EXPECT_LE(a_free.mean_random, 0.05);
    // The stall floor stops the creep back of plain DoReMi (the 0.06 -> 0.15-0.20): with
    // the reference at the random group's own loss, max(0, noise) is a positive excess on
    // average; the floor (no decrease, no excess) halves at least its final weight here.
    EXPECT_GT(a_plain.last_random, a_plain.mean_random);
    EXPECT_LT(a_free.last_random, 0.5 * a_plain.last_random);
  }
}

TEST(GroupWeightsTest, MillionGroups) {
  // K = 10^6 (kMaxGroups): one update of each rule, every group seen, the projection active.
  constexpr uint32_t k = 1'000'000;
  std::mt19937_64 rng(13);
  std::vector<double> initial(k), reference(k, 1.0);
  for (double& x : initial) x = 1 + static_cast<double>(rng() % 1000);
  const GroupLayout layout = Layout(std::vector<uint64_t>(k, 1));
  GroupLosses first(k), second(k);
  std::vector<uint64_t> indices(k);
  std::vector<float> a(k), b(k);
  for (uint32_t i = 0; i < k; ++i) {
    indices[i] = i;
    a[i] = 3.0f;
    b[i] = static_cast<float>(3.0 - 0.001 * (rng() % 1000));
  }
  ASSERT_TRUE(first.Add(layout, indices, a).ok());
  ASSERT_TRUE(second.Add(layout, indices, b).ok());
  const WeightBounds bounds{0.5, 1.5};
  absl::StatusOr<GroupWeights> excess =
      GroupWeights::ExcessLoss(initial, reference, {100.0, 1e-3, 0.0, 10.0, bounds});
  absl::StatusOr<GroupWeights> exp3 = GroupWeights::Exp3(initial, {2000.0, 0.05, 0.0, 0.0, bounds});
  ASSERT_TRUE(excess.ok() && exp3.ok());
  for (GroupWeights* w : {&*excess, &*exp3}) {
    ASSERT_TRUE(w->Update(first).ok());
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(w->Update(second).ok());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double total = 0;
    uint64_t at_bound = 0;
    for (double x : w->weights()) {
      ASSERT_GE(x, 0.5 / k);
      ASSERT_LE(x, 1.5 / k);
      at_bound += x == 0.5 / k || x == 1.5 / k;
      total += x;
    }
    EXPECT_NEAR(total, 1.0, 1e-9);
    EXPECT_GT(at_bound, 0u);  // The projection had work to do.
    std::printf("K = 10^6, %s: one update %.3f s, %llu groups at a bound\n",
                w->rule() == GroupWeightRule::kExp3 ? "EXP3" : "excess loss", seconds,
                static_cast<unsigned long long>(at_bound));
  }
}

TEST(GroupWeightsTest, ReplayIsBitIdentical) {
  // Two jobs fed the same epochs, their losses arriving in different orders: the same bits.
  const GroupLayout layout = Layout({100, 200, 300});
  std::mt19937_64 rng(5);
  absl::StatusOr<GroupWeights> a =
      GroupWeights::ExcessLoss({1, 2, 3}, {1, 1, 1}, {3.0, 0.01, 0.5, 5.0, {0.3, 2.0}});
  absl::StatusOr<GroupWeights> b = a;
  for (int epoch = 0; epoch < 20; ++epoch) {
    std::vector<uint64_t> indices(500);
    std::vector<float> values(500);
    for (int i = 0; i < 500; ++i) {
      indices[i] = rng() % 600;
      values[i] = static_cast<float>(3.0 * std::exp(-0.05 * epoch * (1 + indices[i] / 200)) +
                                     0.001 * (rng() % 100));
    }
    GroupLosses forward(3), backward(3);
    ASSERT_TRUE(forward.Add(layout, indices, values).ok());
    for (int i = 499; i >= 0; --i) {
      ASSERT_TRUE(backward.Add(layout, {indices[i]}, {values[i]}).ok());
    }
    ASSERT_TRUE(a->Update(forward).ok());
    ASSERT_TRUE(b->Update(backward).ok());
    ASSERT_EQ(a->weights(), b->weights()) << "epoch " << epoch;
  }
}

TEST(GroupWeightsTest, BadInputIsNamedAndChangesNothing) {
  const ExcessLossConfig ok{};
  auto excess = [&](ExcessLossConfig c, std::vector<double> ref = {1, 1}) {
    return GroupWeights::ExcessLoss({1, 1}, ref, c).status();
  };
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  ExpectError(excess(ok, {1}), bad, "reference_losses: 1 reference losses for 2 groups");
  ExpectError(excess(ok, {1, std::nan("")}), bad, "reference_losses[1] = nan");
  ExpectError(excess(ok, {-1, 1}), bad, "reference_losses[0] = -1");
  ExpectError(excess(ok, {1, kInf}), bad, "reference_losses[1] = inf");
  ExcessLossConfig c = ok;
  c.eta = 0;
  ExpectError(excess(c), bad, "eta = 0");
  c = ok;
  c.smoothing = 1.5;
  ExpectError(excess(c), bad, "smoothing = 1.5");
  c = ok;
  c.loss_decay = 1;
  ExpectError(excess(c), bad, "loss_decay = 1");
  c = ok;
  c.horizon = 0;
  ExpectError(excess(c), bad, "horizon = 0");
  c = ok;
  c.bounds.min_ratio = 1.5;
  ExpectError(excess(c), bad, "bounds.min_ratio = 1.5");
  c = ok;
  c.bounds.max_ratio = 0.5;
  ExpectError(excess(c), bad, "bounds.max_ratio = 0.5");
  Exp3Config e{};
  e.exploration = -0.1;
  ExpectError(GroupWeights::Exp3({1, 1}, e).status(), bad, "exploration = -0.1");
  e = Exp3Config{};
  e.reward_decay = std::nan("");
  ExpectError(GroupWeights::Exp3({1, 1}, e).status(), bad, "reward_decay = nan");
  ExpectError(GroupWeights::Exp3({0, 0}, Exp3Config{}).status(), bad, "weights");

  absl::StatusOr<GroupWeights> fixed = GroupWeights::Static({1, 3});
  ASSERT_TRUE(fixed.ok());
  ExpectError(fixed->SetStatic({1, -2}), bad, "weights[1]");
  ExpectError(fixed->SetStatic({1, 2, 3}), bad, "weights: 3 weights for 2 groups");
  EXPECT_EQ(fixed->weights(), (std::vector<double>{0.25, 0.75}));
  ASSERT_TRUE(fixed->SetStatic({1, 1}).ok());
  EXPECT_EQ(fixed->weights(), (std::vector<double>{0.5, 0.5}));
  ASSERT_TRUE(fixed->Update(EpochOf({3, 1})).ok());  // Static: losses change nothing.
  EXPECT_EQ(fixed->weights(), (std::vector<double>{0.5, 0.5}));

  absl::StatusOr<GroupWeights> online = GroupWeights::Exp3({1, 1}, Exp3Config{});
  ASSERT_TRUE(online.ok());
  ExpectError(online->SetStatic({1, 1}), absl::StatusCode::kFailedPrecondition, "online");
  ExpectError(online->Update(EpochOf({1, 2, 3})), bad, "losses: statistics of 3 groups");
  EXPECT_EQ(online->weights(), (std::vector<double>{0.5, 0.5}));
  EXPECT_FALSE(online->tracks()[0].seen);
}

// A state saved after some epochs and restored into a fresh object of the same rule continues
// bit for bit (the server restores the weights and tracks of a snapshot this way); bad saved
// states change nothing.
TEST(GroupWeightsTest, RestoredStateContinuesBitForBit) {
  for (int rule = 0; rule < 2; ++rule) {
    auto make = [&] {
      return rule == 0 ? GroupWeights::ExcessLoss({1, 1, 2}, {0.5, 0.5, 0.5}, ExcessLossConfig{})
                       : GroupWeights::Exp3({1, 1, 2}, Exp3Config{});
    };
    absl::StatusOr<GroupWeights> run = make();
    ASSERT_TRUE(run.ok());
    ASSERT_TRUE(run->Update(EpochOf({3, 2, 1})).ok());
    ASSERT_TRUE(run->Update(EpochOf({2.5, 1.5, 1})).ok());
    absl::StatusOr<GroupWeights> resumed = make();
    ASSERT_TRUE(resumed.ok());
    const std::vector<double> before = resumed->weights();
    ExpectError(resumed->Restore({0.5, 0.5}, run->tracks()), absl::StatusCode::kInvalidArgument,
                "weights: 2 weights for 3 groups");
    ExpectError(resumed->Restore({0.5, -0.5, 1}, run->tracks()),
                absl::StatusCode::kInvalidArgument, "weights[1] = -0.5");
    ExpectError(resumed->Restore(run->weights(), {}), absl::StatusCode::kInvalidArgument,
                "tracks: 0 group tracks for 3 groups");
    EXPECT_EQ(resumed->weights(), before);
    ASSERT_TRUE(resumed->Restore(run->weights(), run->tracks()).ok());
    ASSERT_TRUE(run->Update(EpochOf({2, 1.4, 1})).ok());
    ASSERT_TRUE(resumed->Update(EpochOf({2, 1.4, 1})).ok());
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(std::memcmp(&run->weights()[k], &resumed->weights()[k], sizeof(double)), 0) << k;
    }
  }
}

}  // namespace
}  // namespace mixture
}  // namespace samplerd
