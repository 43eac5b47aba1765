// ComputeBackend: what a backend of samplerd's numerical core implements (weight recompute,
// epoch planning, shard extraction, loss statistics), and the state it owns between epochs;
// the data it works on is defined beside it (plan.h, shard.h, weight_policy.h, loss_stats.h).
//
// Two implementations: the multithreaded CPU backend (cpu_backend.h) and the CUDA backend
// (kernels/cuda/cuda_backend.h). Both obey the determinism contract (docs/SAMPLING.md): given
// bit-identical inputs they return bit-identical outputs, on any machine and any thread count.
//
// State stays where it is computed. A job's weights (base weights and W_e) and its per-sample
// loss statistics are backend objects (BackendWeights, BackendLossStats): host memory for the
// CPU backend, device memory for CUDA, where they stay between epochs. The server holds them by
// handle and never reads them element by element; it copies them to the host only for what
// must be on the host (a snapshot, a rewindable epoch start, importance weights of a streamed
// chunk). A plan is computed where the backend computes and handed over as a host Plan: the
// server reads it for every streamed shard position and every reported loss (the check that the
// rank was served that index), so all of it crosses to the host once per epoch either way.
//
// Nothing here knows about gRPC or jobs; the server calls these functions with plain data.
// Implementations are thread-safe: concurrent calls on one backend object are allowed. Objects
// made by one backend are passed back only to that backend.
//
// Every function validates its inputs first. On a bad input it returns INVALID_ARGUMENT (or
// FAILED_PRECONDITION where the input is fine but the state is not, e.g. too few positive
// weights) with a message naming the field and the value, and changes nothing. A failure of the
// device itself (CUDA out of memory, a launch failure, a lost device) is RESOURCE_EXHAUSTED (out
// of memory) or INTERNAL carrying the CUDA error's name and string
// (kernels/cuda/cuda_status.h); the backend never falls back to another device or to the CPU in
// the middle of a job.
#ifndef SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
#define SAMPLERD_KERNELS_COMPUTE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/loss_stats.h"
#include "kernels/mixture/window.h"
#include "kernels/plan.h"
#include "kernels/shard.h"
#include "kernels/weight_policy.h"

namespace samplerd {

// N weights (mean 1, finite, >= 0, at least one > 0) held by a backend: a job's base weights or
// the weights W_e of an epoch. Immutable once made: share it as
// std::shared_ptr<const BackendWeights> (the epoch's readers, the planner, a snapshot). Uniform
// weights have no object (a null handle) anywhere in the interface.
class BackendWeights {
 public:
  virtual ~BackendWeights() = default;

  // N.
  virtual uint64_t size() const = 0;

  // Of these weights, computed when they were made (so reading it costs nothing).
  virtual const WeightSummary& summary() const = 0;

  // The weights in host memory: the backend's own vector when it keeps them on the host (no
  // copy), else a copy read back from the device (a snapshot or a kept epoch start needs it).
  // INTERNAL (a device error) if the copy fails.
  virtual absl::StatusOr<std::shared_ptr<const std::vector<float>>> ToHost() const = 0;
};

// Per-sample loss statistics of one job (SampleLossStats, N entries) held by a backend: what
// the loss policies read at the epoch boundary. Made by ComputeBackend::NewLossStats.
//
// Not thread-safe: its owner serialises every call (the Job applies losses under its lock while
// an epoch is served; the recompute reads the statistics while the job plans, when nothing
// applies). Apply may finish asynchronously (CUDA queues the applied pairs for the device);
// every later call on this object, and RecomputeWeights reading it, sees all of them.
class BackendLossStats {
 public:
  virtual ~BackendLossStats() = default;

  // N.
  virtual uint64_t size() const = 0;

  // Applies the losses of `epoch` in order: losses[k] to sample indices[k] (the EMA rule of
  // loss_stats.h, ApplyLoss), unless that sample already has a loss in `epoch`: the first
  // loss of a sample in an epoch wins (docs/SAMPLING.md, arrival order). Requires
  // indices.size() == losses.size(), every index < N and every loss finite and >= 0 (validated
  // by the caller). Returns how many were applied (the others are duplicates). The decision is
  // made at the call. Sizes and indices are checked again (CheckApplyArguments): a caller's bug
  // is INVALID_ARGUMENT with nothing applied, not a write outside the statistics. Any other
  // error is a device failure (INTERNAL carrying the CUDA error), after which the object is
  // unusable: the job fails with that error.
  virtual absl::StatusOr<uint64_t> Apply(uint64_t epoch, absl::Span<const uint64_t> indices,
                                         absl::Span<const float> losses) = 0;

  // Samples with at least one loss over the job's life.
  virtual uint64_t SamplesSeen() const = 0;

  // A host copy of all N statistics (a snapshot, a kept epoch start). INTERNAL on a device error.
  virtual absl::StatusOr<std::vector<SampleLossStats>> ToHost() const = 0;

  // Replaces every sample's statistics (a restored snapshot, a rewind): N entries, or empty for
  // "no sample seen". INVALID_ARGUMENT for another size; nothing changes then.
  virtual absl::Status Restore(absl::Span<const SampleLossStats> stats) = 0;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;

