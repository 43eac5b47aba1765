#include "server/mixture_planner.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mixture/window.h"

namespace samplerd {

using mixture::int128;

int MixturePlanner::DefaultThreads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

uint64_t MixturePlanner::ScratchBytes(uint64_t groups, uint64_t window, uint64_t num_samples) {
  const uint64_t per_state = groups * (sizeof(int128) + sizeof(mixture::GroupCursor));
  return (kKeptStates + 2) * per_state + 2 * groups * sizeof(uint64_t) +
         mixture::PlanWindowScratchBytes(DefaultThreads(), groups, window) +
         (Plan::Narrow(num_samples) ? window * sizeof(uint64_t) : 0);
}

MixturePlanner::MixturePlanner(std::shared_ptr<const MixtureConfig> config, uint64_t seed,
                               uint64_t window, int threads)
    : config_(std::move(config)), seed_(seed), window_(window), threads_(threads) {}

absl::StatusOr<std::shared_ptr<const MixtureState>> MixturePlanner::Advance(
    const MixtureState& state, std::vector<uint64_t>* counts) const {
  absl::StatusOr<mixture::Apportioner> apportioner = mixture::Apportioner::FromLags(state.lags);
  if (!apportioner.ok()) return absl::InternalError(apportioner.status().message());
  absl::StatusOr<mixture::WindowCounts> window = apportioner->Next(config_->shares, window_);
  if (!window.ok()) return absl::InternalError(window.status().message());
  auto next = std::make_shared<MixtureState>();
  next->epoch = state.epoch + 1;
  next->lags = apportioner->lags();
  next->cursors.resize(state.cursors.size());
  const mixture::GroupLayout& layout = config_->layout;
  for (uint32_t k = 0; k < layout.groups(); ++k) {
    next->cursors[k] = mixture::AdvanceCursor(state.cursors[k], layout.size(k), window->counts[k]);
  }
  if (counts != nullptr) *counts = std::move(window->counts);
  return next;
}

void MixturePlanner::Keep(std::shared_ptr<const MixtureState> state) {
  const uint64_t epoch = state->epoch;
  known_[epoch] = std::move(state);
  // The oldest others go first, never the state just kept: a rewind's remembered older state
  // (epoch 4 while 5..8 are kept) is the one its next epochs advance from.
  while (known_.size() > static_cast<size_t>(kKeptStates)) {
    auto oldest = known_.begin();
    if (oldest->first == epoch) ++oldest;
    known_.erase(oldest);
  }
}

absl::StatusOr<std::shared_ptr<const MixtureState>> MixturePlanner::StateAt(uint64_t epoch) {
  std::shared_ptr<const MixtureState> state;
  {
    absl::MutexLock lock(&mu_);
    auto at = known_.upper_bound(epoch);
    if (at != known_.begin()) state = std::prev(at)->second;
  }
  if (state == nullptr) {  // Epoch 0: nothing taken yet.
    auto first = std::make_shared<MixtureState>();
    const uint32_t k_groups = config_->layout.groups();
    first->lags.assign(k_groups, 0);
    first->cursors.assign(k_groups, mixture::GroupCursor{});
    state = std::move(first);
  }
  if (state->epoch == epoch) return state;
  // Off the lock: O(K) per epoch advanced.
  while (state->epoch < epoch) {
    absl::StatusOr<std::shared_ptr<const MixtureState>> next = Advance(*state, nullptr);
    if (!next.ok()) return next.status();
    state = *std::move(next);
  }
  absl::MutexLock lock(&mu_);
  Keep(state);
  return state;
}

absl::Status MixturePlanner::Remember(MixtureState state) {
  const mixture::GroupLayout& layout = config_->layout;
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("the mixture state of epoch ", state.epoch, " ", what,
                                            " (", layout.groups(), " groups)"));
  };
  if (state.lags.size() != layout.groups() || state.cursors.size() != layout.groups()) {
    return bad(
        absl::StrCat("has ", state.lags.size(), " lags and ", state.cursors.size(), " cursors"));
  }
  if (absl::StatusOr<mixture::Apportioner> a = mixture::Apportioner::FromLags(state.lags);
      !a.ok()) {
    return bad(std::string(a.status().message()));
  }
  for (uint32_t k = 0; k < layout.groups(); ++k) {
    if (state.cursors[k].position >= layout.size(k)) {
      return bad(absl::StrCat("has cursors[", k, "].position = ", state.cursors[k].position,
                              ", not below the group's size ", layout.size(k)));
    }
  }
  absl::MutexLock lock(&mu_);
  Keep(std::make_shared<const MixtureState>(std::move(state)));
  return absl::OkStatus();
}

