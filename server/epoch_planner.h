// EpochPlanner: computes one job's epochs. After epoch e closed it recomputes the weights
// W_{e+1} from the base weights, W_e and the loss statistics (the job's policy), then plans
// e + 1; for plans that do not depend on the weights it computes the next plan ahead of time.
//
// It knows nothing of the job's phases, locks or persistence: the Job gives it inputs that stay
// unchanged while it runs, and publishes what it returns (job.h). The backend does the numerics;
// a mixture job's windows are its MixturePlanner's (mixture_planner.h, host code whatever the
// backend), from the group weights of the job's config (static: nothing to recompute).
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
};

// What the recompute of W_{e+1} reads (the backend's objects). Must stay unchanged until the
// task's `done` ran.
struct RecomputeInputs {
  std::shared_ptr<const BackendWeights> base;     // Null: uniform.
  std::shared_ptr<const BackendWeights> current;  // W_e; null: uniform.
  const BackendLossStats* losses = nullptr;       // Null without a loss policy.
  // REDUCIBLE_LOSS: the irreducible losses (N); null for the other policies.
  std::shared_ptr<const std::vector<float>> irreducible;
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
  // uniform weights. Such plans are computed one epoch ahead.
  static bool PlanIgnoresWeights(const JobConfig& config);

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
