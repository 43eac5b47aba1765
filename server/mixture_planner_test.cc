// MixturePlanner: plans over many epochs take every sample of a group once per pass, windows
// follow the apportionment exactly, and the plan of an epoch is the same whichever state it is
// reached from (epoch 0, the previous epoch, a remembered snapshot state).
#include "server/mixture_planner.h"

#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_losses.h"
#include "kernels/mixture/group_weights.h"

namespace samplerd {
namespace {

// The CPU backend on `threads` threads (1 or 2), made once: a planner's windows are its.
ComputeBackend* CpuBackendOf(int threads) {
  static ComputeBackend* const one = NewCpuBackend(1).release();
  static ComputeBackend* const two = NewCpuBackend(2).release();
  return threads == 1 ? one : two;
}

std::shared_ptr<const MixtureConfig> Config(std::vector<uint64_t> sizes,
                                            std::vector<double> weights) {
  v1::MixtureSpec spec;
  for (uint64_t n : sizes) spec.add_group_sizes(n);
  for (double w : weights) spec.add_group_weights(w);
  absl::StatusOr<std::shared_ptr<const MixtureConfig>> c = MakeMixtureConfig(spec, 0);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<uint64_t> Indices(const Plan& plan) {
  std::vector<uint64_t> out(plan.size());
  for (uint64_t i = 0; i < plan.size(); ++i) out[i] = plan[i];
  return out;
}

// Over E epochs every sample of group k appears floor(C_k / n_k) or that + 1 times (C_k its
// total count): at most once per pass. Several size mixes, groups smaller than the window
// included, and a window smaller than K.
TEST(MixturePlannerTest, EverySampleOncePerPassOverManyEpochs) {
  struct Mix {
    std::vector<uint64_t> sizes;
    std::vector<double> weights;
    uint64_t window;
  } mixes[] = {
      {{5, 17, 2}, {1, 1, 1}, 7},
      {{1, 64, 33, 3}, {0.1, 4, 2, 1}, 50},
      {{100, 1, 9, 40, 2, 7}, {}, 3},
      {{3}, {}, 8},
  };
  for (const Mix& mix : mixes) {
    std::shared_ptr<const MixtureConfig> config = Config(mix.sizes, mix.weights);
    MixturePlanner planner(config, /*seed=*/42, mix.window, CpuBackendOf(2));
    std::map<uint64_t, uint64_t> seen;
    std::vector<uint64_t> total(mix.sizes.size(), 0);
    mixture::Apportioner check = *mixture::Apportioner::Create(mix.sizes.size());
    for (uint64_t e = 0; e < 60; ++e) {
      absl::StatusOr<MixturePlan> p = planner.PlanEpoch(e);
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_EQ(p->plan.size(), mix.window);
      // The window's counts are the apportionment's, and the window holds that many of each.
      const mixture::WindowCounts want = *check.Next(config->shares, mix.window);
      EXPECT_EQ(p->epoch->counts, want.counts) << "epoch " << e;
      std::vector<uint64_t> in_window(mix.sizes.size(), 0);
      for (uint64_t i : Indices(p->plan)) {
        ++seen[i];
        ++in_window[config->layout.GroupOf(i)];
      }
      EXPECT_EQ(in_window, want.counts) << "epoch " << e;
      for (size_t k = 0; k < total.size(); ++k) total[k] += want.counts[k];
    }
    for (uint32_t k = 0; k < config->layout.groups(); ++k) {
      const uint64_t n = config->layout.size(k), passes = total[k] / n;
      uint64_t extra = 0;
      for (uint64_t j = 0; j < n; ++j) {
        const uint64_t c = seen[config->layout.offset(k) + j];
        ASSERT_TRUE(c == passes || c == passes + 1)
            << "group " << k << " sample " << j << " seen " << c << " times in " << total[k];
        extra += c - passes;
      }
      EXPECT_EQ(extra, total[k] % n) << "group " << k;
    }
  }
}

TEST(MixturePlannerTest, AnEpochIsTheSameFromEpochZeroFromThePreviousAndFromASnapshot) {
  std::shared_ptr<const MixtureConfig> config = Config({30, 7, 1000, 2}, {3, 1, 5, 0.5});
  MixturePlanner step(config, 7, 64, CpuBackendOf(2));
  std::vector<std::vector<uint64_t>> plans;
  std::shared_ptr<const MixtureState> at6;
  for (uint64_t e = 0; e < 12; ++e) {
    absl::StatusOr<MixturePlan> p = step.PlanEpoch(e);
    ASSERT_TRUE(p.ok()) << p.status();
    plans.push_back(Indices(p->plan));
    if (e == 6) at6 = p->epoch->start;
  }
  // Directly, from epoch 0.
  MixturePlanner direct(config, 7, 64, CpuBackendOf(1));
  absl::StatusOr<MixturePlan> p11 = direct.PlanEpoch(11);
  ASSERT_TRUE(p11.ok());
  EXPECT_EQ(Indices(p11->plan), plans[11]);
  // Back to an earlier epoch (a rewind) on the same planner.
  absl::StatusOr<MixturePlan> p3 = direct.PlanEpoch(3);
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(Indices(p3->plan), plans[3]);
  // From a state that went through the snapshot's encoding.
  absl::StatusOr<MixtureState> decoded = MixtureStateFromProto(MixtureStateToProto(*at6));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->lags, at6->lags);
  MixturePlanner restored(config, 7, 64, CpuBackendOf(2));
  ASSERT_TRUE(restored.Remember(*decoded).ok());
  for (uint64_t e = 6; e < 12; ++e) {
    absl::StatusOr<MixturePlan> p = restored.PlanEpoch(e);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(Indices(p->plan), plans[e]) << "epoch " << e;
  }
  // Another seed: another plan.
  MixturePlanner other(config, 8, 64, CpuBackendOf(2));
  EXPECT_NE(Indices(other.PlanEpoch(0)->plan), plans[0]);
}

// A remembered state is the one planned from, even on a planner that kept kKeptStates later
// ones (a rewind to epoch 3 after epochs 10..13). The state handed to it is valid but not the
// one epoch 0 leads to (every cursor one position on), so a planner that ignored it, or dropped
// it at once and advanced from epoch 0, would plan epoch 3 as `pure` does.
TEST(MixturePlannerTest, ARememberedOlderStateIsKeptAndPlannedFrom) {
  std::shared_ptr<const MixtureConfig> config = Config({30, 7, 1000, 2}, {3, 1, 5, 0.5});
  MixturePlanner pure(config, 7, 64, CpuBackendOf(1));
  absl::StatusOr<std::shared_ptr<const MixtureState>> at3 = pure.StateAt(3);
  ASSERT_TRUE(at3.ok()) << at3.status();
  MixtureState shifted = **at3;
  for (uint32_t k = 0; k < config->layout.groups(); ++k) {
    shifted.cursors[k].position = (shifted.cursors[k].position + 1) % config->layout.size(k);
  }
  // The plan of epoch 3 from `shifted` on a planner that knows nothing else.
  MixturePlanner fresh(config, 7, 64, CpuBackendOf(1));
  ASSERT_TRUE(fresh.Remember(shifted).ok());
  absl::StatusOr<MixturePlan> want = fresh.PlanEpoch(3);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_NE(Indices(want->plan), Indices(pure.PlanEpoch(3)->plan));

  MixturePlanner served(config, 7, 64, CpuBackendOf(2));
  for (uint64_t e = 10; e < 14; ++e) ASSERT_TRUE(served.PlanEpoch(e).ok()) << "epoch " << e;
  ASSERT_TRUE(served.Remember(shifted).ok());
  absl::StatusOr<MixturePlan> got = served.PlanEpoch(3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Indices(got->plan), Indices(want->plan));
  EXPECT_EQ(got->epoch->start->cursors[0].position, shifted.cursors[0].position);
  // The next epochs follow from it, as on the fresh planner.
  for (uint64_t e = 4; e < 8; ++e) {
    absl::StatusOr<MixturePlan> a = served.PlanEpoch(e), b = fresh.PlanEpoch(e);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(Indices(a->plan), Indices(b->plan)) << "epoch " << e;
  }
}

TEST(MixturePlannerTest, NegativeLagsSurviveTheSnapshotEncoding) {
  std::shared_ptr<const MixtureConfig> config = Config({10, 10, 10}, {1, 1, 1});
  // 4 samples over 3 equal groups: lags of both signs.
  MixturePlanner planner(config, 1, 4, CpuBackendOf(1));
  ASSERT_TRUE(planner.PlanEpoch(0).ok());
  absl::StatusOr<std::shared_ptr<const MixtureState>> s = planner.StateAt(1);
  ASSERT_TRUE(s.ok());
  bool negative = false;
  for (mixture::int128 lag : (*s)->lags) negative |= lag < 0;
  ASSERT_TRUE(negative);
  absl::StatusOr<MixtureState> back = MixtureStateFromProto(MixtureStateToProto(**s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->lags, (*s)->lags);
}

TEST(MixturePlannerTest, ADamagedStateIsDataLossAndNothingIsKept) {
  std::shared_ptr<const MixtureConfig> config = Config({10, 20}, {1, 1});
  MixturePlanner planner(config, 1, 8, CpuBackendOf(1));
  const std::vector<uint64_t> before = Indices(planner.PlanEpoch(3)->plan);
  MixtureState wrong_size{3, {0}, {{0, 0}}};
  EXPECT_EQ(planner.Remember(wrong_size).code(), absl::StatusCode::kDataLoss);
  MixtureState bad_cursor{3, {0, 0}, {{10, 0}, {0, 0}}};
  absl::Status s = planner.Remember(bad_cursor);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("cursors[0].position = 10"));
  MixtureState bad_lags{3, {1, 1}, {{0, 0}, {0, 0}}};  // Do not add up to 0.
  EXPECT_EQ(planner.Remember(bad_lags).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Indices(planner.PlanEpoch(3)->plan), before);
  state::MixtureState ragged;
  ragged.add_lag_high(0);
  EXPECT_EQ(MixtureStateFromProto(ragged).status().code(), absl::StatusCode::kDataLoss);
}

// Static weights set for epoch 2 after epochs 0-3 were planned with the old ones: epoch 2 on is
// apportioned by the new shares, the lags carried over; epochs 0-1 are as before.
TEST(MixturePlannerTest, StaticWeightsSetForAnEpochApplyFromIt) {
  std::shared_ptr<const MixtureConfig> config = Config({30, 7, 1000, 2}, {3, 1, 5, 0.5});
  MixturePlanner planner(config, 7, 64, CpuBackendOf(1));
  for (uint64_t e = 0; e < 4; ++e) ASSERT_TRUE(planner.PlanEpoch(e).ok());
  EXPECT_EQ(planner.SetStaticFrom(2, {1, -1, 1, 1}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(planner.SetStaticFrom(2, {1, 8, 1, 1}).ok());
  const std::vector<uint64_t> new_shares =
      *mixture::SharesOf(*mixture::NormalizeWeights({1, 8, 1, 1}, 4));
  mixture::Apportioner check = *mixture::Apportioner::Create(4);
  for (uint64_t e = 0; e < 5; ++e) {
    absl::StatusOr<MixturePlan> p = planner.PlanEpoch(e);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->epoch->counts, check.Next(e < 2 ? config->shares : new_shares, 64)->counts)
        << "epoch " << e;
    EXPECT_EQ(p->epoch->start->weights->shares, e < 2 ? config->shares : new_shares);
  }
  // The state carries its weights through the snapshot encoding.
  std::shared_ptr<const MixtureState> at3 = *planner.StateAt(3);
  MixtureState back = *MixtureStateFromProto(MixtureStateToProto(*at3));
  EXPECT_EQ(back.weights->weights, at3->weights->weights);
  EXPECT_EQ(back.weights->shares, new_shares);
}

// An online job's next epoch is planned only once its weights are known (UpdateOnline from the
// epoch's statistics); a state without weights is refused.
TEST(MixturePlannerTest, AnOnlineEpochWaitsForItsWeights) {
  v1::MixtureSpec spec;
  for (uint64_t n : {10, 20, 30}) spec.add_group_sizes(n);
  spec.set_rule(v1::EXP3);
  std::shared_ptr<const MixtureConfig> config = *MakeMixtureConfig(spec, 0);
  MixturePlanner planner(config, 3, 12, CpuBackendOf(1));
  ASSERT_TRUE(planner.PlanEpoch(0).ok());
  absl::StatusOr<MixturePlan> early = planner.PlanEpoch(1);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(early.status().message()),
              ::testing::HasSubstr("the group weights of epoch 1 are not known yet"));
  mixture::GroupLosses losses(3);
  ASSERT_TRUE(losses.Add(config->layout, {0, 15, 40}, {3.0f, 1.0f, 2.0f}).ok());
  mixture::GroupWeights by_hand = *config->initial;
  ASSERT_TRUE(by_hand.Update(losses).ok());  // First epoch seen: tracks set, weights stay.
  absl::StatusOr<std::shared_ptr<const MixtureWeights>> w = planner.UpdateOnline(0, losses);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->weights, by_hand.weights());
  EXPECT_TRUE((*w)->tracks[0].seen);
  absl::StatusOr<MixturePlan> next = planner.PlanEpoch(1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch->start->weights, *w);
  MixtureState no_weights = *next->epoch->start;
  no_weights.weights = nullptr;
  absl::Status refused = planner.Remember(no_weights);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("has no group weights"));
}

}  // namespace
}  // namespace samplerd
