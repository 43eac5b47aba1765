// Element-wise plan kernels: weight scan, sequential plans, draws with replacement (uniform and
// through the quantised prefix sums of blocks of samples), shard extraction. See device_plan.h.
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_plan.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace gpu {
namespace {

using internal::AsyncBuffer;
using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;

constexpr unsigned kBlock = 256;

using ull = unsigned long long;
static_assert(sizeof(ull) == sizeof(uint64_t), "atomics on 64-bit counters");

// ---- ScanWeights -------------------------------------------------------------------------------

__global__ void InitScanKernel(WeightScan* result) {
  result->positive = 0;
  result->first_bad = ~uint64_t{0};
  result->max_bits = 0;
}

struct MinOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kBlock)
    ScanWeightsKernel(const float* weights, uint64_t n, WeightScan* result) {
  uint64_t positive = 0, first_bad = ~uint64_t{0};
  uint32_t max_bits = 0;
  for (uint64_t i = GlobalThread(); i < n; i += GridStride()) {
    const uint32_t bits = __float_as_uint(weights[i]);
    // The CPU's test on the IEEE bits: finite and >= 0 is [+0, +inf) or -0; positive is
    // (+0, +inf).
    const bool bad = bits >= 0x7f800000u && bits != 0x80000000u;
    if (bad) {
      first_bad = i < first_bad ? i : first_bad;
    } else {
      positive += bits - 1u < 0x7f7fffffu;
      max_bits = bits > max_bits && bits != 0x80000000u ? bits : max_bits;
    }
  }
  using Reduce64 = cub::BlockReduce<uint64_t, kBlock>;
  using Reduce32 = cub::BlockReduce<uint32_t, kBlock>;
  __shared__ typename Reduce64::TempStorage storage64;
  __shared__ typename Reduce32::TempStorage storage32;
  const uint64_t block_positive = Reduce64(storage64).Sum(positive);
  __syncthreads();
  const uint64_t block_bad = Reduce64(storage64).Reduce(first_bad, MinOp());
  const uint32_t block_max = Reduce32(storage32).Reduce(max_bits, MaxOp());
  if (threadIdx.x == 0) {
    atomicAdd(reinterpret_cast<ull*>(&result->positive), static_cast<ull>(block_positive));
    atomicMin(reinterpret_cast<ull*>(&result->first_bad), static_cast<ull>(block_bad));
    atomicMax(&result->max_bits, block_max);
  }
}

// ---- Sequential and uniform plans --------------------------------------------------------------

template <typename Index>
__global__ void __launch_bounds__(kBlock) SequentialKernel(uint64_t n, Index* out) {
  for (uint64_t i = GlobalThread(); i < n; i += GridStride()) out[i] = static_cast<Index>(i);
}

template <typename Index>
__global__ void __launch_bounds__(kBlock)
    UniformDrawsKernel(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first, uint64_t count,
                       Index* out) {
  for (uint64_t k = GlobalThread(); k < count; k += GridStride()) {
    out[k] =
        static_cast<Index>(MulHi64(RandomBits64(seed, epoch, RandomStream::kDraw, first + k), n));
  }
}

// ---- Weighted draws ----------------------------------------------------------------------------

// The scan's input: block b's sum of q for b < DrawBlocks(n), 0 at b = DrawBlocks(n), so that
// the exclusive scan of DrawBlocks(n) + 1 of them ends with T.
struct BlockSum {
  const float* weights;
  uint64_t n;
  double scale;
  __device__ uint64_t operator()(uint64_t block) const {
    return plan_math::BlockQuantisedSum(weights, n, scale, block);
  }
};

// The largest b in [lo, hi] with block_prefix[b] <= t (block_prefix[lo] <= t).
__device__ __forceinline__ uint64_t LastAtOrBelow(const uint64_t* block_prefix, uint64_t lo,
                                                  uint64_t hi, uint64_t t) {
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (block_prefix[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// guide[k] = the block of the smallest t of the r-range k, t = floor((k << shift) * T / 2^64):
// the largest block b with block_prefix[b] <= t (below `blocks`, as block_prefix[blocks] = T).
template <typename Index>
__global__ void __launch_bounds__(kBlock) GuideKernel(const uint64_t* block_prefix, uint64_t blocks,
                                                      uint64_t total, int bits, Index* guide) {
  const uint64_t entries = uint64_t{1} << bits;
  for (uint64_t k = GlobalThread(); k < entries; k += GridStride()) {
    const uint64_t t = MulHi64(k << (64 - bits), total);
    guide[k] = static_cast<Index>(LastAtOrBelow(block_prefix, 0, blocks - 1, t));
  }
}

// The draw for r: its block b (the largest with block_prefix[b] <= t, so t < block_prefix[b +
// 1]) lies in [guide[k], guide[k+1]] (the last range: [guide[k], blocks - 1]), t being
// nondecreasing in r; then DrawInBlock recomputes the block's q from its weights.
template <typename Index>
__global__ void __launch_bounds__(kBlock)
    WeightedDrawsKernel(DeviceDrawTable table, const Index* guide, uint64_t seed, uint64_t epoch,
                        uint64_t first, uint64_t count, Index* out) {
  const uint64_t entries = uint64_t{1} << table.guide_bits;
  const uint64_t blocks = plan_math::DrawBlocks(table.num_samples);
  const uint64_t* prefix = table.block_prefix;
  for (uint64_t j = GlobalThread(); j < count; j += GridStride()) {
    const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, first + j);
    const uint64_t t = MulHi64(r, table.total);
    const uint64_t k = r >> (64 - table.guide_bits);
    const uint64_t lo = guide[k];
    const uint64_t hi = k + 1 < entries ? static_cast<uint64_t>(guide[k + 1]) : blocks - 1;
    uint64_t b = lo;
    if (hi - lo <= 8) {
      while (b < hi && prefix[b + 1] <= t) ++b;  // Usually 0-2 steps in one sector.
    } else {
      b = LastAtOrBelow(prefix, lo, hi, t);
    }
    out[j] = static_cast<Index>(
        plan_math::DrawInBlock(table.weights, table.num_samples, table.scale, b, prefix[b], t));
  }
}

// ---- Shards ------------------------------------------------------------------------------------

template <typename Index>
__global__ void __launch_bounds__(kBlock)
    ExtractShardKernel(const Index* plan, uint64_t plan_length, ShardSpec layout, uint32_t rank,
                       uint64_t start, uint64_t count, const float* weights, uint64_t* indices,
                       float* importance) {
  for (uint64_t k = GlobalThread(); k < count; k += GridStride()) {
    const uint64_t index = plan[plan_math::ShardPlanPosition(plan_length, layout, rank, start + k)];
    indices[k] = index;
    if (importance != nullptr) importance[k] = 1.0f / weights[index];
  }
}

// Bits of a guide table over n entries: 2^g with n/4 < 2^g <= n/2 (at least 2), as the CPU's over
// samples.
int GuideBits(uint64_t n) {
  const int g = plan_math::BitWidth(n) - 2;
  return g < 1 ? 1 : g;
}

}  // namespace

cudaError_t KeepPoolMemory(int device) {
  cudaMemPool_t pool;
  SAMPLERD_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = ~uint64_t{0};
  return cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
}

cudaError_t ScanWeights(const float* weights, uint64_t n, WeightScan* result, cudaStream_t stream) {
  if (result == nullptr || (n > 0 && weights == nullptr)) return cudaErrorInvalidValue;
  InitScanKernel<<<1, 1, 0, stream>>>(result);
  SAMPLERD_CUDA_TRY_LAUNCH();
  if (n == 0) return cudaSuccess;
  ScanWeightsKernel<<<GridFor(n, kBlock), kBlock, 0, stream>>>(weights, n, result);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template <typename Index>
cudaError_t SequentialPlan(uint64_t n, Index* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (out == nullptr) return cudaErrorInvalidValue;
  SequentialKernel<<<GridFor(n, kBlock), kBlock, 0, stream>>>(n, out);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template <typename Index>
cudaError_t UniformDraws(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first, uint64_t count,
                         Index* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (out == nullptr || n == 0) return cudaErrorInvalidValue;
  UniformDrawsKernel<<<GridFor(count, kBlock), kBlock, 0, stream>>>(seed, epoch, n, first, count,
                                                                    out);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template <typename Index>
cudaError_t BuildDrawTable(const float* weights, uint64_t n, uint32_t max_weight_bits,
                           DeviceDrawTable* table, cudaStream_t stream) {
  if (weights == nullptr || n == 0 || table == nullptr || max_weight_bits == 0 ||
      max_weight_bits >= 0x7f800000u) {
    return cudaErrorInvalidValue;
  }
  DeviceDrawTable built;
  built.num_samples = n;
  built.weights = weights;
  built.scale = plan_math::QuantisationScale(n, max_weight_bits);
  const uint64_t blocks = plan_math::DrawBlocks(n);
  // Guide entries as on the CPU, but over blocks: blocks / 4 < 2^g <= blocks / 2 (at least 2).
  built.guide_bits = GuideBits(blocks);
  SAMPLERD_CUDA_TRY(cudaMallocAsync(&built.block_prefix, (blocks + 1) * sizeof(uint64_t), stream));
  cudaError_t error = [&]() -> cudaError_t {
    // Exclusive prefix sums of the blocks' sums (and a last 0): block_prefix[blocks] = T.
    // Integers: exact in any order, so CUB's tree equals the CPU's loop.
    const auto sums = thrust::make_transform_iterator(thrust::counting_iterator<uint64_t>(0),
                                                      BlockSum{weights, n, built.scale});
    size_t temp_bytes = 0;
    SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, sums, built.block_prefix,
                                                    blocks + 1, stream));
    AsyncBuffer temp;
    SAMPLERD_CUDA_TRY(temp.Allocate(temp_bytes, stream));
    SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp.as<void>(), temp_bytes, sums,
                                                    built.block_prefix, blocks + 1, stream));
    temp.Release();
    SAMPLERD_CUDA_TRY(cudaMemcpyAsync(&built.total, built.block_prefix + blocks, sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, stream));
    SAMPLERD_CUDA_TRY(cudaStreamSynchronize(stream));
    if (built.total == 0) return cudaErrorInvalidValue;  // All weights 0: not validated.
    const uint64_t entries = uint64_t{1} << built.guide_bits;
    SAMPLERD_CUDA_TRY(cudaMallocAsync(&built.guide, entries * sizeof(Index), stream));
    GuideKernel<Index><<<GridFor(entries, kBlock), kBlock, 0, stream>>>(
        built.block_prefix, blocks, built.total, built.guide_bits,
        static_cast<Index*>(built.guide));
    SAMPLERD_CUDA_TRY_LAUNCH();
    return cudaSuccess;
  }();
  if (error != cudaSuccess) {
    FreeDrawTable(&built, stream);
    return error;
  }
  *table = built;
  return cudaSuccess;
}

cudaError_t FreeDrawTable(DeviceDrawTable* table, cudaStream_t stream) {
  cudaError_t first = cudaSuccess;
  if (table->block_prefix != nullptr) first = cudaFreeAsync(table->block_prefix, stream);
  if (table->guide != nullptr) {
    const cudaError_t e = cudaFreeAsync(table->guide, stream);
    if (first == cudaSuccess) first = e;
  }
  *table = DeviceDrawTable();
  return first;
}

template <typename Index>
cudaError_t WeightedDraws(const DeviceDrawTable& table, uint64_t seed, uint64_t epoch,
                          uint64_t first, uint64_t count, Index* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (out == nullptr || table.block_prefix == nullptr || table.guide == nullptr ||
      table.weights == nullptr || table.total == 0) {
    return cudaErrorInvalidValue;
  }
  WeightedDrawsKernel<Index><<<GridFor(count, kBlock), kBlock, 0, stream>>>(
      table, static_cast<const Index*>(table.guide), seed, epoch, first, count, out);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template <typename Index>
cudaError_t ExtractShard(const Index* plan, uint64_t plan_length, ShardSpec layout, uint32_t rank,
                         uint64_t start, uint64_t count, const float* weights, uint64_t* indices,
                         float* importance, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (plan == nullptr || indices == nullptr || plan_length == 0 || layout.world_size == 0 ||
      rank >= layout.world_size || (importance != nullptr && weights == nullptr)) {
    return cudaErrorInvalidValue;
  }
  ExtractShardKernel<Index><<<GridFor(count, kBlock), kBlock, 0, stream>>>(
      plan, plan_length, layout, rank, start, count, weights, indices, importance);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

#define SAMPLERD_INSTANTIATE(Index)                                                               \
  template cudaError_t SequentialPlan<Index>(uint64_t, Index*, cudaStream_t);                     \
  template cudaError_t UniformDraws<Index>(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,      \
                                           Index*, cudaStream_t);                                 \
  template cudaError_t BuildDrawTable<Index>(const float*, uint64_t, uint32_t, DeviceDrawTable*,  \
                                             cudaStream_t);                                       \
  template cudaError_t WeightedDraws<Index>(const DeviceDrawTable&, uint64_t, uint64_t, uint64_t, \
                                            uint64_t, Index*, cudaStream_t);                      \
  template cudaError_t ExtractShard<Index>(const Index*, uint64_t, ShardSpec, uint32_t, uint64_t, \
                                           uint64_t, const float*, uint64_t*, float*,             \
                                           cudaStream_t);
SAMPLERD_INSTANTIATE(uint32_t)
SAMPLERD_INSTANTIATE(uint64_t)
#undef SAMPLERD_INSTANTIATE

}  // namespace gpu
}  // namespace samplerd
