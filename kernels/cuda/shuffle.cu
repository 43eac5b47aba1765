// Shuffle on the device (device_plan.h; the definition: docs/SAMPLING.md with b =
// ShuffleBucketBits(m), i.e. buckets of 512-1024 inputs on average).
//
//   1. bucket numbers: one Philox block gives the buckets of four inputs (keys[k] = B_k,
//      values[k] = k);
//   2. a stable partition by bucket: CUB's radix sort of (B_k, k) pairs on the b low bits (stable,
//      and the pairs start in input order, so every bucket holds its inputs in input order);
//   3. bucket starts from the sorted bucket numbers (each bucket's start written once);
//   4. Fisher-Yates: a block of 32 threads per 32 consecutive buckets (contiguous after the
//      partition), one bucket per thread. The block's entries are permuted as 16-bit
//      block-relative offsets in shared memory (~64 KiB a block: three blocks per multiprocessor),
//      then written out in order, each entry gathered from the partition (or from `inputs`).
//      A block whose buckets exceed the shared capacity (never at the default capacity: 22
//      standard deviations above the mean) shuffles in global memory instead.
// Passes at M = N = 1e9 (4-byte entries): keys+values written (8 B), the radix sort's 3 passes of
// 8 bits (b = 20: each reads and writes keys and values, 16 B), the Fisher-Yates gather and write
// (8 B): ~64 B per input, ~21 ms at the copy bandwidth of GPU.md. The sort dominates: the next
// step is a two-level partition that recomputes bucket numbers instead of moving them (~24 B per
// input, ~8 ms), see tools/gpu/README.md.
#include <cub/device/device_radix_sort.cuh>
#include <cstdint>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/plan_math.h"
#include "kernels/philox.h"

