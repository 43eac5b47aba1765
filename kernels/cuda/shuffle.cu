// Shuffle on the device (device_plan.h; the definition: docs/SAMPLING.md with b =
// ShuffleBucketBits(m), i.e. buckets of 512-1024 inputs on average).
//
// The stable partition by bucket B_k is done in two levels that recompute B_k from the input's
// position k (plan_math.h's rule) instead of carrying it, b = c + f bits (c = ceil(b / 2) coarse,
// f = floor(b / 2) fine; both <= 12 since b <= 24):
//   1. coarse counts: one block per tile of kTile consecutive inputs counts its inputs per
//      coarse bucket (B_k >> f), into a coarse-major matrix; its exclusive scan (CUB) gives
//      every (coarse bucket, tile) pair the first position of its inputs in `p1`;
//   2. coarse split: each tile block walks its inputs in sub-tiles of kSubTile, in order; a
//      sub-tile's (coarse bucket, k) pairs are sorted stably in shared memory (CUB's
//      BlockRadixSort), and every input goes to its bucket's running position in `p1` (which is
//      `out` itself when step 3 follows). Tiles, sub-tiles and the block sort all keep input
//      order, so `p1` is the stable partition by the coarse bucket;
//   3. fine split: one block per coarse bucket reads its segment of `p1` twice: a histogram of
//      the fine bucket (B_k & (2^f - 1)), whose scan gives the bucket starts (written for step
//      4), then the same sub-tile split into `p2`: the stable partition by B_k. With f = 0 there
//      is no fine split: `p1` is the partition and the coarse starts are the bucket starts;
//   4. Fisher-Yates: a block of 32 threads per 32 consecutive buckets (contiguous after the
//      partition), one bucket per thread. The block's entries are permuted as 16-bit
//      block-relative offsets in shared memory (~64 KiB a block: three blocks per multiprocessor),
//      then written out in order, each entry gathered from the partition (or from `inputs`).
//      A block whose buckets exceed the shared capacity (never at the default capacity: 22
//      standard deviations above the mean) shuffles in global memory instead.
// At M = N = 1e9 (4-byte entries, b = 20: c = f = 10): step 1 only computes Philox words; step 2
// writes 4 B per input, step 3 reads 4 B twice and writes 4 B, step 4 gathers 4 B and writes 4 B:
// ~24 B per input (the earlier CUB radix sort of (bucket, position) pairs moved ~64 B), and the
// scratch is p2 (4 B per input; the pairs' double buffers were 16 B) plus the count matrix (4 B
// and its 8-byte scan per coarse bucket and tile: ~0.2 B per input).
#include <thrust/iterator/transform_iterator.h>

#include <cstdint>
#include <cub/block/block_discontinuity.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_plan.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"

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

// The split (steps 2 and 3): kSplitThreads threads with kSplitItems inputs each make a sub-tile.
constexpr unsigned kSplitThreads = 256;
constexpr unsigned kSplitItems = 8;  // A multiple of 4: step 2's Philox blocks stay whole.
constexpr uint64_t kSubTile = kSplitThreads * kSplitItems;  // 2048.
constexpr uint64_t kTile = 32 * kSubTile;                   // 65536 inputs per step-2 block.
// Bits of a level: at most 12 (b <= kMaxShuffleBucketBits = 24), so a split block's per-bucket
// arrays take at most 48 KiB of shared memory.
constexpr int kMaxLevelBits = (plan_math::kMaxShuffleBucketBits + 1) / 2;

// The bits of each level for b bucket bits.
__host__ __device__ __forceinline__ int CoarseBits(int bits) { return (bits + 1) / 2; }
__host__ __device__ __forceinline__ int FineBits(int bits) { return bits / 2; }

// Inputs of tile t: [t kTile, min(m, (t + 1) kTile)).
__host__ __device__ __forceinline__ uint64_t NumTiles(uint64_t m) {
  return (m + kTile - 1) / kTile;
}

struct Different {
  __device__ bool operator()(uint32_t a, uint32_t b) const { return a != b; }
};

// What a split block keeps in shared memory: CUB's sort and flags (used one after the other)
// and, per bucket of the level (dynamic shared memory: 2^bits of each), the next output
// position and the first sub-tile position of the bucket's run.
template <typename Index>
struct SplitShared {
  using Sort = cub::BlockRadixSort<uint32_t, kSplitThreads, kSplitItems, Index>;
  using Flags = cub::BlockDiscontinuity<uint32_t, kSplitThreads>;
  union {
    typename Sort::TempStorage sort;
    typename Flags::TempStorage flags;
  } temp;
};

