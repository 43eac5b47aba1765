// MixturePlanner: a mixture job's plans from epoch to epoch (docs/SAMPLING.md, "Mixture jobs").
// The plan of epoch e is the window of PlanWindow (kernels/mixture/window.h) from the state
// before it -- each group's apportionment lag and cursor (MixtureState) -- with the counts of the
// apportionment of M = samples_per_epoch under the job's shares (kernels/mixture/apportion.h).
// With static weights that state is a function of (config, e): the state of epoch 0 (every lag
// 0, every cursor at position 0 of pass 0) advanced one window at a time by each window's counts
// (no window need be computed for that: O(K) per epoch). The planner keeps kKeptStates states:
// each state it reaches or is handed (Remember) is kept, and the oldest others make room (never
// the one just kept). It advances from the nearest known earlier one (or from epoch 0), so the
// next epoch costs O(K + M); a restart and a rewind hand it the state their snapshot or kept
// epoch start holds (Remember), so they do not start over from epoch 0 -- a rewind to epoch 4
// while 5..8 are kept plans epoch 4 from the state handed to it, and epoch 5 from epoch 4's.
//
// Memory: O(K) per kept state (32 bytes per group), the window O(M): nothing per sample.
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
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/window_math.h"
#include "kernels/plan.h"
#include "server/mixture_config.h"
#include "server/persistence/state.pb.h"

namespace samplerd {

// The groups before the window of `epoch`: K lags (apportion.h's e_k) and K cursors.
struct MixtureState {
  uint64_t epoch = 0;
  std::vector<mixture::int128> lags;
  std::vector<mixture::GroupCursor> cursors;
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

  // The threads a job's window is computed on: the machine's cores (not yet the CPU backend's
  // --planner_threads).
  static int DefaultThreads();

  // The memory of a job's planner besides its plans, at its peak, for K = `groups`, M =
  // `window`: the kept states (kKeptStates + 2 alive while planning, 32 bytes per group each),
  // the counts, PlanWindowInto's scratch, and a 64-bit copy of the window when plans are narrow
  // (Plan::Narrow(num_samples)). The config's own arrays are MixtureConfig::Bytes.
  static uint64_t ScratchBytes(uint64_t groups, uint64_t window, uint64_t num_samples);

  // `config` validated (MakeMixtureConfig); M = `window` in [1, 2^34]; the window is computed on
  // `threads` threads (changes only the speed).
  MixturePlanner(std::shared_ptr<const MixtureConfig> config, uint64_t seed, uint64_t window,
                 int threads);

  // The plan of `epoch` (its indices in 4 bytes each when N <= 2^32, else 8: Plan::Narrow), and
  // remembers the state of epoch + 1. INTERNAL if an invariant of the rules fails (a state that
  // Remember accepted cannot).
  absl::StatusOr<MixturePlan> PlanEpoch(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  // A state to start from (a snapshot's, a kept epoch start's). DATA_LOSS, nothing kept, if it
  // does not fit the groups: not K lags and cursors, a lag out of the apportionment's bounds
  // (Apportioner::FromLags), a cursor's position not below its group's size.
  absl::Status Remember(MixtureState state) ABSL_LOCKS_EXCLUDED(mu_);

  // The state before the window of `epoch` (from the nearest known earlier state).
  absl::StatusOr<std::shared_ptr<const MixtureState>> StateAt(uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The counts of the window of `state.epoch` and the state after it.
  absl::StatusOr<std::shared_ptr<const MixtureState>> Advance(const MixtureState& state,
                                                              std::vector<uint64_t>* counts) const;
  void Keep(std::shared_ptr<const MixtureState> state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const MixtureConfig> config_;
  const uint64_t seed_;
  const uint64_t window_;
  const int threads_;

  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<const MixtureState>> known_ ABSL_GUARDED_BY(mu_);
};

// GetJobStatus's view of a mixture job (proto MixtureStatus): K, and the MAX_STATUS_GROUPS
// groups of largest weight (ties: the lower group) with their counts in `epoch`'s window and
// their cursors after it (`epoch` null: no window served, counts and cursors left unset -- proto
// GroupStatus). O(K).
void DescribeMixture(const MixtureConfig& config, const MixtureEpoch* epoch,
                     v1::MixtureStatus* out);

// The state as a snapshot holds it (server/persistence/state.proto), and back: FromProto is
// DATA_LOSS for arrays of different lengths (Remember checks the rest).
state::MixtureState MixtureStateToProto(const MixtureState& state);
absl::StatusOr<MixtureState> MixtureStateFromProto(const state::MixtureState& proto);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_MIXTURE_PLANNER_H_
