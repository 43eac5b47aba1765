// The plan definition of docs/SAMPLING.md as plain, sequential host code: what the device
// kernels (device_plan.h) are compared with on the GPU machine, where the CPU backend cannot be
// built (it needs Abseil; the GPU machine has none). Written for obviousness, not speed: one
// sample at a time through the same per-element rules (plan_math.h).
//
// reference_test.cc checks these against the CPU backend in CI, so the chain GPU == reference ==
// CPU backend holds. Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_CUDA_REFERENCE_H_
#define SAMPLERD_KERNELS_CUDA_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/cuda/plan_math.h"

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
std::vector<uint64_t> Shard(const std::vector<uint64_t>& plan, ShardLayout layout, uint32_t rank,
                            uint64_t start, uint64_t count);

// Length of rank `rank`'s shard (ShardLength of compute_backend.h).
uint64_t ShardLength(uint64_t plan_length, ShardLayout layout, uint32_t rank);

}  // namespace reference
}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_REFERENCE_H_