// Dynamic shared memory of a split block for a level of `bits` bits: running positions (8 B)
// and run starts (4 B) per bucket.
size_t SplitDynamicBytes(int bits) { return (size_t{1} << bits) * (sizeof(uint64_t) + 4); }

// Moves one sub-tile: thread t's items t kSplitItems + j (blocked arrangement, in input order)
// have bucket keys[j] < 2^bits (or 2^bits: no item, sorted last and dropped) and values[j];
// each item goes to out[running[key] + its rank among the sub-tile's items of its bucket], and
// running[key] moves past them. Every thread of the block calls it; it ends with a barrier.
template <typename Index>
__device__ __forceinline__ void SplitSubTile(uint32_t (&keys)[kSplitItems],
                                             Index (&values)[kSplitItems], int bits,
                                             SplitShared<Index>& shared, uint64_t* running,
                                             uint32_t* run_start, Index* out) {
  using Shared = SplitShared<Index>;
  // Stable (CUB's contract): equal keys keep their blocked order, which is input order.
  typename Shared::Sort(shared.temp.sort).Sort(keys, values, 0, bits + 1);
  __syncthreads();  // The sort's storage becomes the flags'.
  int head[kSplitItems], tail[kSplitItems];
  typename Shared::Flags(shared.temp.flags).FlagHeadsAndTails(head, tail, keys, Different());
  const uint32_t none = 1u << bits;
  const uint32_t first = threadIdx.x * kSplitItems;
#pragma unroll
  for (unsigned j = 0; j < kSplitItems; ++j) {
    if (head[j] && keys[j] != none) run_start[keys[j]] = first + j;
  }
  __syncthreads();
#pragma unroll
  for (unsigned j = 0; j < kSplitItems; ++j) {
    if (keys[j] != none) out[running[keys[j]] + (first + j - run_start[keys[j]])] = values[j];
  }
  __syncthreads();  // Every read of running[] before its update.
#pragma unroll
  for (unsigned j = 0; j < kSplitItems; ++j) {
    if (tail[j] && keys[j] != none) running[keys[j]] += first + j - run_start[keys[j]] + 1;
  }
  __syncthreads();  // The next sub-tile reuses the storage, run_start and running.
}

// The coarse buckets of inputs 4c .. 4c + 3 (one Philox block): B_k >> fine.
__device__ __forceinline__ void CoarseOfFour(uint64_t seed, uint64_t epoch, int bits, int fine,
                                             uint64_t c, uint32_t (&coarse)[4]) {
  const Philox4x32Counter block = RandomBlock(seed, epoch, RandomStream::kShuffle, c);
#pragma unroll
  for (int w = 0; w < 4; ++w) coarse[w] = (block.v[w] >> (32 - bits)) >> fine;
}

// Step 1: counts[coarse * tiles + tile] = the inputs of `tile` in `coarse` (one block per tile;
// dynamic shared memory: 2^coarse_bits counters).
__global__ void __launch_bounds__(kSplitThreads)
    CoarseCountKernel(uint64_t seed, uint64_t epoch, uint64_t m, int bits, uint64_t tiles,
                      uint32_t* counts) {
  extern __shared__ uint32_t histogram[];
  const int fine = FineBits(bits);
  const uint32_t buckets = 1u << CoarseBits(bits);
  for (uint32_t x = threadIdx.x; x < buckets; x += blockDim.x) histogram[x] = 0;
  __syncthreads();
  const uint64_t tile = blockIdx.x;
  const uint64_t begin = tile * kTile, end = begin + kTile < m ? begin + kTile : m;
  for (uint64_t c = begin / 4 + threadIdx.x; 4 * c < end; c += blockDim.x) {
    uint32_t coarse[4];
    CoarseOfFour(seed, epoch, bits, fine, c, coarse);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if (4 * c + w < end) atomicAdd(&histogram[coarse[w]], 1u);
    }
  }
  __syncthreads();
  for (uint32_t x = threadIdx.x; x < buckets; x += blockDim.x) {
    counts[x * tiles + tile] = histogram[x];
  }
}

