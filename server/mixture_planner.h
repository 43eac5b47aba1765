// MixturePlanner: a mixture job's plans from epoch to epoch (docs/SAMPLING.md, "Mixture jobs").
// The plan of epoch e is the window (kernels/mixture/window.h), computed by the job's compute
// backend (ComputeBackend::PlanMixtureWindow: on the CPU backend's threads, or on the GPU with
// --backend=cuda; bit-identical either way), from the state before it -- each group's apportionment
// lag and cursor, and the group weights in force at e (MixtureState) -- with the counts of the
// apportionment of M = samples_per_epoch under those weights' shares (kernels/mixture/apportion.h).
// The lags and cursors of epoch e + 1 follow from e's window counts (no window need be computed for
// that: O(K) per epoch); its weights are e's (static weights), unless they are set for e + 1
// (SetStaticFrom: an admin's SetGroupWeights; UpdateOnline: an online rule fed with epoch e's
// losses). An online job's state of e + 1 has no weights until UpdateOnline(e) gives them: the
// planner advances only from states that carry their weights, so it never plans an online epoch
// ahead of its losses.
//
// The planner keeps kKeptStates states: each state it reaches or is handed (Remember) is kept,
// and the oldest others make room (never the one just kept). It advances from the nearest known
// earlier one (or from epoch 0), so the next epoch costs O(K + M); a restart and a rewind hand it
// the state their snapshot or kept epoch start holds (Remember), which also forgets the states
// after it (a rewind forgets what followed) -- a rewind to epoch 4 while 5..8 are kept plans
// epoch 4 from the state handed to it, and epoch 5 from epoch 4's.
//
// Memory: O(K) per kept state (32 bytes per group, plus 48 per group for weights that differ
// from the previous state's: static weights are shared), the window O(M) (and the backend's
// scratch: ComputeBackend::MixtureWindowScratchBytes): nothing per sample.
// Thread-safety: all methods may be called concurrently (the states under one mutex, held only
// to look a state up or keep one; advancing states and computing windows run off it).
#ifndef SAMPLERD_SERVER_MIXTURE_PLANNER_H_
#define SAMPLERD_SERVER_MIXTURE_PLANNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/compute_backend.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_losses.h"
#include "kernels/mixture/group_weights.h"
#include "kernels/mixture/window_math.h"
#include "kernels/plan.h"
#include "server/mixture_config.h"
#include "server/persistence/state.pb.h"

namespace samplerd {

// The group weights in force at an epoch (shared by consecutive states while they stay).
struct MixtureWeights {
  std::vector<double> weights;              // w_k (adding up to 1, up to rounding).
  std::vector<uint64_t> shares;             // SharesOf(weights): the window's shares of 2^63.
  std::vector<mixture::GroupTrack> tracks;  // An online rule's per-group state; empty: static.
};

// The weights and tracks with their shares. INVALID_ARGUMENT (SharesOf's, naming `weights[k]`)
// for weights that are not finite and >= 0, or all 0.
absl::StatusOr<std::shared_ptr<const MixtureWeights>> MakeMixtureWeights(
    std::vector<double> weights, std::vector<mixture::GroupTrack> tracks);

// The groups before the window of `epoch`: K lags (apportion.h's e_k), K cursors, and the
// weights in force at `epoch` (null: an online job's epoch whose predecessor's losses have not
// updated them yet).
struct MixtureState {
  uint64_t epoch = 0;
  std::vector<mixture::int128> lags;
  std::vector<mixture::GroupCursor> cursors;
  std::shared_ptr<const MixtureWeights> weights;
};

// An epoch of a mixture job: the state its window started from and the window's counts.
struct MixtureEpoch {
  std::shared_ptr<const MixtureState> start;
  std::vector<uint64_t> counts;  // c_k, adding up to M.
};

// A mixture job's plan of one epoch.
struct MixturePlan {
  Plan plan;
  std::shared_ptr<const MixtureEpoch> epoch;
};

class MixturePlanner {
 public:
  // The states kept (besides epoch 0's, which is recomputed at no cost).
  static constexpr int kKeptStates = 4;

  // The memory of a full weight history (WeightHistory: MAX_WEIGHT_HISTORY epochs of
  // MAX_STATUS_GROUPS groups, 12 bytes each in a proto with ~64 bytes of overhead), held by the
  // job and by each kept epoch start: ~1 MiB.
  static constexpr uint64_t kWeightHistoryBytes =
      uint64_t{v1::MAX_WEIGHT_HISTORY} * (uint64_t{v1::MAX_STATUS_GROUPS} * 12 + 64);

  // The host memory of a job's planner besides its plans, at its peak, for K = `groups`, M =
  // `window`: the kept states (kKeptStates + 2 alive while planning, 80 bytes per group each
  // with their weights), the counts, the backend's window scratch
  // (ComputeBackend::MixtureWindowScratchBytes), and a 64-bit copy of the window when plans are
  // narrow (Plan::Narrow(num_samples)). The config's own arrays are MixtureConfig::Bytes.
  static uint64_t ScratchBytes(const ComputeBackend& backend, uint64_t groups, uint64_t window,
                               uint64_t num_samples);

