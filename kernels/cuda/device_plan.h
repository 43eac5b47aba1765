// Device kernels of an epoch's plan (docs/SAMPLING.md), bit-identical to the CPU backend: the
// building blocks of a CUDA ComputeBackend.
//
// A small host API without Abseil (it also builds on the GPU machine, which has none): every
// function takes device pointers and a stream, enqueues its work on that stream and returns the
// first CUDA error (cudaErrorInvalidValue for a violated precondition, before anything is
// enqueued). Results are complete when the stream is. Functions that size their scratch from a
// value computed on the device (SelectEfraimidisSpirakis, BuildDrawTable) synchronise the stream
// once to read it.
//
// Scratch memory comes from the stream-ordered allocator (cudaMallocAsync on `stream`) and is
// freed on the stream before the function returns; set the device's default memory pool's
// release threshold high (KeepPoolMemory) so that repeated plans reuse it instead of returning it
// to the driver at every synchronisation.
//
// Index: uint32_t when N <= 2^32 (plan entries and indices), uint64_t otherwise; both are
// instantiated. Preconditions are the CPU backend's, validated by the caller (ScanWeights gives
// what the weight checks need). Thread-safe: no state besides the arguments.
#ifndef SAMPLERD_KERNELS_CUDA_DEVICE_PLAN_H_
#define SAMPLERD_KERNELS_CUDA_DEVICE_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/plan_math.h"

namespace samplerd {
namespace gpu {

// Sets the release threshold of `device`'s default memory pool to "never": scratch freed by
// these functions stays reserved for the next call (cudaMemPoolTrimTo gives it back).
cudaError_t KeepPoolMemory(int device);

// ---- Weights -----------------------------------------------------------------------------------

// What the CPU's weight checks need, in one pass over n weights: ValidateWeights' verdict (the
// first bad index: not finite or < 0, by the IEEE bits, -0 allowed), the number of positive
// weights (PlanEpoch's FAILED_PRECONDITION) and the largest weight's bits (the quantisation).
struct WeightScan {
  uint64_t positive = 0;
  uint64_t first_bad = ~uint64_t{0};  // ~0: none.
  uint32_t max_bits = 0;              // Largest IEEE bit pattern among the valid weights.
};
// `result`: device memory for one WeightScan (written when the stream gets there).
cudaError_t ScanWeights(const float* weights, uint64_t n, WeightScan* result, cudaStream_t stream);

// ---- Plans -------------------------------------------------------------------------------------

// out[i] = i for i < n (SampleOrder::kSequential).
template <typename Index>
cudaError_t SequentialPlan(uint64_t n, Index* out, cudaStream_t stream);

// out[k] = floor(RandomBits64(seed, epoch, 3, first + k) * n / 2^64), k < count: uniform draws
// with replacement (also a shard's positions computed on their own: any first, any n).
template <typename Index>
cudaError_t UniformDraws(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first, uint64_t count,
                         Index* out, cudaStream_t stream);

// The draw table of weighted draws with replacement: the exclusive prefix sums of the
// quantised weights at every kDrawBlock-th sample (plan_math.h) and a guide table over those
// blocks; a draw recomputes the q of one block from the weights. Owns device memory
// (FreeDrawTable), ~1.1 B per sample; borrows `weights`, which must outlive the table's draws.
struct DeviceDrawTable {
  uint64_t num_samples = 0;
  uint64_t total = 0;                // T (read back to the host while building).
  double scale = 0;                  // QuantisationScale.
  const float* weights = nullptr;    // The N weights (borrowed).
  uint64_t* block_prefix = nullptr;  // DrawBlocks(N) + 1 entries: prefix[b kDrawBlock], then T.
  void* guide = nullptr;  // 2^guide_bits entries of Index: the block of r = k << (64 - bits).
  int guide_bits = 0;
};
// n weights, finite, >= 0, at least one > 0; max_weight_bits: WeightScan::max_bits.
template <typename Index>
cudaError_t BuildDrawTable(const float* weights, uint64_t n, uint32_t max_weight_bits,
                           DeviceDrawTable* table, cudaStream_t stream);
cudaError_t FreeDrawTable(DeviceDrawTable* table, cudaStream_t stream);

// out[k] = the draw at plan position first + k: the unique i with prefix[i] <= t < prefix[i+1],
// t = floor(RandomBits64(seed, epoch, 3, first + k) * T / 2^64).
template <typename Index>
cudaError_t WeightedDraws(const DeviceDrawTable& table, uint64_t seed, uint64_t epoch,
                          uint64_t first, uint64_t count, Index* out, cudaStream_t stream);

// selected = the m indices of the smallest Efraimidis-Spirakis keys (ties by index), in
// increasing order. weights: n entries or nullptr (all 1); 1 <= m <= the number of positive
// weights (M == N needs no selection: a plain Shuffle). Passes: keys recomputed twice (a histogram
// of their top 16 bits, then the indices below the m-th key's digit as a bitmap and the candidates
// of that digit), the candidates sorted, the bitmap compacted.
template <typename Index>
cudaError_t SelectEfraimidisSpirakis(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t m,
                                     const float* weights, Index* selected, cudaStream_t stream);

// out = the uniform shuffle of docs/SAMPLING.md (bucket bits ShuffleBucketBits(m)) of the inputs
// inputs[0..m) (nullptr: 0, 1, ..., m-1). out must not overlap inputs (it also holds a
// partition on the way). m <= kMaxShuffleInputs (2^34). Scratch: 4 B (8 B with 64-bit Index)
// per input and ~0.2 B of counts (shuffle.cu).
template <typename Index>
cudaError_t Shuffle(uint64_t seed, uint64_t epoch, uint64_t m, const Index* inputs, Index* out,
                    cudaStream_t stream);

// The same with the shared-memory capacity of a block of buckets given (in inputs; 0: the
// default). Buckets whose block exceeds it are shuffled in global memory: tests force that path.
template <typename Index>
cudaError_t ShuffleWithCapacity(uint64_t seed, uint64_t epoch, uint64_t m, const Index* inputs,
                                Index* out, uint32_t block_capacity, cudaStream_t stream);

// ---- Shards ------------------------------------------------------------------------------------

// Rank `rank`'s shard positions [start, start + count) of the plan (plan_length entries):
// indices[k] = plan[plan_math::ShardPlanPosition(plan_length, layout, rank, start + k)], and, when
// importance != nullptr, importance[k] = 1.0f / weights[indices[k]] (weights: N entries). The
// caller checked the range against the shard's length.
template <typename Index>
cudaError_t ExtractShard(const Index* plan, uint64_t plan_length, ShardSpec layout, uint32_t rank,
                         uint64_t start, uint64_t count, const float* weights, uint64_t* indices,
                         float* importance, cudaStream_t stream);

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_DEVICE_PLAN_H_