  // Makes backend weights from host weights that are already valid (NormaliseWeights or
  // ClassBalancedWeights made them, or a snapshot holds them): N >= 1 values, finite, >= 0, at
  // least one > 0. INVALID_ARGUMENT if they are not (naming the first bad one).
  virtual absl::StatusOr<std::shared_ptr<const BackendWeights>> MakeWeights(
      std::vector<float> weights) = 0;

  // New loss statistics of N samples, none seen; `ema_decay` in [0, 1) (ApplyLoss).
  virtual absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                         double ema_decay) = 0;

  // W_{e+1} after epoch `closed_epoch` ended (samples whose last_epoch is
  // EpochMarker(closed_epoch) were seen in it), from:
  //   base:    the base weights, or null for uniform.
  //   current: W_e, or null for uniform. Only the multiplicative policy reads it.
  //   stats:   the loss statistics (null only with LossWeightKind::kNone).
  //   irreducible: REDUCIBLE_LOSS's N irreducible losses in host memory (finite, >= 0: checked
  //            on upload, ValidateIrreducibleLosses); empty for the other policies (ignored).
  // The result is normalised to mean 1; with LossWeightKind::kNone it is `base` itself (null for
  // uniform): the same object, so a backend's weights class derives from
  // std::enable_shared_from_this (its weights are always made in a shared_ptr).
  // INVALID_ARGUMENT if base, current and stats do not have one size N (naming the first that
  // differs), for a missing `stats` with a loss policy, for objects of another backend (naming
  // the argument), for statistics that are not finite and >= 0 (naming the sample), or for an
  // all-zero base or current (naming it), or REDUCIBLE_LOSS without N irreducible losses.
  virtual absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats,
      absl::Span<const float> irreducible) = 0;
  // The same without irreducible losses (every policy but REDUCIBLE_LOSS). A derived class
  // brings it in with `using ComputeBackend::RecomputeWeights;`.
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats) {
    return RecomputeWeights(policy, closed_epoch, base, current, stats, {});
  }

  // The plan of `epoch`: a pure function of (spec, epoch, weights); `weights` null for uniform.
  // Without replacement: Efraimidis-Spirakis selection of the M smallest keys (ties by index),
  // then a uniform shuffle; with M == N the weights have no effect. FAILED_PRECONDITION if fewer
  // than M weights are positive. With replacement: quantised weights, exact prefix sums; draw j
  // depends only on (seed, epoch, j).
  virtual absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                         const BackendWeights* weights) = 0;

  // An upper bound on the host memory that PlanEpoch(spec, ...) allocates besides the plan it
  // returns (draw tables, selection keys, shuffle buffers, staging), at its peak; `weighted`:
  // with weights (not null). The server admits a job by memory with it before allocating
  // anything (server/job_memory.h). Saturates at UINT64_MAX. Pure arithmetic.
  virtual uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const = 0;

  // The window of epoch `epoch` of a mixture job (docs/SAMPLING.md, "Mixture jobs", "The
  // window"): mixture::PlanWindowInto's contract (kernels/mixture/window.h). Each group k of
  // `layout` contributes the next counts[k] entries of its pass order from cursors[k], and the
  // M = sum of the counts entries are shuffled under (seed, epoch) into `out` (M entries, the
  // caller's: e.g. a plan's indices). Returns the cursors after the window (O(K), on the host).
  // Bit-identical on every backend. INVALID_ARGUMENT (mixture::ValidateWindowInto's, naming the
  // field, the group and the value) with nothing written; a device failure as above.
  virtual absl::StatusOr<std::vector<mixture::GroupCursor>> PlanMixtureWindow(
      uint64_t seed, uint64_t epoch, const mixture::GroupLayout& layout,
      absl::Span<const mixture::GroupCursor> cursors, absl::Span<const uint64_t> counts,
      absl::Span<uint64_t> out) = 0;

  // An upper bound on the host memory that PlanMixtureWindow allocates besides `out` and the
  // cursors it returns, at its peak, for K = `groups` and a window of M = `window` (the
  // PlanScratchBytes of mixture jobs: server/job_memory.h). Saturates at UINT64_MAX. Pure
  // arithmetic.
  virtual uint64_t MixtureWindowScratchBytes(uint64_t groups, uint64_t window) const = 0;

  // Copies rank `rank`'s shard positions [start, start + out.size()) of `plan` into `out`.
  // INVALID_ARGUMENT if rank >= world_size or the range passes the shard's end.
  virtual absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                    uint64_t start, absl::Span<uint64_t> out) = 0;

  // Importance-sampling weights of served samples: out[k] = 1.0f / weights[indices[k]] (a
  // float division, as docs/SAMPLING.md defines it). INVALID_ARGUMENT if the sizes differ or an
  // index is >= N (naming it).
  virtual absl::Status ImportanceWeights(const BackendWeights& weights,
                                         absl::Span<const uint64_t> indices,
                                         absl::Span<float> out) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
