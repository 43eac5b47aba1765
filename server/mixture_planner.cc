#include "server/mixture_planner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mixture/window.h"

namespace samplerd {

using mixture::int128;

absl::StatusOr<std::shared_ptr<const MixtureWeights>> MakeMixtureWeights(
    std::vector<double> weights, std::vector<mixture::GroupTrack> tracks) {
  absl::StatusOr<std::vector<uint64_t>> shares = mixture::SharesOf(weights);
  if (!shares.ok()) return shares.status();
  auto out = std::make_shared<MixtureWeights>();
  out->weights = std::move(weights);
  out->shares = *std::move(shares);
  out->tracks = std::move(tracks);
  return std::shared_ptr<const MixtureWeights>(std::move(out));
}

uint64_t MixturePlanner::ScratchBytes(const ComputeBackend& backend, uint64_t groups,
                                      uint64_t window, uint64_t num_samples) {
  const uint64_t per_state =
      groups * (sizeof(int128) + sizeof(mixture::GroupCursor) + sizeof(double) + sizeof(uint64_t) +
                sizeof(mixture::GroupTrack));
  return (kKeptStates + 2) * per_state + 2 * groups * sizeof(uint64_t) +
         backend.MixtureWindowScratchBytes(groups, window) +
         (Plan::Narrow(num_samples) ? window * sizeof(uint64_t) : 0);
}

MixturePlanner::MixturePlanner(std::shared_ptr<const MixtureConfig> config, uint64_t seed,
                               uint64_t window, ComputeBackend* backend)
    : config_(std::move(config)),
      seed_(seed),
      window_(window),
      backend_(backend),
      initial_(std::make_shared<const MixtureWeights>(MixtureWeights{
          config_->weights, config_->shares,
          config_->online() ? std::vector<mixture::GroupTrack>(config_->layout.groups())
                            : std::vector<mixture::GroupTrack>()})) {}

namespace {

absl::Status NoWeightsYet(uint64_t epoch) {
  return absl::FailedPreconditionError(
      absl::StrCat("the group weights of epoch ", epoch,
                   " are not known yet: they are learned from the losses of epoch ",
                   epoch == 0 ? 0 : epoch - 1, ", which has not ended"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MixtureState>> MixturePlanner::Advance(
    const MixtureState& state, std::vector<uint64_t>* counts) const {
  if (state.weights == nullptr) return NoWeightsYet(state.epoch);
  absl::StatusOr<mixture::Apportioner> apportioner = mixture::Apportioner::FromLags(state.lags);
  if (!apportioner.ok()) return absl::InternalError(apportioner.status().message());
  absl::StatusOr<mixture::WindowCounts> window = apportioner->Next(state.weights->shares, window_);
  if (!window.ok()) return absl::InternalError(window.status().message());
  auto next = std::make_shared<MixtureState>();
  next->epoch = state.epoch + 1;
  // Static weights stay; an online rule's next weights come from this epoch's losses.
  if (!config_->online()) next->weights = state.weights;
  next->lags = apportioner->lags();
  next->cursors = mixture::CursorsAfter(config_->layout, state.cursors, window->counts);
  if (counts != nullptr) *counts = std::move(window->counts);
  return next;
}

void MixturePlanner::Keep(std::shared_ptr<const MixtureState> state, bool replace) {
  const uint64_t epoch = state->epoch;
  if (replace || known_.count(epoch) == 0) known_[epoch] = std::move(state);
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
    first->weights = initial_;
    state = std::move(first);
  }
  if (state->epoch == epoch) {
    if (state->weights == nullptr) return NoWeightsYet(epoch);
    return state;
  }
  // Off the lock: O(K) per epoch advanced.
  while (state->epoch < epoch) {
    absl::StatusOr<std::shared_ptr<const MixtureState>> next = Advance(*state, nullptr);
    if (!next.ok()) return next.status();
    state = *std::move(next);
  }
  absl::MutexLock lock(&mu_);
  Keep(state, /*replace=*/false);
  state = known_.at(epoch);  // Kept, or the one kept before (with weights set since).
  if (state->weights == nullptr) return NoWeightsYet(epoch);
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
  if (state.weights == nullptr) {
    // Written before weights could change: a static job's are the config's.
    if (config_->online()) return bad("has no group weights (an online job's state has them)");
    state.weights = initial_;
  } else {
    const MixtureWeights& w = *state.weights;
    if (w.weights.size() != layout.groups() ||
        w.tracks.size() != (config_->online() ? layout.groups() : 0)) {
      return bad(absl::StrCat("has ", w.weights.size(), " weights and ", w.tracks.size(),
                              " group tracks"));
    }
    // The rule takes them (the check of GroupWeights::Restore).
    mixture::GroupWeights rule = *config_->initial;
    if (absl::Status s = rule.Restore(w.weights, w.tracks); !s.ok()) {
      return bad(std::string(s.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  // What followed the state is forgotten (a rewind): it is planned again from it.
  known_.erase(known_.upper_bound(state.epoch), known_.end());
  Keep(std::make_shared<const MixtureState>(std::move(state)));
  return absl::OkStatus();
}

absl::Status MixturePlanner::ReplaceWeights(uint64_t epoch,
                                            std::shared_ptr<const MixtureWeights> weights) {
  absl::StatusOr<std::shared_ptr<const MixtureState>> state = StateAt(epoch);
  if (!state.ok() && !(absl::IsFailedPrecondition(state.status()) && epoch > 0)) {
    return state.status();
  }
  std::shared_ptr<const MixtureState> at;
  if (state.ok()) {
    at = *state;
  } else {
    // An online epoch without its weights yet: from its predecessor's state, which has them.
    absl::StatusOr<std::shared_ptr<const MixtureState>> before = StateAt(epoch - 1);
    if (!before.ok()) return before.status();
    absl::StatusOr<std::shared_ptr<const MixtureState>> next = Advance(**before, nullptr);
    if (!next.ok()) return next.status();
    at = *std::move(next);
  }
  auto replaced = std::make_shared<MixtureState>(*at);
  replaced->weights = std::move(weights);
  absl::MutexLock lock(&mu_);
  known_.erase(known_.upper_bound(epoch), known_.end());
  Keep(std::move(replaced));
  return absl::OkStatus();
}

absl::Status MixturePlanner::SetStaticFrom(uint64_t epoch, absl::Span<const double> weights) {
  mixture::GroupWeights rule = *config_->initial;
  if (absl::Status s = rule.SetStatic(weights); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<const MixtureWeights>> made =
      MakeMixtureWeights(rule.weights(), {});
  if (!made.ok()) return made.status();
  return ReplaceWeights(epoch, *std::move(made));
}

absl::StatusOr<std::shared_ptr<const MixtureWeights>> MixturePlanner::UpdateOnline(
    uint64_t closed_epoch, const mixture::GroupLosses& losses) {
  if (!config_->online()) {
    return absl::FailedPreconditionError("the job's group weights are static: no online update");
  }
  absl::StatusOr<std::shared_ptr<const MixtureState>> state = StateAt(closed_epoch);
  if (!state.ok()) return state.status();
  const MixtureWeights& before = *(*state)->weights;  // StateAt's state has its weights.
  mixture::GroupWeights rule = *config_->initial;
  if (absl::Status s = rule.Restore(before.weights, before.tracks); !s.ok()) {
    return absl::InternalError(s.message());
  }
  if (absl::Status s = rule.Update(losses); !s.ok()) return absl::InternalError(s.message());
  absl::StatusOr<std::shared_ptr<const MixtureWeights>> made =
      MakeMixtureWeights(rule.weights(), rule.tracks());
  if (!made.ok()) return absl::InternalError(made.status().message());
  if (absl::Status s = ReplaceWeights(closed_epoch + 1, *made); !s.ok()) return s;
  return made;
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
    Keep(*next, /*replace=*/false);
  }
  const mixture::GroupLayout& layout = config_->layout;
  MixturePlan out;
  Plan& plan = out.plan;
  plan.epoch = epoch;
  plan.num_samples = layout.total();
  absl::StatusOr<std::vector<mixture::GroupCursor>> cursors;
  if (Plan::Narrow(plan.num_samples)) {
    std::vector<uint64_t> wide(window_);
    cursors = backend_->PlanMixtureWindow(seed_, epoch, layout, (*start)->cursors, info->counts,
                                          absl::MakeSpan(wide));
    if (cursors.ok()) plan.indices32.assign(wide.begin(), wide.end());  // Each < N <= 2^32.
  } else {
    plan.indices64.resize(window_);
    cursors = backend_->PlanMixtureWindow(seed_, epoch, layout, (*start)->cursors, info->counts,
                                          absl::MakeSpan(plan.indices64));
  }
  // A refused window is the planner's bug (its states are checked); a device failure is the
  // backend's status as it is.
  if (absl::IsInvalidArgument(cursors.status())) {
    return absl::InternalError(cursors.status().message());
  }
  if (!cursors.ok()) return cursors.status();
  out.epoch = std::move(info);
  return out;
}

std::vector<uint32_t> HeaviestGroups(absl::Span<const double> weights) {
  std::vector<uint32_t> order(weights.size());
  for (uint32_t k = 0; k < order.size(); ++k) order[k] = k;
  const size_t top = std::min<size_t>(order.size(), v1::MAX_STATUS_GROUPS);
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](uint32_t a, uint32_t b) {
    return weights[a] != weights[b] ? weights[a] > weights[b] : a < b;
  });
  order.resize(top);
  return order;
}

std::shared_ptr<const WeightHistory> WithEpochWeights(const WeightHistory* before,
                                                      const MixtureState& start) {
  auto out = std::make_shared<WeightHistory>();
  if (before != nullptr) {
    size_t keep = before->size();
    while (keep > 0 && (*before)[keep - 1].epoch() >= start.epoch) --keep;
    const size_t room = static_cast<size_t>(v1::MAX_WEIGHT_HISTORY) - 1;
    const size_t from = keep > room ? keep - room : 0;
    out->assign(before->begin() + from, before->begin() + keep);
  }
  state::EpochGroupWeights& entry = out->emplace_back();
  entry.set_epoch(start.epoch);
  const std::vector<double>& weights = start.weights->weights;
  for (uint32_t k : HeaviestGroups(weights)) {
    entry.add_group(k);
    entry.add_weight(weights[k]);
  }
  return out;
}

void DescribeMixture(const MixtureConfig& config, const MixtureEpoch* epoch, bool served,
                     v1::MixtureStatus* out) {
  const mixture::GroupLayout& layout = config.layout;
  out->set_groups(layout.groups());
  out->set_rule(static_cast<v1::GroupWeightRule>(config.rule));
  const std::vector<double>& weights = epoch != nullptr && epoch->start->weights != nullptr
                                           ? epoch->start->weights->weights
                                           : config.weights;
  for (uint32_t k : HeaviestGroups(weights)) {
    v1::GroupStatus* g = out->add_top_groups();
    g->set_group(k);
    g->set_weight(weights[k]);
    if (epoch != nullptr && served) {
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
  if (s.weights != nullptr) {
    for (double w : s.weights->weights) proto.add_weight(w);
    for (const mixture::GroupTrack& t : s.weights->tracks) {
      proto.add_seen(t.seen);
      proto.add_ema(t.ema);
      proto.add_decrease(t.decrease);
      proto.add_reward(t.reward);
    }
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
  const int tracks = proto.seen_size();
  if (proto.ema_size() != tracks || proto.decrease_size() != tracks ||
      proto.reward_size() != tracks) {
    return absl::DataLossError(absl::StrCat("the mixture state of epoch ", proto.epoch(),
                                            " has group tracks of different lengths"));
  }
  if (proto.weight_size() > 0) {
    std::vector<mixture::GroupTrack> t(tracks);
    for (int i = 0; i < tracks; ++i) {
      t[i] = {proto.seen(i), proto.ema(i), proto.decrease(i), proto.reward(i)};
    }
    absl::StatusOr<std::shared_ptr<const MixtureWeights>> w = MakeMixtureWeights(
        std::vector<double>(proto.weight().begin(), proto.weight().end()), std::move(t));
    if (!w.ok()) {
      return absl::DataLossError(absl::StrCat("the mixture state of epoch ", proto.epoch(),
                                              " has bad weights: ", w.status().message()));
    }
    s.weights = *std::move(w);
  } else if (tracks > 0) {
    return absl::DataLossError(absl::StrCat("the mixture state of epoch ", proto.epoch(),
                                            " has group tracks but no weights"));
  }
  return s;
}

}  // namespace samplerd
