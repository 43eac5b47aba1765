// Device kernels of the weight side of docs/SAMPLING.md, bit-identical to the CPU backend: the
// loss policies' recompute, the weights' summary, applying losses and importance weights. The
// building blocks of CudaBackend's state (cuda_backend.h), as device_plan.h is for its plans.
//
// A small host API without Abseil (it also builds on the GPU machine, which has none): every
// function takes device pointers and a stream, enqueues its work on that stream and returns the
// first CUDA error (cudaErrorInvalidValue for a violated precondition, before anything is
// enqueued). Functions that return a value to the host (RecomputeWeights' check, the summary)
// synchronise the stream to read it. Scratch comes from the stream-ordered allocator
// (device_plan.h, KeepPoolMemory). Thread-safe: no state besides the arguments.
#ifndef SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_
#define SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loss_stats.h"

namespace samplerd {
namespace gpu {

// A loss policy's parameters (WeightPolicyParams of kernels/weight_policy.h without Abseil,
// already validated by ValidatePolicy), and the marker of the closed epoch.
struct RecomputeParams {
  enum class Kind { kLoss, kMultiplicative } kind = Kind::kLoss;
  double alpha = 1.0, epsilon = 1e-3, mix = 0.0;   // kLoss.
  bool has_prior_loss = false;                     // kLoss: else the mean EMA of the seen.
  double prior_loss = 0.0;
  double eta = 1.0;                                // kMultiplicative.
  double clamp_lo = 0.1, clamp_hi = 10.0;
  uint16_t marker = 0;  // EpochMarker(closed epoch): kMultiplicative's "seen in it".
};

// What the first pass of RecomputeWeights found: the CPU backend's validation of its inputs.
struct RecomputeCheck {
  // The lowest index with a bad entry: a base or current weight not finite or < 0, or the EMA of
  // a sample with count > 0 or last_epoch > 0 not finite or < 0. ~0: none.
  uint64_t first_bad = ~uint64_t{0};
  bool base_positive = false;     // Some base weight > 0 (false when base is nullptr).
  bool current_positive = false;  // Some current weight > 0 (false when current is nullptr).
};

// W_{e+1} (n entries, mean 1) from base and current weights (nullptr: all 1) and the loss
// statistics, by the passes of CpuBackend::RecomputeWeights (exact sums over exact_sum::kChunk
// samples), into `out` (must not overlap the inputs). Fills *check (host memory) first; if it
// finds a bad entry, an all-zero base, or (kMultiplicative) an all-zero current, nothing is
// written to `out` and the caller turns *check into the CPU backend's error. n >= 1.
cudaError_t RecomputeWeights(const RecomputeParams& params, uint64_t n, const float* base,
                             const float* current, const SampleLossStats* stats, float* out,
                             RecomputeCheck* check, cudaStream_t stream);

// SummarizeWeights (weight_policy.h) of n device weights: min, max, mean = S1 / n and the
// effective sample size S1^2 / S2, with S1 and S2 the exact sums (exact_sum.h) of w and of
// double(w)^2, and the number of zeros. The same bits as the CPU. n >= 1; *summary in host
// memory.
struct WeightSummaryValues {
  double min = 0, max = 0, mean = 0, effective_sample_size = 0;
  uint64_t zero_count = 0;
};
cudaError_t SummarizeWeights(const float* weights, uint64_t n, WeightSummaryValues* summary,
                             cudaStream_t stream);

// ApplyLoss (loss_stats.h) of losses[k] to stats[indices[k]] for k < count, with `marker` and
// `decay`. The indices are distinct (the host decided which pairs apply: one per sample per
// epoch), so the kernel's order does not matter. indices, losses: device memory (or pinned
// host memory mapped for the device).
cudaError_t ApplyLosses(SampleLossStats* stats, const uint64_t* indices, const float* losses,
                        uint64_t count, uint16_t marker, float decay, cudaStream_t stream);

// out[k] = 1.0f / weights[indices[k]] for k < count (indices < N, checked by the caller).
cudaError_t GatherImportance(const float* weights, const uint64_t* indices, uint64_t count,
                             float* out, cudaStream_t stream);

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_
