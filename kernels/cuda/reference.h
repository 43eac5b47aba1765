// The plan and weight definitions of docs/SAMPLING.md as plain, sequential host code: what the
// device kernels (device_plan.h, device_weights.h) are compared with on the GPU machine, where
// the CPU backend cannot be built (it needs Abseil; the GPU machine has none). Written for
// obviousness, not speed: one sample at a time through the same per-element rules
// (kernels/plan_math.h, kernels/weight_math.h) and exact_sum.h's sums chunk by chunk.
//
// reference_test.cc checks these against the CPU backend in CI, so the chain GPU == reference ==
// CPU backend holds. Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_CUDA_REFERENCE_H_
#define SAMPLERD_KERNELS_CUDA_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cuda/device_weights.h"  // RecomputeParams, RecomputeCheck, WeightSummaryValues.
#include "kernels/loss_stats.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace gpu {
namespace reference {

// Indices of the m smallest (EsKeyBits, index) pairs of samples [0, n), in increasing order.
// weights: n entries or nullptr (all 1). 1 <= m <= the number of positive weights.
std::vector<uint64_t> SelectEfraimidisSpirakis(uint64_t seed, uint64_t epoch, uint64_t n,
                                               uint64_t m, const float* weights);

// The shuffle of `inputs` with 2^bucket_bits buckets: partition by ShuffleBucketOf (stable),
// then each bucket's Fisher-Yates with its SwapWords. bucket_bits: ShuffleBucketBits(m), the
// definition's rule for both backends (a parameter so that tests can try other bucket counts).
std::vector<uint64_t> Shuffle(uint64_t seed, uint64_t epoch, const std::vector<uint64_t>& inputs,
                              int bucket_bits);

// prefix[i] = q_0 + ... + q_{i-1} (n + 1 entries) of the quantised weights (finite, >= 0, one > 0).
std::vector<uint64_t> QuantisedPrefix(const float* weights, uint64_t n);

// Draws at plan positions [first, first + count): by binary search over `prefix` (weights), or
// floor(r * n / 2^64) (prefix empty: uniform over n).
std::vector<uint64_t> Draws(const std::vector<uint64_t>& prefix, uint64_t n, uint64_t seed,
                            uint64_t epoch, uint64_t first, uint64_t count);

// A whole plan: kind and sizes as PlanSpec (compute_backend.h). weights: n entries or nullptr.
// bucket_bits_rule(m): the shuffle's bucket bits (ShuffleBucketBits for the GPU definition).
struct PlanInputs {
  uint64_t n = 0, m = 0, seed = 0, epoch = 0;
  bool replacement = false;
  bool sequential = false;
  const float* weights = nullptr;
};
std::vector<uint64_t> Plan(const PlanInputs& in, int (*bucket_bits_rule)(uint64_t));

// Rank `rank`'s shard positions [start, start + count) of `plan`.
std::vector<uint64_t> Shard(const std::vector<uint64_t>& plan, const ShardSpec& layout,
                            uint32_t rank, uint64_t start, uint64_t count);

// ---- Weights -----------------------------------------------------------------------------------

// The exact sum (exact_sum.h) of term(0), ..., term(n - 1): SumChunk over each chunk of
// exact_sum::kChunk terms, then Total.
double ExactSum(uint64_t n, const std::function<double(uint64_t)>& term);

// RecomputeWeights (device_weights.h, CpuBackend::RecomputeWeights) one sample at a time: the
// check of the first pass and, when it passes, W_{e+1} (else `weights` is empty). base, current:
// n entries or nullptr (all 1); stats: n entries.
struct Recomputed {
  RecomputeCheck check;
  std::vector<float> weights;
};
Recomputed RecomputeWeights(const RecomputeParams& params, uint64_t n, const float* base,
                            const float* current, const SampleLossStats* stats);

// SummarizeWeights (device_weights.h) of n >= 1 valid weights.
WeightSummaryValues SummarizeWeights(const float* weights, uint64_t n);

// ApplyLoss(stats[indices[k]], losses[k], marker, decay) for k in order.
void ApplyLosses(std::vector<SampleLossStats>& stats, const std::vector<uint64_t>& indices,
                 const std::vector<float>& losses, uint16_t marker, float decay);

// 1.0f / weights[indices[k]].
std::vector<float> GatherImportance(const float* weights, const std::vector<uint64_t>& indices);

}  // namespace reference
}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_REFERENCE_H_
