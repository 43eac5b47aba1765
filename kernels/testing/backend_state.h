// Helpers for tests that drive a ComputeBackend with host vectors: its state objects
// (BackendWeights, BackendLossStats) made from vectors, and its results read back as vectors.
#ifndef SAMPLERD_KERNELS_TESTING_BACKEND_STATE_H_
#define SAMPLERD_KERNELS_TESTING_BACKEND_STATE_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"

namespace samplerd {
namespace testutil {

// `backend`'s weights holding `w`, or null (uniform) for an empty `w`. Aborts, printing why, if
// the backend refuses them: a test that means to pass bad weights calls MakeWeights itself.
inline std::shared_ptr<const BackendWeights> WeightsOf(ComputeBackend& backend,
                                                       std::vector<float> w) {
  if (w.empty()) return nullptr;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> made = backend.MakeWeights(std::move(w));
  if (!made.ok()) {
    std::fprintf(stderr, "WeightsOf: %s\n", made.status().ToString().c_str());
    std::abort();
  }
  return *std::move(made);
}

// The values of `weights` (null: `n` ones).
inline std::vector<float> HostWeights(const BackendWeights* weights, uint64_t n) {
  if (weights == nullptr) return std::vector<float>(n, 1.0f);
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> host = weights->ToHost();
  if (!host.ok()) {
    std::fprintf(stderr, "HostWeights: %s\n", host.status().ToString().c_str());
    std::abort();
  }
  return **host;
}

// `backend`'s loss statistics holding `stats` (restored into new ones).
inline absl::StatusOr<std::unique_ptr<BackendLossStats>> LossStatsOf(
    ComputeBackend& backend, const std::vector<SampleLossStats>& stats, double ema_decay = 0.9) {
  absl::StatusOr<std::unique_ptr<BackendLossStats>> made =
      backend.NewLossStats(stats.size(), ema_decay);
  if (!made.ok()) return made.status();
  if (absl::Status s = (*made)->Restore(stats); !s.ok()) return s;
  return made;
}

// PlanEpoch with host weights (empty: uniform); MakeWeights' error if it refuses them.
inline absl::StatusOr<Plan> PlanWith(ComputeBackend& backend, const PlanSpec& spec, uint64_t epoch,
                                     std::vector<float> w) {
  std::shared_ptr<const BackendWeights> weights;
  if (!w.empty()) {
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made = backend.MakeWeights(std::move(w));
    if (!made.ok()) return made.status();
    weights = *std::move(made);
  }
  return backend.PlanEpoch(spec, epoch, weights.get());
}

// RecomputeWeights with host vectors (base, current empty: uniform) and statistics; the result
// as a vector (N ones for uniform). The first error of making the objects or of the recompute.
inline absl::StatusOr<std::vector<float>> RecomputeWith(ComputeBackend& backend,
                                                        const WeightPolicyParams& policy,
                                                        uint64_t closed_epoch,
                                                        std::vector<float> base,
                                                        std::vector<float> current,
                                                        const std::vector<SampleLossStats>& stats) {
  std::shared_ptr<const BackendWeights> base_weights, current_weights;
  for (auto [from, to] :
       {std::make_pair(&base, &base_weights), std::make_pair(&current, &current_weights)}) {
    if (from->empty()) continue;
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made =
        backend.MakeWeights(std::move(*from));
    if (!made.ok()) return made.status();
    *to = *std::move(made);
  }
  absl::StatusOr<std::unique_ptr<BackendLossStats>> loss_stats = LossStatsOf(backend, stats);
  if (!loss_stats.ok()) return loss_stats.status();
  absl::StatusOr<std::shared_ptr<const BackendWeights>> next = backend.RecomputeWeights(
      policy, closed_epoch, base_weights.get(), current_weights.get(), loss_stats->get());
  if (!next.ok()) return next.status();
  return HostWeights(next->get(), stats.size());
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_BACKEND_STATE_H_
