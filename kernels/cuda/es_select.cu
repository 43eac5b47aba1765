// SelectEfraimidisSpirakis on the device (device_plan.h): a radix select on the keys' top 16
// bits with the keys recomputed in every pass (no key array: a key is a Philox block, a Log2 and
// a division of its own index and weight).
//
// Passes over the n samples (N = 1e9, M = N/10 on an H100, from the floor in docs/CONTRIBUTING.md's GPU section: reading 4 bytes
// per sample is ~1.3 ms; a pass here is bound by the key's arithmetic, ~2-3 ms):
//   1. keys -> a histogram of their top 16 bits ("digits"; bit 63 is 0, so 2^15 bins) in shared
//      memory, added into a global histogram;
//   2. one block finds the digit d of the m-th smallest key and its rank among the keys of d
//      (the host reads it back: it sizes the candidate arrays exactly);
//   3. keys again -> a bitmap of the samples with a digit below d (one ballot per warp: each
//      word written once) and the (key, index) pairs with digit d appended (a few percent of n:
//      a digit is 1/16 of an octave of the keys, at most 1/(16 e) of the samples whatever the
//      weights, see kernels/internal/es_select.cc);
//   4. the candidates sorted by (key, index) (CUB radix sorts: by index, then stably by the
//      key's low 48 bits), the first `rank` set in the bitmap;
//   5. the bitmap compacted into the selected indices, in increasing order (a scan of the words'
//      popcounts, then each word writes its bits' indices).
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_plan.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace gpu {
namespace {

using internal::AsyncBuffer;
using ull = unsigned long long;

constexpr int kDigitShift = 48;         // Digit = key >> 48 (16 bits, top one 0).
constexpr uint32_t kDigits = 1u << 15;  // Positive doubles: bit 63 is 0.
constexpr unsigned kHistBlock = 1024;
constexpr unsigned kThresholdBlock = 1024;
constexpr uint32_t kDigitsPerThread = kDigits / kThresholdBlock;
constexpr unsigned kSplitBlock = 256;
constexpr unsigned kWordBlock = 256;
constexpr uint64_t kMaxPerHistBlock = uint64_t{1} << 31;  // Shared counters stay below 2^32.

struct Threshold {
  uint64_t digit;     // Of the m-th smallest key.
  uint64_t rank;      // 1-based rank of the m-th key among the keys of `digit`.
  uint64_t in_digit;  // Keys with that digit.
};

__device__ __forceinline__ float WeightOf(const float* weights, uint64_t i) {
  return weights == nullptr ? 1.0f : weights[i];
}

// Pass 1.
__global__ void __launch_bounds__(kHistBlock)
    DigitHistogramKernel(uint64_t seed, uint64_t epoch, uint64_t n, const float* weights,
                         ull* histogram) {
  extern __shared__ uint32_t counts[];  // kDigits entries.
  for (uint32_t d = threadIdx.x; d < kDigits; d += blockDim.x) counts[d] = 0;
  __syncthreads();
  for (uint64_t i = internal::GlobalThread(); i < n; i += internal::GridStride()) {
    const uint64_t key = plan_math::EsKeyBits(seed, epoch, i, WeightOf(weights, i));
    atomicAdd(&counts[key >> kDigitShift], 1u);
  }
  __syncthreads();
  for (uint32_t d = threadIdx.x; d < kDigits; d += blockDim.x) {
    if (counts[d] != 0) atomicAdd(&histogram[d], static_cast<ull>(counts[d]));
  }
}

// Pass 2: one block; thread t owns digits [t * kDigitsPerThread, (t + 1) * kDigitsPerThread).
__global__ void __launch_bounds__(kThresholdBlock)
    ThresholdKernel(const ull* histogram, uint64_t m, Threshold* threshold) {
  using Scan = cub::BlockScan<uint64_t, kThresholdBlock>;
  __shared__ typename Scan::TempStorage storage;
  const uint32_t first = threadIdx.x * kDigitsPerThread;
  uint64_t local = 0;
  for (uint32_t d = 0; d < kDigitsPerThread; ++d) local += histogram[first + d];
  uint64_t before = 0;
  Scan(storage).ExclusiveSum(local, before);
  // Exactly one thread holds the m-th key: before < m <= before + local (the total is n >= m).
  if (before < m && m <= before + local) {
    uint64_t rank = m - before;
    uint32_t d = first;
    while (histogram[d] < rank) rank -= histogram[d++];
    threshold->digit = d;
    threshold->rank = rank;
    threshold->in_digit = histogram[d];
  }
}

// Pass 3: warp w handles the samples [32 w', 32 w' + 32) for w' = w, w + warps, ...
template <typename Index>
__global__ void __launch_bounds__(kSplitBlock)
    SplitKernel(uint64_t seed, uint64_t epoch, uint64_t n, const float* weights,
                const Threshold* threshold, uint32_t* below, ull* candidate_count,
                uint64_t* candidate_keys, Index* candidate_indices) {
  const uint64_t digit = threshold->digit;
  const unsigned lane = threadIdx.x % 32;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t words = (n + 31) / 32;
  for (uint64_t w = internal::GlobalThread() / 32; w < words; w += warps) {
    const uint64_t i = w * 32 + lane;
    uint64_t key = plan_math::kInfinityKeyBits;
    bool is_below = false, is_candidate = false;
    if (i < n) {
      key = plan_math::EsKeyBits(seed, epoch, i, WeightOf(weights, i));
      const uint64_t d = key >> kDigitShift;
      is_below = d < digit;
      is_candidate = d == digit;
    }
    const uint32_t word = __ballot_sync(0xffffffffu, is_below);
    if (lane == 0) below[w] = word;
    const uint32_t candidates = __ballot_sync(0xffffffffu, is_candidate);
    if (candidates != 0) {
      uint64_t base = 0;
      const unsigned leader = __ffs(candidates) - 1;
      if (lane == leader) base = atomicAdd(candidate_count, static_cast<ull>(__popc(candidates)));
      base = __shfl_sync(0xffffffffu, base, leader);
      if (is_candidate) {
        const uint64_t slot = base + __popc(candidates & ((1u << lane) - 1));
        candidate_keys[slot] = key;
        candidate_indices[slot] = static_cast<Index>(i);
      }
    }
  }
}

// Pass 4's last step: the `rank` smallest candidates join the selection.
template <typename Index>
__global__ void __launch_bounds__(kWordBlock)
    MarkChosenKernel(const Index* sorted_indices, uint64_t rank, uint32_t* below) {
  for (uint64_t k = internal::GlobalThread(); k < rank; k += internal::GridStride()) {
    const uint64_t i = sorted_indices[k];
    atomicOr(&below[i / 32], 1u << (i % 32));
  }
}

struct WordPopcount {
  const uint32_t* words;
  __device__ uint64_t operator()(uint64_t w) const { return __popc(words[w]); }
};

// Pass 5.
template <typename Index>
__global__ void __launch_bounds__(kWordBlock)
    CompactKernel(const uint32_t* words, const uint64_t* offsets, uint64_t count, Index* out) {
  for (uint64_t w = internal::GlobalThread(); w < count; w += internal::GridStride()) {
    uint32_t bits = words[w];
    uint64_t o = offsets[w];
    while (bits != 0) {
      const int b = __ffs(bits) - 1;
      out[o++] = static_cast<Index>(w * 32 + b);
      bits &= bits - 1;
    }
  }
}

}  // namespace

template <typename Index>
cudaError_t SelectEfraimidisSpirakis(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t m,
                                     const float* weights, Index* selected, cudaStream_t stream) {
  if (n == 0 || m == 0 || m > n || selected == nullptr) return cudaErrorInvalidValue;
  if (sizeof(Index) < sizeof(uint64_t) && n > (uint64_t{1} << 32)) return cudaErrorInvalidValue;
  int device = 0, sms = 0;
  SAMPLERD_CUDA_TRY(cudaGetDevice(&device));
  SAMPLERD_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));

  // Passes 1 and 2.
  AsyncBuffer histogram, threshold;
  SAMPLERD_CUDA_TRY(histogram.Allocate(kDigits * sizeof(ull), stream));
  SAMPLERD_CUDA_TRY(threshold.Allocate(sizeof(Threshold), stream));
  SAMPLERD_CUDA_TRY(cudaMemsetAsync(histogram.as<void>(), 0, histogram.bytes(), stream));
  const size_t hist_shared = kDigits * sizeof(uint32_t);
  SAMPLERD_CUDA_TRY(cudaFuncSetAttribute(DigitHistogramKernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(hist_shared)));
  uint64_t hist_blocks = static_cast<uint64_t>(sms);
  if (hist_blocks * kMaxPerHistBlock < n)
    hist_blocks = (n + kMaxPerHistBlock - 1) / kMaxPerHistBlock;
  DigitHistogramKernel<<<static_cast<unsigned>(hist_blocks), kHistBlock, hist_shared, stream>>>(
      seed, epoch, n, weights, histogram.as<ull>());
  SAMPLERD_CUDA_TRY_LAUNCH();
  ThresholdKernel<<<1, kThresholdBlock, 0, stream>>>(histogram.as<ull>(), m,
                                                     threshold.as<Threshold>());
  SAMPLERD_CUDA_TRY_LAUNCH();
  Threshold host_threshold;
  SAMPLERD_CUDA_TRY(cudaMemcpyAsync(&host_threshold, threshold.as<void>(), sizeof(Threshold),
                                    cudaMemcpyDeviceToHost, stream));
  SAMPLERD_CUDA_TRY(cudaStreamSynchronize(stream));
  histogram.Release();

  // Pass 3.
  const uint64_t words = (n + 31) / 32;
  const uint64_t candidates = host_threshold.in_digit;
  AsyncBuffer below, count, keys_a, keys_b, indices_a, indices_b;
  SAMPLERD_CUDA_TRY(below.Allocate(words * sizeof(uint32_t), stream));
  SAMPLERD_CUDA_TRY(count.Allocate(sizeof(ull), stream));
  SAMPLERD_CUDA_TRY(keys_a.Allocate(candidates * sizeof(uint64_t), stream));
  SAMPLERD_CUDA_TRY(keys_b.Allocate(candidates * sizeof(uint64_t), stream));
  SAMPLERD_CUDA_TRY(indices_a.Allocate(candidates * sizeof(Index), stream));
  SAMPLERD_CUDA_TRY(indices_b.Allocate(candidates * sizeof(Index), stream));
  SAMPLERD_CUDA_TRY(cudaMemsetAsync(count.as<void>(), 0, sizeof(ull), stream));
  const uint64_t split_warps_needed = words;
  SplitKernel<Index>
      <<<internal::GridFor(split_warps_needed * 32, kSplitBlock), kSplitBlock, 0, stream>>>(
          seed, epoch, n, weights, threshold.as<Threshold>(), below.as<uint32_t>(), count.as<ull>(),
          keys_a.as<uint64_t>(), indices_a.as<Index>());
  SAMPLERD_CUDA_TRY_LAUNCH();

  // Pass 4: (key, index) order = a stable sort by key of the candidates sorted by index. Keys of
  // one digit share their top 16 bits: only the low 48 are sorted.
  {
    const int index_bits = plan_math::BitWidth(n - 1) == 0 ? 1 : plan_math::BitWidth(n - 1);
    size_t bytes_by_index = 0, bytes_by_key = 0;
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes_by_index, indices_a.as<Index>(), indices_b.as<Index>(),
        keys_a.as<uint64_t>(), keys_b.as<uint64_t>(), candidates, 0, index_bits, stream));
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes_by_key, keys_b.as<uint64_t>(), keys_a.as<uint64_t>(), indices_b.as<Index>(),
        indices_a.as<Index>(), candidates, 0, kDigitShift, stream));
    AsyncBuffer temp;
    SAMPLERD_CUDA_TRY(
        temp.Allocate(bytes_by_index > bytes_by_key ? bytes_by_index : bytes_by_key, stream));
    size_t bytes = temp.bytes();
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        temp.as<void>(), bytes, indices_a.as<Index>(), indices_b.as<Index>(), keys_a.as<uint64_t>(),
        keys_b.as<uint64_t>(), candidates, 0, index_bits, stream));
    bytes = temp.bytes();
    SAMPLERD_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        temp.as<void>(), bytes, keys_b.as<uint64_t>(), keys_a.as<uint64_t>(), indices_b.as<Index>(),
        indices_a.as<Index>(), candidates, 0, kDigitShift, stream));
  }
  MarkChosenKernel<Index>
      <<<internal::GridFor(host_threshold.rank, kWordBlock), kWordBlock, 0, stream>>>(
          indices_a.as<Index>(), host_threshold.rank, below.as<uint32_t>());
  SAMPLERD_CUDA_TRY_LAUNCH();
  keys_a.Release();
  keys_b.Release();
  indices_a.Release();
  indices_b.Release();

  // Pass 5.
  AsyncBuffer offsets, temp;
  SAMPLERD_CUDA_TRY(offsets.Allocate(words * sizeof(uint64_t), stream));
  const auto popcounts = thrust::make_transform_iterator(thrust::counting_iterator<uint64_t>(0),
                                                         WordPopcount{below.as<uint32_t>()});
  size_t scan_bytes = 0;
  SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, popcounts,
                                                  offsets.as<uint64_t>(), words, stream));
  SAMPLERD_CUDA_TRY(temp.Allocate(scan_bytes, stream));
  SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp.as<void>(), scan_bytes, popcounts,
                                                  offsets.as<uint64_t>(), words, stream));
  CompactKernel<Index><<<internal::GridFor(words, kWordBlock), kWordBlock, 0, stream>>>(
      below.as<uint32_t>(), offsets.as<uint64_t>(), words, selected);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

template cudaError_t SelectEfraimidisSpirakis<uint32_t>(uint64_t, uint64_t, uint64_t, uint64_t,
                                                        const float*, uint32_t*, cudaStream_t);
template cudaError_t SelectEfraimidisSpirakis<uint64_t>(uint64_t, uint64_t, uint64_t, uint64_t,
                                                        const float*, uint64_t*, cudaStream_t);

}  // namespace gpu
}  // namespace samplerd
