// Plans: what an epoch's plan depends on (PlanSpec) and the plan itself (Plan), shared by every
// backend and by the server. Plain data; docs/SAMPLING.md defines the plan's contents.
#ifndef SAMPLERD_KERNELS_PLAN_H_
#define SAMPLERD_KERNELS_PLAN_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/large_array.h"

namespace samplerd {

enum class SampleOrder {
  kWeightedRandom,  // Draw M of N by weight (with or without replacement), then shuffle.
  kSequential,      // 0, 1, ..., N-1; requires M == N and no replacement.
};

// Everything an epoch's plan depends on besides the epoch number and the weights.
struct PlanSpec {
  uint64_t num_samples = 0;        // N >= 1.
  uint64_t samples_per_epoch = 0;  // M >= 1 (already resolved: callers turn "0 = N" into N).
  uint64_t seed = 0;
  bool replacement = false;
  SampleOrder order = SampleOrder::kWeightedRandom;

  // Without replacement and M == N every sample appears exactly once per epoch: the weights
  // cannot change which samples are drawn, only their order (and importance weights are all 1).
  bool EveryIndexOnce() const { return !replacement && samples_per_epoch == num_samples; }
};

// OK if a plan of `spec` is defined (docs/SAMPLING.md): N >= 1, M >= 1, M <= N without
// replacement, M <= 2^34 for a shuffle (its counters' limit), SEQUENTIAL only with M = N and no
// replacement. INVALID_ARGUMENT naming the field ("samples_per_epoch = ...") otherwise. The one
// check, for the backends and for job creation (which prefixes "spec.").
absl::Status ValidatePlanSpec(const PlanSpec& spec);

// The sampled indices of one epoch, in the order they are served. Immutable once built; share it
// as std::shared_ptr<const Plan> between readers.
//
// Stored in 4 bytes per index when N <= 2^32 (indices32), 8 bytes otherwise (indices64): exactly
// one of the two holds the M entries.
struct Plan {
  uint64_t epoch = 0;
  uint64_t num_samples = 0;         // N, for range checks and index encoding.
  LargeVector<uint32_t> indices32;  // Huge pages: see large_array.h.
  LargeVector<uint64_t> indices64;

  static bool Narrow(uint64_t num_samples) { return num_samples <= (uint64_t{1} << 32); }
  uint64_t size() const { return Narrow(num_samples) ? indices32.size() : indices64.size(); }
  uint64_t operator[](uint64_t position) const {
    return Narrow(num_samples) ? indices32[position] : indices64[position];
  }
};

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_PLAN_H_