namespace samplerd {
namespace gpu {
namespace {

using internal::AsyncBuffer;

constexpr unsigned kBlock = 256;
constexpr unsigned kBucketsPerBlock = 32;  // One warp: one bucket per thread.
// Inputs of a block's 32 buckets held in shared memory (16-bit offsets: < 2^16). Their mean is
// at most 32 * 1024 = 32768, their standard deviation at most 181.
constexpr uint32_t kDefaultCapacity = 36864;
constexpr uint32_t kMaxCapacity = 1u << 16;

// Step 1: thread c computes the buckets of inputs 4c .. 4c + 3.
template <typename Index>
__global__ void __launch_bounds__(kBlock)
    BucketKeysKernel(uint64_t seed, uint64_t epoch, uint64_t m, int bits, uint32_t* keys,
                     Index* positions) {
  const uint64_t counters = (m + 3) / 4;
  for (uint64_t c = internal::GlobalThread(); c < counters; c += internal::GridStride()) {
    const Philox4x32Counter block = RandomBlock(seed, epoch, RandomStream::kShuffle, c);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t k = 4 * c + w;
      if (k < m) {
        keys[k] = block.v[w] >> (32 - bits);
        positions[k] = static_cast<Index>(k);
      }
    }
  }
}

// Step 3: starts[B] = the first position p whose bucket is >= B, for B in [0, buckets];
// position p writes the starts of the buckets in (bucket[p-1], bucket[p]] (p = m: up to
// `buckets`). keys == nullptr: every input is in bucket 0.
__global__ void __launch_bounds__(kBlock)
    BucketStartsKernel(const uint32_t* keys, uint64_t m, uint64_t buckets, uint64_t* starts) {
  for (uint64_t p = internal::GlobalThread(); p <= m; p += internal::GridStride()) {
    const uint64_t from = p == 0 ? 0 : (keys == nullptr ? 0 : keys[p - 1]) + 1;
    const uint64_t to = p == m ? buckets : (keys == nullptr ? 0 : keys[p]);
    for (uint64_t b = from; b <= to; ++b) starts[b] = p;
  }
}

// The value of partition position p: the input k that sits there, mapped through `inputs`.
template <typename Index>
__device__ __forceinline__ Index ValueAt(const Index* positions, const Index* inputs, uint64_t p) {
  const uint64_t k = positions == nullptr ? p : static_cast<uint64_t>(positions[p]);
  return inputs == nullptr ? static_cast<Index>(k) : inputs[k];
}

// Step 4.
template <typename Index>
__global__ void __launch_bounds__(kBucketsPerBlock)
    FisherYatesKernel(uint64_t seed, uint64_t epoch, uint64_t buckets, const uint64_t* starts,
                      const Index* positions, const Index* inputs, Index* out,
                      uint32_t capacity) {
  extern __shared__ uint16_t offsets[];  // `capacity` entries.
  const uint64_t b0 = static_cast<uint64_t>(blockIdx.x) * kBucketsPerBlock;
  const uint64_t b1 = b0 + kBucketsPerBlock < buckets ? b0 + kBucketsPerBlock : buckets;
  const uint64_t s = starts[b0], length = starts[b1] - s;
  const uint64_t bucket = b0 + threadIdx.x;
  const bool owner = bucket < b1;
  const uint64_t first = owner ? starts[bucket] : 0;
  const uint64_t n = owner ? starts[bucket + 1] - first : 0;
  SwapWords words(seed, epoch, bucket);
  if (length <= capacity) {
    for (uint64_t x = threadIdx.x; x < length; x += blockDim.x) {
      offsets[x] = static_cast<uint16_t>(x);
    }
    __syncthreads();
    uint16_t* a = offsets + (owner ? first - s : 0);
    for (uint64_t i = n; i-- > 1;) {
      const uint32_t j = words.SwapTarget(static_cast<uint32_t>(i));
      const uint16_t t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    __syncthreads();
    for (uint64_t x = threadIdx.x; x < length; x += blockDim.x) {
      out[s + x] = ValueAt(positions, inputs, s + offsets[x]);
    }
  } else {
    // Global-memory fallback: the partition's order copied to `out`, then each bucket shuffled
    // there (__syncthreads makes the block's global writes visible to its threads).
    for (uint64_t x = threadIdx.x; x < length; x += blockDim.x) {
      out[s + x] = ValueAt(positions, inputs, s + x);
    }
    __syncthreads();
    Index* a = out + first;
    for (uint64_t i = n; i-- > 1;) {
      const uint32_t j = words.SwapTarget(static_cast<uint32_t>(i));
      const Index t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
  }
}

}  // namespace

template <typename Index>
cudaError_t ShuffleWithCapacity(uint64_t seed, uint64_t epoch, uint64_t m, const Index* inputs,
                                Index* out, uint32_t block_capacity, cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (out == nullptr || m >= (uint64_t{1} << 40) || block_capacity > kMaxCapacity) {
    return cudaErrorInvalidValue;
  }
  if (sizeof(Index) < sizeof(uint64_t) && m > (uint64_t{1} << 32)) return cudaErrorInvalidValue;
  const uint32_t capacity = block_capacity == 0 ? kDefaultCapacity : block_capacity;
  const int bits = ShuffleBucketBits(m);
  const uint64_t buckets = uint64_t{1} << bits;

  // Steps 1 and 2 (none for one bucket: the inputs in order).
  AsyncBuffer keys_in, keys_out, positions_in, positions_out, starts;
  if (bits > 0) {
    SAMPLERD_CUDA_TRY(keys_in.Allocate(m * sizeof(uint32_t), stream));
    SAMPLERD_CUDA_TRY(keys_out.Allocate(m * sizeof(uint32_t), stream));
    SAMPLERD_CUDA_TRY(positions_in.Allocate(m * sizeof(Index), stream));
    SAMPLERD_CUDA_TRY(positions_out.Allocate(m * sizeof(Index), stream));
    BucketKeysKernel<Index><<<internal::GridFor((m + 3) / 4, kBlock), kBlock, 0, stream>>>(
        seed, epoch, m, bits, keys_in.as<uint32_t>(), positions_in.as<Index>());
    SAMPLERD_CUDA_TRY_LAUNCH();
    size_t sort_bytes = 0;
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, keys_in.as<uint32_t>(), keys_out.as<uint32_t>(),
        positions_in.as<Index>(), positions_out.as<Index>(), m, 0, bits, stream));
    AsyncBuffer temp;
    SAMPLERD_CUDA_TRY(temp.Allocate(sort_bytes, stream));
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        temp.as<void>(), sort_bytes, keys_in.as<uint32_t>(), keys_out.as<uint32_t>(),
        positions_in.as<Index>(), positions_out.as<Index>(), m, 0, bits, stream));
    temp.Release();
    keys_in.Release();
    positions_in.Release();
  }

  // Step 3.
  SAMPLERD_CUDA_TRY(starts.Allocate((buckets + 1) * sizeof(uint64_t), stream));
  BucketStartsKernel<<<internal::GridFor(m + 1, kBlock), kBlock, 0, stream>>>(
      bits > 0 ? keys_out.as<uint32_t>() : nullptr, m, buckets, starts.as<uint64_t>());
  SAMPLERD_CUDA_TRY_LAUNCH();
  keys_out.Release();

  // Step 4.
  const size_t shared = capacity * sizeof(uint16_t);
  SAMPLERD_CUDA_TRY(cudaFuncSetAttribute(FisherYatesKernel<Index>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared)));
  const uint64_t blocks = (buckets + kBucketsPerBlock - 1) / kBucketsPerBlock;
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
  FisherYatesKernel<Index><<<static_cast<unsigned>(blocks), kBucketsPerBlock, shared, stream>>>(
      seed, epoch, buckets, starts.as<uint64_t>(), bits > 0 ? positions_out.as<Index>() : nullptr,
      inputs, out, capacity);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template <typename Index>
cudaError_t Shuffle(uint64_t seed, uint64_t epoch, uint64_t m, const Index* inputs, Index* out,
                    cudaStream_t stream) {
  return ShuffleWithCapacity<Index>(seed, epoch, m, inputs, out, 0, stream);
}

template cudaError_t Shuffle<uint32_t>(uint64_t, uint64_t, uint64_t, const uint32_t*, uint32_t*,
                                       cudaStream_t);
template cudaError_t Shuffle<uint64_t>(uint64_t, uint64_t, uint64_t, const uint64_t*, uint64_t*,
                                       cudaStream_t);
template cudaError_t ShuffleWithCapacity<uint32_t>(uint64_t, uint64_t, uint64_t, const uint32_t*,
                                                   uint32_t*, uint32_t, cudaStream_t);
template cudaError_t ShuffleWithCapacity<uint64_t>(uint64_t, uint64_t, uint64_t, const uint64_t*,
                                                   uint64_t*, uint32_t, cudaStream_t);

}  // namespace gpu
}  // namespace samplerd