absl::StatusOr<MixturePlan> MixturePlanner::PlanEpoch(uint64_t epoch) {
  absl::StatusOr<std::shared_ptr<const MixtureState>> start = StateAt(epoch);
  if (!start.ok()) return start.status();
  auto info = std::make_shared<MixtureEpoch>();
  info->start = *start;
  absl::StatusOr<std::shared_ptr<const MixtureState>> next = Advance(**start, &info->counts);
  if (!next.ok()) return next.status();
  {
    absl::MutexLock lock(&mu_);
    Keep(*next);
  }
  const mixture::GroupLayout& layout = config_->layout;
  MixturePlan out;
  Plan& plan = out.plan;
  plan.epoch = epoch;
  plan.num_samples = layout.total();
  absl::StatusOr<std::vector<mixture::GroupCursor>> cursors;
  if (Plan::Narrow(plan.num_samples)) {
    std::vector<uint64_t> wide(window_);
    cursors = mixture::PlanWindowInto(threads_, seed_, epoch, layout, (*start)->cursors,
                                      info->counts, absl::MakeSpan(wide));
    if (cursors.ok()) plan.indices32.assign(wide.begin(), wide.end());  // Each < N <= 2^32.
  } else {
    plan.indices64.resize(window_);
    cursors = mixture::PlanWindowInto(threads_, seed_, epoch, layout, (*start)->cursors,
                                      info->counts, absl::MakeSpan(plan.indices64));
  }
  if (!cursors.ok()) return absl::InternalError(cursors.status().message());
  out.epoch = std::move(info);
  return out;
}

void DescribeMixture(const MixtureConfig& config, const MixtureEpoch* epoch,
                     v1::MixtureStatus* out) {
  const mixture::GroupLayout& layout = config.layout;
  out->set_groups(layout.groups());
  std::vector<uint32_t> order(layout.groups());
  for (uint32_t k = 0; k < order.size(); ++k) order[k] = k;
  const size_t top = std::min<size_t>(order.size(), v1::MAX_STATUS_GROUPS);
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](uint32_t a, uint32_t b) {
    return config.weights[a] != config.weights[b] ? config.weights[a] > config.weights[b] : a < b;
  });
  for (size_t i = 0; i < top; ++i) {
    const uint32_t k = order[i];
    v1::GroupStatus* g = out->add_top_groups();
    g->set_group(k);
    g->set_weight(config.weights[k]);
    if (epoch != nullptr) {
      g->set_window_count(epoch->counts[k]);
      const mixture::GroupCursor next =
          mixture::AdvanceCursor(epoch->start->cursors[k], layout.size(k), epoch->counts[k]);
      g->set_pass(next.pass);
      g->set_position(next.position);
    }
  }
}

state::MixtureState MixtureStateToProto(const MixtureState& s) {
  state::MixtureState proto;
  proto.set_epoch(s.epoch);
  for (int128 lag : s.lags) {
    proto.add_lag_high(static_cast<int64_t>(lag >> 64));
    proto.add_lag_low(static_cast<uint64_t>(lag));
  }
  for (const mixture::GroupCursor& c : s.cursors) {
    proto.add_pass(c.pass);
    proto.add_position(c.position);
  }
  return proto;
}

absl::StatusOr<MixtureState> MixtureStateFromProto(const state::MixtureState& proto) {
  const int k = proto.lag_high_size();
  if (proto.lag_low_size() != k || proto.pass_size() != k || proto.position_size() != k) {
    return absl::DataLossError(absl::StrCat("the mixture state of epoch ", proto.epoch(),
                                            " has arrays of different lengths (",
                                            proto.lag_high_size(), ", ", proto.lag_low_size(), ", ",
                                            proto.pass_size(), ", ", proto.position_size(), ")"));
  }
  MixtureState s;
  s.epoch = proto.epoch();
  s.lags.resize(k);
  s.cursors.resize(k);
  for (int i = 0; i < k; ++i) {
    using uint128 = unsigned __int128;
    s.lags[i] = static_cast<int128>(
        (static_cast<uint128>(static_cast<uint64_t>(proto.lag_high(i))) << 64) | proto.lag_low(i));
    s.cursors[i] = {proto.position(i), proto.pass(i)};
  }
  return s;
}

}  // namespace samplerd
