#include "server/epoch_planner.h"

#include <memory>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/loss_policies.h"
#include "server/metrics/process_metrics.h"

namespace samplerd {
namespace {

double MillisSince(absl::Time start) { return absl::ToDoubleMilliseconds(absl::Now() - start); }

}  // namespace

EpochPlanner::EpochPlanner(const JobConfig& config, ComputeBackend* backend)
    : config_(config),
      backend_(backend),
      mixture_(config.mixture == nullptr
                   ? nullptr
                   : std::make_unique<MixturePlanner>(config.mixture, config.plan.seed,
                                                      config.plan.samples_per_epoch, backend)) {}

absl::StatusOr<EpochPlanner::Computed> EpochPlanner::Compute(uint64_t epoch,
                                                             const BackendWeights* weights) {
  Computed out;
  if (mixture_ != nullptr) {
    absl::StatusOr<MixturePlan> planned = mixture_->PlanEpoch(epoch);
    if (!planned.ok()) return planned.status();
    out.plan = std::move(planned->plan);
    out.mixture = std::move(planned->epoch);
    return out;
  }
  absl::StatusOr<samplerd::Plan> plan = backend_->PlanEpoch(config_.plan, epoch, weights);
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
  return out;
}

EpochPlanner::~EpochPlanner() { Stop(); }

bool EpochPlanner::PlanIgnoresWeights(const JobConfig& config) {
  const PlanSpec& p = config.plan;
  if (config.mixture != nullptr) return !config.mixture->online();
  return p.order == SampleOrder::kSequential || p.EveryIndexOnce() ||
         (config.policy.base == BaseWeightKind::kUniform &&
          !UsesLossStats(config.policy));
}

absl::StatusOr<PlannedEpoch> EpochPlanner::Plan(uint64_t epoch,
                                                std::shared_ptr<const BackendWeights> weights) {
  return PlanWith(epoch, std::move(weights), 0.0);
}

absl::StatusOr<std::shared_ptr<const BackendWeights>> EpochPlanner::Recompute(
    uint64_t closed_epoch, const RecomputeInputs& inputs) const {
  // Without a loss factor the weights stay (W_e is the base weights, or uniform).
  if (!UsesLossStats(config_.policy)) return inputs.current;
  return backend_->RecomputeWeights(
      config_.policy, closed_epoch, inputs.base.get(), inputs.current.get(), inputs.losses,
      inputs.irreducible != nullptr ? absl::MakeConstSpan(*inputs.irreducible)
                                    : absl::Span<const float>());
}

absl::Status EpochPlanner::MoveGroupWeights(uint64_t closed_epoch, const RecomputeInputs& inputs) {
  if (mixture_ == nullptr) return absl::OkStatus();
  if (inputs.group_losses != nullptr) {
    return mixture_->UpdateOnline(closed_epoch, *inputs.group_losses).status();
  }
  if (inputs.group_weights.has_value()) {
    // The plan computed ahead for closed_epoch + 1 had the old weights (and kept the state after
    // it): dropped before the new weights replace the states from closed_epoch + 1 on.
    DiscardAhead();
    return mixture_->SetStaticFrom(closed_epoch + 1, *inputs.group_weights);
  }
  return absl::OkStatus();
}

void EpochPlanner::DiscardAhead() {
  absl::MutexLock lock(&ahead_mu_);
  if (ahead_.valid()) {
    ahead_.wait();
    ahead_ = {};
  }
}

absl::StatusOr<PlannedEpoch> EpochPlanner::PlanWith(uint64_t epoch,
                                                    std::shared_ptr<const BackendWeights> weights,
                                                    double recompute_ms) {
  const absl::Time start = absl::Now();
  // `stale`: a plan computed ahead for another epoch (a re-upload before the job started). Its
  // destructor waits for the computation: declared here, it runs after the lock is released.
  std::future<absl::StatusOr<Computed>> ahead, stale;
  {
    absl::MutexLock lock(&ahead_mu_);
    if (ahead_.valid()) (ahead_epoch_ == epoch ? ahead : stale) = std::move(ahead_);
  }
  // A plan computed ahead equals the one computed now: it depends on (seed, epoch) only, and
  // weights keep their zero pattern across recomputes (clamps are > 0), so it is as valid.
  absl::StatusOr<Computed> plan = ahead.valid() ? ahead.get() : Compute(epoch, weights.get());
  if (!plan.ok()) return plan.status();
  PlannedEpoch planned;
  planned.epoch = epoch;
  planned.plan_ms = MillisSince(start);
  metrics::Process().plan_seconds->Observe(planned.plan_ms / 1e3);
  planned.recompute_ms = recompute_ms;
  if (weights == nullptr) {  // Uniform: all ones.
    planned.weight_summary.min = planned.weight_summary.max = planned.weight_summary.mean = 1;
    planned.weight_summary.effective_sample_size = static_cast<double>(config_.plan.num_samples);
  } else {
    planned.weight_summary = weights->summary();  // Computed when the backend made them.
  }
  planned.view.plan = std::make_shared<const samplerd::Plan>(std::move(plan->plan));
  planned.view.mixture = std::move(plan->mixture);
  planned.view.unit_is_weights = weights == nullptr || config_.plan.EveryIndexOnce();
  planned.view.weights = std::move(weights);
  return planned;
}

bool EpochPlanner::StartNext(uint64_t closed_epoch, RecomputeInputs inputs,
                             std::function<void(absl::StatusOr<PlannedEpoch>)> done) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  // The previous task has published its epoch (the job served it since); at most it is still
  // committing that epoch's snapshot.
  if (thread_.joinable()) thread_.join();
  thread_ = std::thread([this, closed_epoch, inputs = std::move(inputs), done = std::move(done)] {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<const BackendWeights>> weights = Recompute(closed_epoch, inputs);
    if (weights.ok()) {
      if (absl::Status s = MoveGroupWeights(closed_epoch, inputs); !s.ok()) weights = s;
    }
    if (!weights.ok()) {
      done(weights.status());
    } else {
      const double recompute_ms = MillisSince(start);
      metrics::Process().recompute_seconds->Observe(recompute_ms / 1e3);
      done(PlanWith(closed_epoch + 1, *std::move(weights), recompute_ms));
    }
#if defined(__GLIBC__)
    // An epoch boundary is a quiet moment: give the memory of the epoch's freed message buffers
    // and planning scratch back to the system (glibc keeps freed blocks in per-thread arenas).
    malloc_trim(0);
#endif
  });
  return true;
}

void EpochPlanner::PlanAhead(const PlannedEpoch& published) {
  if (!PlanIgnoresWeights(config_)) return;
  absl::MutexLock lock(&ahead_mu_);
  if (ahead_stopped_) return;
  // A previous look-ahead not taken (a re-upload replaced epoch 0): wait for it before reuse.
  if (ahead_.valid()) ahead_.wait();
  ahead_epoch_ = published.epoch + 1;
  ahead_ = std::async(std::launch::async,
                      [this, epoch = ahead_epoch_, weights = published.view.weights] {
                        return Compute(epoch, weights.get());
                      });
}

void EpochPlanner::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    if (thread_.joinable()) thread_.join();
  }
  absl::MutexLock lock(&ahead_mu_);
  ahead_stopped_ = true;
  if (ahead_.valid()) ahead_.wait();
}

}  // namespace samplerd