  // `config` validated (MakeMixtureConfig); M = `window` in [1, 2^34]; the windows are computed
  // by `backend` (ComputeBackend::PlanMixtureWindow), which must outlive the planner.
  MixturePlanner(std::shared_ptr<const MixtureConfig> config, uint64_t seed, uint64_t window,
                 ComputeBackend* backend);

  // The plan of `epoch` (its indices in 4 bytes each when N <= 2^32, else 8: Plan::Narrow), and
  // remembers the state of epoch + 1. FAILED_PRECONDITION if the weights of `epoch` (or of an
  // epoch advanced through) are not known yet (an online job: UpdateOnline first). INTERNAL if
  // an invariant of the rules fails (a state that Remember accepted cannot); a device failure
  // of the backend as it returns it (RESOURCE_EXHAUSTED or INTERNAL: compute_backend.h).
  absl::StatusOr<MixturePlan> PlanEpoch(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  // A state to start from (a snapshot's, a kept epoch start's); the states kept after it are
  // forgotten. A state without weights (a snapshot written before weights could change) takes
  // the config's static weights. DATA_LOSS, nothing kept, if it does not fit the groups: not K
  // lags and cursors, a lag out of the apportionment's bounds (Apportioner::FromLags), a
  // cursor's position not below its group's size, weights or tracks not K (or invalid), an
  // online job's state without weights.
  absl::Status Remember(MixtureState state) ABSL_LOCKS_EXCLUDED(mu_);

  // The state before the window of `epoch` (from the nearest known earlier state).
  // FAILED_PRECONDITION if it would advance through an epoch whose weights are not known.
  absl::StatusOr<std::shared_ptr<const MixtureState>> StateAt(uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Static weights (GroupWeights::SetStatic of `weights`) in force from `epoch` on: the state of
  // `epoch` takes them, later states are forgotten. INVALID_ARGUMENT naming `weights[k]`, nothing
  // changed, for bad weights; FAILED_PRECONDITION for an online job.
  absl::Status SetStaticFrom(uint64_t epoch, absl::Span<const double> weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An online job's epoch `closed_epoch` ended with per-group statistics `losses`: the weights
  // of closed_epoch + 1 are the rule (the config's `initial`, restored to the state of
  // closed_epoch: GroupWeights::Restore) updated by them (GroupWeights::Update). Returns them.
  // FAILED_PRECONDITION for a static job or if the weights of closed_epoch are not known.
  absl::StatusOr<std::shared_ptr<const MixtureWeights>> UpdateOnline(
      uint64_t closed_epoch, const mixture::GroupLosses& losses) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The counts of the window of `state.epoch` and the state after it.
  absl::StatusOr<std::shared_ptr<const MixtureState>> Advance(const MixtureState& state,
                                                              std::vector<uint64_t>* counts) const;
  // Keeps `state`; with `replace` false, a state of its epoch already kept stays (the same lags
  // and cursors, and maybe weights set for it since: a re-planned earlier epoch must not undo
  // them).
  void Keep(std::shared_ptr<const MixtureState> state, bool replace = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state of `epoch` with `weights`, kept; the states after it forgotten.
  absl::Status ReplaceWeights(uint64_t epoch, std::shared_ptr<const MixtureWeights> weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<const MixtureConfig> config_;
  const uint64_t seed_;
  const uint64_t window_;
  ComputeBackend* const backend_;
  const std::shared_ptr<const MixtureWeights> initial_;  // Epoch 0's (the config's).

  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<const MixtureState>> known_ ABSL_GUARDED_BY(mu_);
};

// The MAX_STATUS_GROUPS groups of largest weight (all when K <= MAX_STATUS_GROUPS), by weight
// descending (ties: the lower group). O(K).
std::vector<uint32_t> HeaviestGroups(absl::Span<const double> weights);

// The group weights in force at each epoch served, oldest first (proto MixtureStatus.history):
// each epoch's HeaviestGroups. At most MAX_WEIGHT_HISTORY epochs (16 groups each: ~1 MB).
using WeightHistory = std::vector<state::EpochGroupWeights>;

// `before` (null: none) with the entry of the epoch `start` opens: the entries from that epoch on
// dropped (a rewind or a re-plan), then its own appended, the oldest dropped beyond
// MAX_WEIGHT_HISTORY. Precondition: start.weights is set. O(MAX_WEIGHT_HISTORY + K).
std::shared_ptr<const WeightHistory> WithEpochWeights(const WeightHistory* before,
                                                      const MixtureState& start);

// GetJobStatus's view of a mixture job (proto MixtureStatus): K, the rule, and the
// MAX_STATUS_GROUPS groups of largest weight in `epoch` (ties: the lower group) with that
// weight, their counts in `epoch`'s window and their cursors after it (`served` false: no window
// is served, counts and cursors left unset -- proto GroupStatus; `epoch` null: nothing planned
// yet, the config's weights). O(K).
void DescribeMixture(const MixtureConfig& config, const MixtureEpoch* epoch, bool served,
                     v1::MixtureStatus* out);

// The state as a snapshot holds it (server/persistence/state.proto), and back: FromProto is
// DATA_LOSS for arrays of different lengths (Remember checks the rest).
state::MixtureState MixtureStateToProto(const MixtureState& state);
absl::StatusOr<MixtureState> MixtureStateFromProto(const state::MixtureState& proto);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_MIXTURE_PLANNER_H_
