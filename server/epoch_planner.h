// EpochPlanner: computes one job's epochs. After epoch e closed it recomputes the weights
// W_{e+1} from the base weights, W_e and the loss statistics (the job's policy), then plans
// e + 1; for plans that do not depend on the weights it computes the next plan ahead of time.
//
// It knows nothing of the job's phases, locks or persistence: the Job gives it inputs that stay
// unchanged while it runs, and publishes what it returns (job.h). The backend does the numerics;
// a mixture job's windows are its MixturePlanner's (mixture_planner.h: the states and counts on
// the host, O(K); the window itself by the backend, ComputeBackend::PlanMixtureWindow), from the
// group weights in force at each epoch: after epoch e closed, an online
// rule's weights of e + 1 are updated from e's per-group losses where the per-sample policies
// recompute W_{e+1} (StartNext), and static weights set during e take effect at e + 1.
//
// Thread-safety: all methods may be called concurrently. StartNext runs one task at a time on
// the planner thread; Stop waits for it and for a look-ahead plan, after which StartNext and
// PlanAhead do nothing (a closed job starts no work).
#ifndef SAMPLERD_SERVER_EPOCH_PLANNER_H_
#define SAMPLERD_SERVER_EPOCH_PLANNER_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/compute_backend.h"
#include "server/job_config.h"
#include "server/mixture_planner.h"

namespace samplerd {

// The immutable state of one epoch that readers stream from.
struct EpochView {
  std::shared_ptr<const Plan> plan;
  // W_e, mean 1, held by the backend; null for uniform weights.
  std::shared_ptr<const BackendWeights> weights;
  // Whether importance-sampling weights are all 1 (uniform weights, or every index once per
  // epoch, where the weights have no effect).
  bool unit_is_weights = true;
  // A mixture job's epoch: the state its window started from and the window's counts; null for
  // other jobs (whose weights are `weights`).
  std::shared_ptr<const MixtureEpoch> mixture;
};

// A planned epoch, ready to be published.
struct PlannedEpoch {
  uint64_t epoch = 0;
  EpochView view;
  WeightSummary weight_summary;  // Of W_epoch (uniform: all ones, effective size N).
  double recompute_ms = 0;       // 0 when the weights were given, not recomputed.
  double plan_ms = 0;
  // A mixture job: the group weights in force at each epoch up to this one (set by the job
  // before the epoch is kept or published: WithEpochWeights); null otherwise.
  std::shared_ptr<const WeightHistory> weight_history;
};

// What the recompute of W_{e+1} reads (the backend's objects). Must stay unchanged until the
// task's `done` ran.
struct RecomputeInputs {
  std::shared_ptr<const BackendWeights> base;     // Null: uniform.
  std::shared_ptr<const BackendWeights> current;  // W_e; null: uniform.
  const BackendLossStats* losses = nullptr;       // Null without a loss policy.
  // REDUCIBLE_LOSS: the irreducible losses (N); null for the other policies.
  std::shared_ptr<const std::vector<float>> irreducible;
  // A mixture job with an online rule: the closed epoch's per-group loss statistics, which give
  // the next epoch's group weights (MixturePlanner::UpdateOnline); null otherwise.
  std::shared_ptr<const mixture::GroupLosses> group_losses;
  // A mixture job with static weights: the weights SetGroupWeights set during the closed epoch
  // (the last call's), in force from the next epoch (MixturePlanner::SetStaticFrom); unset: none.
  std::optional<std::vector<double>> group_weights;
};

class EpochPlanner {
 public:
  // `config` and `backend` must outlive the planner.
  EpochPlanner(const JobConfig& config, ComputeBackend* backend);
  ~EpochPlanner();  // Stop().

  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  // The plan of `epoch` with W_epoch = `weights` (null: uniform), on the caller's thread: epoch
  // 0 at creation or after an upload, or a restored epoch. Takes the plan computed ahead for
  // `epoch` if there is one.
  absl::StatusOr<PlannedEpoch> Plan(uint64_t epoch, std::shared_ptr<const BackendWeights> weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  // On the planner thread: W_{closed_epoch+1} from `inputs` (the policy's recompute; the current
  // weights when the policy has no loss factor), then its plan; then `done` with the result.
  // Waits for the previous task first. Returns false and runs nothing after Stop.
  bool StartNext(uint64_t closed_epoch, RecomputeInputs inputs,
                 std::function<void(absl::StatusOr<PlannedEpoch>)> done) ABSL_LOCKS_EXCLUDED(mu_);

  // Called once `published` is the job's current epoch: if plans do not depend on the weights,
  // starts computing the plan of the next epoch (one more plan in memory). No-op after Stop.
  void PlanAhead(const PlannedEpoch& published) ABSL_LOCKS_EXCLUDED(mu_, ahead_mu_);

  // Waits for the running task and the look-ahead plan; later calls start nothing. Must not be
  // called from a `done` callback.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, ahead_mu_);

  // Whether a plan depends only on (seed, epoch): sequential order, every index once, or fixed
  // uniform weights, or a mixture job with static group weights. Such plans are computed one
  // epoch ahead (a mixture job's SetGroupWeights discards the plan computed ahead: DiscardAhead).
  static bool PlanIgnoresWeights(const JobConfig& config);

  // Waits for the plan computed ahead, if any, and drops it (the next epoch's inputs changed: a
  // mixture job's group weights were set, or a rewind forgets the epochs after its start).
  void DiscardAhead() ABSL_LOCKS_EXCLUDED(ahead_mu_);

  // A mixture job's planner (null for other jobs): a restored or rewound job hands it the state
  // its epoch start holds (MixturePlanner::Remember).
  MixturePlanner* mixture() const { return mixture_.get(); }

 private:
  // Plans `epoch` from `weights` (or takes the plan computed ahead) and summarises the weights.
  absl::StatusOr<PlannedEpoch> PlanWith(uint64_t epoch,
                                        std::shared_ptr<const BackendWeights> weights,
                                        double recompute_ms) ABSL_LOCKS_EXCLUDED(ahead_mu_);
  absl::StatusOr<std::shared_ptr<const BackendWeights>> Recompute(
      uint64_t closed_epoch, const RecomputeInputs& inputs) const;
  // A mixture job: the group weights of closed_epoch + 1 from `inputs` (an online rule's update,
  // or static weights set during closed_epoch); nothing to do otherwise.
  absl::Status MoveGroupWeights(uint64_t closed_epoch, const RecomputeInputs& inputs)
      ABSL_LOCKS_EXCLUDED(ahead_mu_);
  // A plan and, for a mixture job, its window's epoch.
  struct Computed {
    samplerd::Plan plan;
    std::shared_ptr<const MixtureEpoch> mixture;
  };
  // The plan of `epoch`: the mixture planner's, or the backend's from `weights`.
  absl::StatusOr<Computed> Compute(uint64_t epoch, const BackendWeights* weights)
      ABSL_LOCKS_EXCLUDED(ahead_mu_);

  const JobConfig& config_;
  ComputeBackend* const backend_;
  const std::unique_ptr<MixturePlanner> mixture_;  // Thread-safe on its own.

  // Lock order: mu_, then ahead_mu_.
  absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(ahead_mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex ahead_mu_;
  bool ahead_stopped_ ABSL_GUARDED_BY(ahead_mu_) = false;
  uint64_t ahead_epoch_ ABSL_GUARDED_BY(ahead_mu_) = 0;
  std::future<absl::StatusOr<Computed>> ahead_ ABSL_GUARDED_BY(ahead_mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_EPOCH_PLANNER_H_