// Step 2: one block per tile; offsets = the exclusive scan of step 1's counts.
template <typename Index>
__global__ void __launch_bounds__(kSplitThreads)
    CoarseSplitKernel(uint64_t seed, uint64_t epoch, uint64_t m, int bits, uint64_t tiles,
                      const uint64_t* offsets, Index* p1) {
  __shared__ SplitShared<Index> shared;
  extern __shared__ uint64_t level[];  // running[2^coarse], then run_start[2^coarse].
  const int coarse_bits = CoarseBits(bits), fine = FineBits(bits);
  const uint32_t buckets = 1u << coarse_bits;
  uint64_t* running = level;
  uint32_t* run_start = reinterpret_cast<uint32_t*>(level + buckets);
  const uint64_t tile = blockIdx.x;
  for (uint32_t x = threadIdx.x; x < buckets; x += blockDim.x) {
    running[x] = offsets[x * tiles + tile];
  }
  __syncthreads();
  const uint64_t begin = tile * kTile, end = begin + kTile < m ? begin + kTile : m;
  for (uint64_t sub = begin; sub < end; sub += kSubTile) {
    uint32_t keys[kSplitItems];
    Index values[kSplitItems];
    const uint64_t first = sub + threadIdx.x * kSplitItems;  // A multiple of 4.
#pragma unroll
    for (unsigned j = 0; j < kSplitItems; j += 4) {
      uint32_t coarse[4];
      CoarseOfFour(seed, epoch, bits, fine, (first + j) / 4, coarse);
#pragma unroll
      for (unsigned w = 0; w < 4; ++w) {
        const uint64_t k = first + j + w;
        keys[j + w] = k < end ? coarse[w] : buckets;
        values[j + w] = static_cast<Index>(k);
      }
    }
    SplitSubTile<Index>(keys, values, coarse_bits, shared, running, run_start, p1);
  }
}

// Step 3: one block per coarse bucket c, whose inputs are p1[segments[c], segments[c + 1]);
// writes the starts of its 2^fine buckets (the last block also starts[2^bits] = m) and their
// stable partition into p2.
template <typename Index>
__global__ void __launch_bounds__(kSplitThreads)
    FineSplitKernel(uint64_t seed, uint64_t epoch, int bits, const uint64_t* segments,
                    const Index* p1, Index* p2, uint64_t* starts) {
  __shared__ SplitShared<Index> shared;
  __shared__ typename cub::BlockScan<uint64_t, kSplitThreads>::TempStorage scan;
  extern __shared__ uint64_t level[];  // running[2^fine], then run_start[2^fine].
  const int fine_bits = FineBits(bits);
  const uint32_t buckets = 1u << fine_bits, mask = buckets - 1;
  uint64_t* running = level;
  uint32_t* run_start = reinterpret_cast<uint32_t*>(level + buckets);
  const uint64_t coarse = blockIdx.x;
  const uint64_t begin = segments[coarse], end = segments[coarse + 1];
  if (coarse + 1 == gridDim.x && threadIdx.x == 0) {
    starts[static_cast<uint64_t>(gridDim.x) << fine_bits] = end;  // starts[2^bits] = m.
  }
  // The histogram, counted in running[] (64-bit shared atomics), then scanned in place.
  for (uint32_t x = threadIdx.x; x < buckets; x += blockDim.x) running[x] = 0;
  __syncthreads();
  for (uint64_t x = begin + threadIdx.x; x < end; x += blockDim.x) {
    const uint32_t b = plan_math::ShuffleBucketOf(seed, epoch, bits, static_cast<uint64_t>(p1[x]));
    atomicAdd(reinterpret_cast<unsigned long long*>(&running[b & mask]), 1ull);
  }
  __syncthreads();
  // Thread t scans buckets [t per, (t + 1) per): its sum, the block's exclusive scan, its part.
  const uint32_t per = (buckets + kSplitThreads - 1) / kSplitThreads;
  const uint32_t lo = threadIdx.x * per < buckets ? threadIdx.x * per : buckets;
  const uint32_t hi = lo + per < buckets ? lo + per : buckets;
  uint64_t sum = 0;
  for (uint32_t x = lo; x < hi; ++x) sum += running[x];
  uint64_t prefix = 0;
  cub::BlockScan<uint64_t, kSplitThreads>(scan).ExclusiveSum(sum, prefix);
  __syncthreads();  // Every thread has read its counts.
  for (uint32_t x = lo; x < hi; ++x) {
    const uint64_t count = running[x];
    running[x] = begin + prefix;
    starts[(coarse << fine_bits) + x] = begin + prefix;
    prefix += count;
  }
  __syncthreads();
  for (uint64_t sub = begin; sub < end; sub += kSubTile) {
    uint32_t keys[kSplitItems];
    Index values[kSplitItems];
    const uint64_t first = sub + threadIdx.x * kSplitItems;
#pragma unroll
    for (unsigned j = 0; j < kSplitItems; ++j) {
      const uint64_t x = first + j;
      values[j] = x < end ? p1[x] : Index{0};
      keys[j] = x < end ? plan_math::ShuffleBucketOf(seed, epoch, bits,
                                                     static_cast<uint64_t>(values[j])) &
                              mask
                        : buckets;
    }
    SplitSubTile<Index>(keys, values, fine_bits, shared, running, run_start, p2);
  }
}

