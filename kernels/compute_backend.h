// ComputeBackend: what a backend of samplerd's numerical core implements (weight recompute,
// epoch planning, shard extraction); the data it works on is defined beside it (plan.h,
// shard.h, weight_policy.h, loss_stats.h).
//
// Two implementations: the multithreaded CPU backend (cpu_backend.h) and, later, a CUDA backend.
// Both obey the determinism contract (docs/SAMPLING.md): given bit-identical inputs they return
// bit-identical outputs, on any machine and any thread count.
//
// Nothing here knows about gRPC or jobs; the server calls these functions with plain data.
// Implementations are thread-safe: concurrent calls on one backend object are allowed.
//
// Every function validates its inputs first. On a bad input it returns INVALID_ARGUMENT (or
// FAILED_PRECONDITION where the input is fine but the state is not, e.g. too few positive
// weights) with a message naming the field and the value, and writes nothing to its outputs.
#ifndef SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
#define SAMPLERD_KERNELS_COMPUTE_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/loss_stats.h"
#include "kernels/plan.h"
#include "kernels/shard.h"
#include "kernels/weight_policy.h"

namespace samplerd {

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;

  // W_{e+1} from the base weights, the current weights W_e and the loss statistics, after epoch
  // `closed_epoch` ended (samples with last_epoch == EpochMarker(closed_epoch) were seen in it).
  //   base:     N base weights (mean 1), or empty for uniform.
  //   current:  W_e, N entries, or empty for all ones (uniform W_e). Validated when given; only
  //             the multiplicative policy reads it (and updates it).
  //   out:      N entries; may alias `current`. Result normalised to mean 1.
  // With LossWeightKind::kNone the result is the base weights.
  virtual absl::Status RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                        absl::Span<const float> base,
                                        absl::Span<const float> current, LossStatsView stats,
                                        absl::Span<float> out) = 0;

  // The plan of `epoch`: a pure function of (spec, epoch, weights).
  //   weights: N entries, or empty for uniform weights.
  // Without replacement: Efraimidis-Spirakis selection of the M smallest keys (ties by index),
  // then a uniform shuffle; with M == N the weights have no effect. FAILED_PRECONDITION if fewer
  // than M weights are positive. With replacement: quantised weights, exact prefix sums; draw j
  // depends only on (seed, epoch, j).
  virtual absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                         absl::Span<const float> weights) = 0;

  // An upper bound on the host memory that PlanEpoch(spec, ...) allocates besides the plan it
  // returns (draw tables, selection keys, shuffle buffers), at its peak; `weighted`: with
  // weights (not empty). The server admits a job by memory with it before allocating anything
  // (server/job_memory.h). Saturates at UINT64_MAX. No plan is needed for it: pure arithmetic.
  virtual uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const = 0;

  // Copies rank `rank`'s shard positions [start, start + out.size()) of `plan` into `out`.
  // INVALID_ARGUMENT if rank >= world_size or the range passes the shard's end.
  virtual absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                    uint64_t start, absl::Span<uint64_t> out) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
