// The argument checks that every ComputeBackend makes the same way (compute_backend.h), so that
// the CPU and the CUDA backend return the same status, code and message, for the same bad input.
// Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_BACKEND_CHECKS_H_
#define SAMPLERD_KERNELS_BACKEND_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/compute_backend.h"
#include "kernels/weight_policy.h"

namespace samplerd {

// INVALID_ARGUMENT for an object (`field`) that another backend made: objects go back only to
// the backend that made them. `backend`: the refusing backend's name().
absl::Status ForeignObject(absl::string_view field, absl::string_view backend);

// `object` as the backend's own type `Own`: null for null, ForeignObject for another backend's.
template <typename Own, typename Base>
absl::StatusOr<const Own*> OwnObject(const Base* object, absl::string_view field,
                                     absl::string_view backend) {
  if (object == nullptr) return nullptr;
  const Own* own = dynamic_cast<const Own*>(object);
  if (own == nullptr) return ForeignObject(field, backend);
  return own;
}

// NewLossStats: 1 <= num_samples <= 2^40 (the exact sums' limit), ema_decay in [0, 1).
absl::Status CheckNewLossStats(uint64_t num_samples, double ema_decay);

// RecomputeWeights' inputs (after the backend made sure they are its own): the policy
// (ValidatePolicy), one size N for base, current and stats (the first given sets it; a
// mismatch names both), the statistics present with a loss policy, and base weights present
// with loss_within_groups (CheckGroupBase), and N irreducible losses with REDUCIBLE_LOSS
// (CheckIrreducible). Returns N (0 when nothing is given: uniform weights and no loss policy).
absl::StatusOr<uint64_t> CheckRecomputeInputs(const WeightPolicyParams& policy,
                                              const BackendWeights* base,
                                              const BackendWeights* current,
                                              const BackendLossStats* stats,
                                              absl::Span<const float> irreducible);

// REDUCIBLE_LOSS needs N irreducible losses: INVALID_ARGUMENT naming `irreducible_losses` when
// there are none, or another number. OK for every other policy.
absl::Status CheckIrreducible(const WeightPolicyParams& policy, uint64_t n,
                              absl::Span<const float> irreducible);

// policy.loss_within_groups needs base weights (the groups are the samples of equal base
// weight): INVALID_ARGUMENT naming `base` when `has_base` is false.
absl::Status CheckGroupBase(const WeightPolicyParams& policy, bool has_base);

// BackendLossStats::Apply's arguments for statistics of N samples: as many losses as indices,
// every index < N (the first that is not, named). The caller validated them; backends check
// again so that a caller's bug is an error, not a write outside the statistics.
absl::Status CheckApplyArguments(uint64_t num_samples, absl::Span<const uint64_t> indices,
                                 absl::Span<const float> losses);

// ImportanceWeights' arguments for weights of N samples: as many outputs as indices, every
// index < N (the first that is not, named).
absl::Status CheckImportanceArguments(uint64_t num_samples, absl::Span<const uint64_t> indices,
                                      absl::Span<const float> out);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_BACKEND_CHECKS_H_