// segments[c] = the first position of coarse bucket c's inputs in p1 (the scan of tile 0's
// count), for c < coarse_buckets, and segments[coarse_buckets] = m. With f = 0 these are the
// bucket starts. With no partition (bits = 0: offsets == nullptr, one bucket): {0, m}.
__global__ void __launch_bounds__(kBlock)
    SegmentStartsKernel(uint64_t m, uint64_t coarse_buckets, uint64_t tiles,
                        const uint64_t* offsets, uint64_t* segments) {
  for (uint64_t c = internal::GlobalThread(); c <= coarse_buckets; c += internal::GridStride()) {
    segments[c] = c == coarse_buckets ? m : offsets == nullptr ? 0 : offsets[c * tiles];
  }
}

// The count matrix as 64-bit terms of its scan (positions may pass 2^32).
struct Widen {
  __host__ __device__ uint64_t operator()(uint32_t x) const { return x; }
};

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
                      const Index* positions, const Index* inputs, Index* out, uint32_t capacity) {
  extern __shared__ uint16_t offsets[];  // `capacity` entries.
  const uint64_t b0 = static_cast<uint64_t>(blockIdx.x) * kBucketsPerBlock;
  const uint64_t b1 = b0 + kBucketsPerBlock < buckets ? b0 + kBucketsPerBlock : buckets;
  const uint64_t s = starts[b0], length = starts[b1] - s;
  const uint64_t bucket = b0 + threadIdx.x;
  const bool owner = bucket < b1;
  const uint64_t first = owner ? starts[bucket] : 0;
  const uint64_t n = owner ? starts[bucket + 1] - first : 0;
  plan_math::SwapWords words(seed, epoch, bucket);
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
  const int bits = plan_math::ShuffleBucketBits(m);
  if (bits > 2 * kMaxLevelBits) return cudaErrorInvalidValue;  // M > 2^34: beyond the definition.
  const uint64_t buckets = uint64_t{1} << bits;

  // Steps 1-3 (none for one bucket: the inputs in order).
  AsyncBuffer p1, p2, starts;
  SAMPLERD_CUDA_TRY(starts.Allocate((buckets + 1) * sizeof(uint64_t), stream));
  const Index* partition = nullptr;  // nullptr: the identity (bits == 0).
  if (bits == 0) {
    SegmentStartsKernel<<<1, kBlock, 0, stream>>>(m, 1, 0, nullptr, starts.as<uint64_t>());
    SAMPLERD_CUDA_TRY_LAUNCH();
  } else {
    const int coarse_bits = CoarseBits(bits), fine_bits = FineBits(bits);
    const uint64_t tiles = NumTiles(m);
    const uint64_t cells = (uint64_t{1} << coarse_bits) * tiles;
    if (tiles > 0x7fffffffu) return cudaErrorInvalidValue;
    AsyncBuffer counts, offsets;
    SAMPLERD_CUDA_TRY(counts.Allocate(cells * sizeof(uint32_t), stream));
    SAMPLERD_CUDA_TRY(offsets.Allocate(cells * sizeof(uint64_t), stream));
    CoarseCountKernel<<<static_cast<unsigned>(tiles), kSplitThreads,
                        (size_t{1} << coarse_bits) * sizeof(uint32_t), stream>>>(
        seed, epoch, m, bits, tiles, counts.as<uint32_t>());
    SAMPLERD_CUDA_TRY_LAUNCH();
    const auto wide = thrust::make_transform_iterator(counts.as<const uint32_t>(), Widen{});
    size_t scan_bytes = 0;
    SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, wide,
                                                    offsets.as<uint64_t>(), cells, stream));
    AsyncBuffer scan_temp;
    SAMPLERD_CUDA_TRY(scan_temp.Allocate(scan_bytes, stream));
    SAMPLERD_CUDA_TRY(cub::DeviceScan::ExclusiveSum(scan_temp.as<void>(), scan_bytes, wide,
                                                    offsets.as<uint64_t>(), cells, stream));
    scan_temp.Release();
    counts.Release();

    // Step 2 writes the coarse partition into `out` when step 3 follows (which reads it into p2
    // before step 4 overwrites `out`): the only scratch of the size of M is then p2. With no
    // step 3, step 4 reads the coarse partition while it writes `out`: it goes to p1.
    Index* coarse_partition = out;
    if (fine_bits == 0) {
      SAMPLERD_CUDA_TRY(p1.Allocate(m * sizeof(Index), stream));
      coarse_partition = p1.as<Index>();
    }
    // The attribute is the largest level's (a bound, the same for every call: concurrent
    // calls for other M never lower it under a launch of this one).
    const size_t coarse_shared = SplitDynamicBytes(coarse_bits);
    SAMPLERD_CUDA_TRY(cudaFuncSetAttribute(CoarseSplitKernel<Index>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(SplitDynamicBytes(kMaxLevelBits))));
    CoarseSplitKernel<Index>
        <<<static_cast<unsigned>(tiles), kSplitThreads, coarse_shared, stream>>>(
            seed, epoch, m, bits, tiles, offsets.as<uint64_t>(), coarse_partition);
    SAMPLERD_CUDA_TRY_LAUNCH();
    const uint64_t coarse_buckets = uint64_t{1} << coarse_bits;
    if (fine_bits == 0) {
      SegmentStartsKernel<<<internal::GridFor(coarse_buckets + 1, kBlock), kBlock, 0, stream>>>(
          m, coarse_buckets, tiles, offsets.as<uint64_t>(), starts.as<uint64_t>());
      SAMPLERD_CUDA_TRY_LAUNCH();
      partition = p1.as<Index>();
    } else {
      // The segments' bounds out of the count matrix, which goes before p2 comes: the step's
      // scratch is p2 and 8 B per coarse bucket.
      AsyncBuffer segments;
      SAMPLERD_CUDA_TRY(segments.Allocate((coarse_buckets + 1) * sizeof(uint64_t), stream));
      SegmentStartsKernel<<<internal::GridFor(coarse_buckets + 1, kBlock), kBlock, 0, stream>>>(
          m, coarse_buckets, tiles, offsets.as<uint64_t>(), segments.as<uint64_t>());
      SAMPLERD_CUDA_TRY_LAUNCH();
      offsets.Release();
      SAMPLERD_CUDA_TRY(p2.Allocate(m * sizeof(Index), stream));
      const size_t fine_shared = SplitDynamicBytes(fine_bits);
      SAMPLERD_CUDA_TRY(cudaFuncSetAttribute(FineSplitKernel<Index>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(SplitDynamicBytes(kMaxLevelBits))));
      FineSplitKernel<Index>
          <<<static_cast<unsigned>(coarse_buckets), kSplitThreads, fine_shared, stream>>>(
              seed, epoch, bits, segments.as<uint64_t>(), coarse_partition, p2.as<Index>(),
              starts.as<uint64_t>());
      SAMPLERD_CUDA_TRY_LAUNCH();
      partition = p2.as<Index>();
    }
  }

  // Step 4.
  const size_t shared = capacity * sizeof(uint16_t);
  SAMPLERD_CUDA_TRY(cudaFuncSetAttribute(FisherYatesKernel<Index>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared)));
  const uint64_t blocks = (buckets + kBucketsPerBlock - 1) / kBucketsPerBlock;
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
  FisherYatesKernel<Index><<<static_cast<unsigned>(blocks), kBucketsPerBlock, shared, stream>>>(
      seed, epoch, buckets, starts.as<uint64_t>(), partition, inputs, out, capacity);
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
