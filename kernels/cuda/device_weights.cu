// Device kernels of the weight side (device_weights.h): the loss policies' recompute by the
// passes of CpuBackend::RecomputeWeights, the weights' summary, applied losses and importance
// weights. Every per-sample value comes from kernels/weight_math.h, every sum is exact_sum.h's.
//
// Exact sums: a persistent grid of blocks of kSumBlock threads walks the chunks of
// exact_sum::kChunk samples (a block per chunk at a time, grid-stride). For a chunk, each thread
// keeps kPerThread items in registers (per sample a float or double that its terms are computed
// from: not a double per series, so that 3-4 blocks fit a multiprocessor; SumChunksOfBlock); the
// block finds the largest term's bits (warp shuffles, then shared memory), quantises every term
// at that exponent and adds the integers (two 64-bit halves, as the CPU: no carry is lost below
// 2^44), and stores the chunk's S_c and B_c; each block folds its B_c into the pass's B with one
// atomicMax. A second, small kernel then adds the chunks' floor(S_c / 2^(B - B_c)) into a 128-bit
// T with two 64-bit atomics (integer additions: the order of the blocks does not matter). The
// host reads B and T (and the pass's other findings, a few scalars) once per pass and rounds them
// with exact_sum::Total, as the CPU does with its chunks.
//
// The recompute's kernels are templates over the policy's rule (kernels/policy_rules.h; the
// kind chooses it once, in VisitPolicyRule). Passes of a kFactor rule (LOSS, REDUCIBLE_LOSS): 1.
// validation and the signals' sum (+ the base weights' sum); 2. f_i into `out`, its sum (+ the
// sum of base_i f_i); the raw weights' mean follows in closed form (weight_math::LossRawMean);
// 3. the clamped weights' sum; 4. the result. Passes 1 and 2 read the statistics' EMA array and
// its "seen" and "defined" bits (DeviceLossStats), not the counts and markers: per sample 4 + 8 +
// 4 + 8 B read or written besides the base weights, the bits and what the rule reads
// (REDUCIBLE_LOSS: 4 B of irreducible loss in passes 1 and 2), ~24.4 B. With the effective
// sample size floor (RecomputeParams::min_effective_fraction) each of the bisection's trials
// (weight_math::EssFloorMix: at most 22) runs the clamped sum and the sums of w_i and w_i^2 (the
// CPU's trial, on the host from the device's exact sums) before pass 3. A kDirect rule
// (MULTIPLICATIVE; it needs the markers): 1. validation and the raw weights' sum; 2. the clamped
// sum; 3. the result.
//
// Loss within groups (RecomputeParams::within_groups) replaces pass 2 by three element-wise
// passes over the groups' table (K keys, uploaded from the host): the groups' largest x (an
// atomicMax on its bits), f_i with each group's rule into `out` and the groups' fixed-point sums
// (integer atomicAdds: the order does not matter), then the normalised factors; the clamp and
// the result follow with mean_f = 1 and the base weights' mean (weight_math.h, "Loss within
// groups"). It needs K (4 + 4 * 8 + 40) bytes more.
//
// Device memory of RecomputeWeights besides its arguments: 32 B per chunk (1/128 B per sample:
// up to two series per pass) and a few hundred bytes of scalars. The loss factors f_i are parked
// in `out`, as on the CPU.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_weights.h"
#include "kernels/exact_sum.h"
#include "kernels/loss_stats.h"
#include "kernels/policy_rules.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace gpu {
namespace {

using exact_sum::uint128;
using internal::AsyncBuffer;
using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using ull = unsigned long long;
static_assert(sizeof(ull) == sizeof(uint64_t), "atomics on 64-bit words");

constexpr unsigned kBlock = 256;     // Element-wise kernels.
constexpr unsigned kSumBlock = 256;  // Threads per chunk of an exact sum.
constexpr unsigned kPerThread = static_cast<unsigned>(exact_sum::kChunk) / kSumBlock;
constexpr unsigned kWarps = kSumBlock / 32;
// Blocks of an exact-sum kernel that must fit a multiprocessor at once (__launch_bounds__'
// second argument: ptxas then keeps the kernel within 65536 / (kSumBlock * blocks) registers per
// thread). 4 (64 registers) where that costs no spills (ptxas -v, sm_90: bench/RESULTS.md,
// "Where the time goes"), else 3 (80).
constexpr unsigned kSumBlocksLight = 4;  // ScanKernel, ClampedSumKernel.
constexpr unsigned kSumBlocks = 3;       // FactorKernel, FinalSumKernel.
static_assert(kSumBlock * kPerThread == exact_sum::kChunk, "a block covers one chunk");

// exact_sum.h's bound on the number of terms (T stays below 2^103).
constexpr uint64_t kMaxSamples = exact_sum::kMaxTerms;

// Sample i's SampleLossStats from the device's arrays (device_weights.h: DeviceLossStats).
// (Read-only loads: for kernels that do not write the statistics.)
__device__ __forceinline__ SampleLossStats LoadStats(const DeviceLossStats& stats, uint64_t i) {
  return LossStatsFrom(__ldg(stats.ema + i), __ldg(stats.meta + i));
}

// Bit i of a bit array (DeviceLossStats::seen, ::defined): a warp's 32 consecutive samples read
// one word.
__device__ __forceinline__ bool Bit(const uint32_t* words, uint64_t i) {
  return (__ldg(words + i / 32) >> (i % 32)) & 1u;
}

// Chunks of exact_sum::kChunk samples over n samples.
__host__ __device__ __forceinline__ uint64_t NumChunks(uint64_t n) {
  return (n + exact_sum::kChunk - 1) / exact_sum::kChunk;
}

// A weight or 1 when there are none (nullptr).
__device__ __forceinline__ float WeightOr1(const float* w, uint64_t i) {
  return w == nullptr ? 1.0f : __ldg(w + i);
}

// ---- Exact sums ----------------------------------------------------------------------------

// A chunk's result in device memory: S_c (< 2^75) as low 64 bits + high bits, and B_c.
struct DeviceChunkSum {
  uint64_t low;
  uint32_t high;
  uint32_t exponent;
};

// One exact sum over all chunks: B (atomicMax of the chunks' B_c; 0 before the first) and T (the
// sum of the shifted S_c, 128 bits in two words).
struct DeviceTotal {
  uint32_t exponent;
  uint32_t unused;
  uint64_t low, high;
};

// The slots of DeviceScalars::totals. RecomputeWeights: pass 1 sums the signals of the seen
// samples (a kFactor rule) or raw_i (kDirect) into kScanTotal and, kFactor with base weights,
// base_i into kBaseTotal; kFactor pass 2 sums f_i into kFactorTotal and, with base weights,
// base_i f_i into kBaseFactorTotal; the clamp pass sums c_i into kClampedTotal; each trial of the
// effective sample size floor sums w_i and w_i^2 into kFinalTotal and kFinalSquareTotal (the
// slots a pass runs again in are zeroed before: ResetTotals). SummarizeWeights: S1 and S2 in
// slots 0 and 1. A pass's second series (if any) goes to the slot after its first, its chunk
// sums after the first series' (LaunchExactSum).
constexpr int kScanTotal = 0, kBaseTotal = 1, kFactorTotal = 2, kBaseFactorTotal = 3,
              kClampedTotal = 4, kFinalTotal = 5, kFinalSquareTotal = 6, kTotals = 7;
static_assert(kBaseTotal == kScanTotal + 1 && kBaseFactorTotal == kFactorTotal + 1 &&
                  kFinalSquareTotal == kFinalTotal + 1,
              "a pass's second series has the slot after its first");

// Everything the passes report to the host (read back whole after each pass).
struct DeviceScalars {
  DeviceTotal totals[kTotals];
  uint64_t first_bad;      // ~0: none.
  uint64_t seen;           // kFactor: samples with count > 0.
  uint64_t zero_count;     // Summary.
  uint32_t ema_max_bits;   // kFactor: largest signal of the seen (-0 as +0).
  uint32_t base_positive;  // Or of PositiveBits.
  uint32_t current_positive;
  uint32_t unseen;    // kFactor: some sample has count 0.
  uint32_t min_bits;  // Summary: SummaryBits, ~0 before the first.
  uint32_t max_bits;
};

__global__ void InitScalarsKernel(DeviceScalars* s) {
  *s = DeviceScalars{};
  s->first_bad = ~uint64_t{0};
  s->min_bits = ~uint32_t{0};
}

__device__ __forceinline__ uint64_t WarpMax(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, static_cast<ull>(v), offset);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ uint64_t WarpSum(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, static_cast<ull>(v), offset);
  }
  return v;
}

__device__ __forceinline__ uint128 WarpSum128(uint128 v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t low = __shfl_xor_sync(0xffffffffu, static_cast<ull>(v), offset);
    const uint64_t high = __shfl_xor_sync(0xffffffffu, static_cast<ull>(v >> 64), offset);
    v += (static_cast<uint128>(high) << 64) | low;
  }
  return v;
}

struct ChunkSumStorage {
  uint64_t max_bits[kWarps];
  uint64_t low[kWarps];
  uint64_t high[kWarps];
};

// The chunk's exact sum of the block's terms: thread t's term j is term_of(i, items[j]) for the
// sample i = begin + j * kSumBlock + t, 0 for j >= count (beyond the data); every thread of the
// block calls it. A term is computed from its item twice (for the largest bits, then to quantise
// it), identically: the items (a float where the term is a double of one) are what stays in
// registers across the barriers, not kPerThread doubles per series. Thread 0 stores S_c and B_c
// to *out; returns B_c to every thread. Two barriers; `storage` may be reused by the next call
// without one (the first barrier of the next call orders thread 0's reads of low/high before
// anyone writes them again, and every thread reads max_bits before the second barrier).
template <typename Item, typename TermOf>
__device__ __forceinline__ uint32_t SumChunkTerms(uint64_t begin, const Item (&items)[kPerThread],
                                                  unsigned count, const TermOf& term_of,
                                                  ChunkSumStorage& storage, DeviceChunkSum* out) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t max_bits = 0;
#pragma unroll
  for (unsigned j = 0; j < kPerThread; ++j) {
    const uint64_t i = begin + j * kSumBlock + threadIdx.x;
    const uint64_t bits = j < count ? exact_sum::TermBits(term_of(i, items[j])) : 0;
    max_bits = bits > max_bits ? bits : max_bits;
  }
  max_bits = WarpMax(max_bits);
  if (lane == 0) storage.max_bits[warp] = max_bits;
  __syncthreads();
  uint64_t block_max = storage.max_bits[0];
#pragma unroll
  for (unsigned w = 1; w < kWarps; ++w) {
    block_max = storage.max_bits[w] > block_max ? storage.max_bits[w] : block_max;
  }
  const uint32_t exponent = exact_sum::ChunkExponent(block_max);
  uint64_t low = 0, high = 0;  // Each below 2^44 over a chunk.
#pragma unroll
  for (unsigned j = 0; j < kPerThread; ++j) {
    const uint64_t i = begin + j * kSumBlock + threadIdx.x;
    const uint64_t bits = j < count ? exact_sum::TermBits(term_of(i, items[j])) : 0;
    const uint64_t q = exact_sum::Quantise(bits, exponent);
    low += q & 0xffffffffu;
    high += q >> 32;
  }
  low = WarpSum(low);
  high = WarpSum(high);
  if (lane == 0) {
    storage.low[warp] = low;
    storage.high[warp] = high;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t block_low = 0, block_high = 0;
    for (unsigned w = 0; w < kWarps; ++w) {
      block_low += storage.low[w];
      block_high += storage.high[w];
    }
    const uint128 sum = (static_cast<uint128>(block_high) << 32) + block_low;
    *out = DeviceChunkSum{static_cast<uint64_t>(sum), static_cast<uint32_t>(sum >> 64), exponent};
  }
  return exponent;
}

// Folds a block's largest B_c into the pass's B (thread 0 only holds it).
__device__ __forceinline__ void PublishExponent(uint32_t exponent, DeviceTotal* total) {
  if (threadIdx.x == 0) atomicMax(&total->exponent, exponent);
}

// The chunk loop of every exact-sum pass: this block's chunks of n samples (grid-stride).
// load(i) returns sample i's Item (called once per sample below n, in order of j for a thread:
// it may gather findings); first_term(i, item) is the sample's term of the first series and
// second_term(i, item) of the second, computed when `second` is given, twice each (pure: they
// may read the inputs again, not what load wrote); terms are >= 0, samples beyond n add 0. The
// first series' chunk sums go to chunk_sums[c], the second's to chunk_sums[chunks + c], the
// block's largest exponents to *first and *second (PublishExponent). Every thread of the block
// calls it, with the same `second` (SumChunkTerms' barriers).
template <typename Load, typename First, typename Second>
__device__ __forceinline__ void SumChunksOfBlock(uint64_t n, DeviceChunkSum* chunk_sums,
                                                 DeviceTotal* first, DeviceTotal* second,
                                                 const Load& load, const First& first_term,
                                                 const Second& second_term) {
  using Item = decltype(load(uint64_t{0}));
  __shared__ ChunkSumStorage storage;
  uint32_t top = 1, second_top = 1;
  const uint64_t chunks = NumChunks(n);
  for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const uint64_t begin = c * exact_sum::kChunk;
    const uint64_t left = n - begin;  // > 0.
    // This thread's samples below n: j * kSumBlock + threadIdx.x < left.
    const unsigned count =
        left >= exact_sum::kChunk
            ? kPerThread
            : static_cast<unsigned>((left + kSumBlock - 1 - threadIdx.x) / kSumBlock);
    Item items[kPerThread];
#pragma unroll
    for (unsigned j = 0; j < kPerThread; ++j) {
      items[j] = Item{};
      if (j < count) items[j] = load(begin + j * kSumBlock + threadIdx.x);
    }
    const uint32_t exponent =
        SumChunkTerms(begin, items, count, first_term, storage, chunk_sums + c);
    top = exponent > top ? exponent : top;
    if (second != nullptr) {
      const uint32_t e =
          SumChunkTerms(begin, items, count, second_term, storage, chunk_sums + chunks + c);
      second_top = e > second_top ? e : second_top;
    }
  }
  PublishExponent(top, first);
  if (second != nullptr) PublishExponent(second_top, second);
}

// T += the chunks' floor(S_c / 2^(B - B_c)), B final (the chunk kernels are done: stream order).
__global__ void __launch_bounds__(kBlock)
    CombineKernel(const DeviceChunkSum* chunks, uint64_t count, DeviceTotal* total) {
  __shared__ uint64_t low_of[kBlock / 32], high_of[kBlock / 32];
  const uint32_t top = total->exponent;
  uint128 t = 0;
  for (uint64_t c = GlobalThread(); c < count; c += GridStride()) {
    const DeviceChunkSum s = chunks[c];
    const uint32_t shift = top - s.exponent;
    const uint128 v = (static_cast<uint128>(s.high) << 64) | s.low;
    t += shift < 128 ? v >> shift : 0;
  }
  t = WarpSum128(t);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    low_of[warp] = static_cast<uint64_t>(t);
    high_of[warp] = static_cast<uint64_t>(t >> 64);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint128 block = 0;
  for (unsigned w = 0; w < kBlock / 32; ++w) {
    block += (static_cast<uint128>(high_of[w]) << 64) | low_of[w];
  }
  // A 128-bit atomic add from two 64-bit ones: every addition that wraps the low word carries
  // exactly one into the high word, whatever the order of the blocks.
  const uint64_t low = static_cast<uint64_t>(block), high = static_cast<uint64_t>(block >> 64);
  const uint64_t old = atomicAdd(reinterpret_cast<ull*>(&total->low), static_cast<ull>(low));
  const uint64_t carry = old + low < old ? 1 : 0;
  if (high + carry != 0) {
    atomicAdd(reinterpret_cast<ull*>(&total->high), static_cast<ull>(high + carry));
  }
}

// The sum of the definition from a DeviceTotal read back to the host.
double TotalOf(const DeviceTotal& total) {
  exact_sum::ChunkSum all;
  all.exponent = total.exponent;
  all.sum = (static_cast<uint128>(total.high) << 64) | total.low;
  return exact_sum::Total(&all, 1);
}

// Blocks of a persistent grid of `kernel` over `chunks` chunks: as many as the device runs at
// once (at least 1), never more than the chunks.
template <typename Kernel>
cudaError_t PersistentGrid(Kernel kernel, uint64_t chunks, unsigned* blocks) {
  int device = 0, multiprocessors = 0, per_multiprocessor = 0;
  SAMPLERD_CUDA_TRY(cudaGetDevice(&device));
  SAMPLERD_CUDA_TRY(
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  SAMPLERD_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kSumBlock, 0));
  uint64_t resident =
      static_cast<uint64_t>(multiprocessors) * static_cast<uint64_t>(per_multiprocessor);
  if (resident == 0) resident = 1;
  *blocks = static_cast<unsigned>(chunks < resident ? chunks : resident);
  return cudaSuccess;
}

// Launches a chunk kernel over every chunk of n samples, then CombineKernel for each of its
// `series` sums: series k's chunk sums at chunk_sums + k * chunks, its total at totals[k].
template <typename Kernel, typename... Args>
cudaError_t LaunchExactSum(Kernel kernel, uint64_t n, int series, DeviceChunkSum* chunk_sums,
                           DeviceTotal* totals, cudaStream_t stream, Args... args) {
  const uint64_t chunks = NumChunks(n);
  unsigned blocks = 1;
  SAMPLERD_CUDA_TRY(PersistentGrid(kernel, chunks, &blocks));
  kernel<<<blocks, kSumBlock, 0, stream>>>(args...);
  SAMPLERD_CUDA_TRY_LAUNCH();
  for (int k = 0; k < series; ++k) {
    CombineKernel<<<GridFor(chunks, kBlock), kBlock, 0, stream>>>(chunk_sums + k * chunks, chunks,
                                                                  totals + k);
    SAMPLERD_CUDA_TRY_LAUNCH();
  }
  return cudaSuccess;
}

// Copies the scalars to the host once the stream has run the pass.
cudaError_t ReadScalars(const DeviceScalars* device, DeviceScalars* host, cudaStream_t stream) {
  SAMPLERD_CUDA_TRY(
      cudaMemcpyAsync(host, device, sizeof(DeviceScalars), cudaMemcpyDeviceToHost, stream));
  return cudaStreamSynchronize(stream);
}

// ---- RecomputeWeights: the per-sample terms ------------------------------------------------

// Every kernel and pass below is a template over the policy's rule (kernels/policy_rules.h),
// passed by value to the kernels; only its shape chooses code (kFactor: the loss factor of its
// Signal over the base weights; kDirect: its Raw over the current weights).
template <typename Rule>
constexpr bool kFactorRule = Rule::kShape == PolicyRuleShape::kFactor;

// The inputs and the values that every pass after the first reads (filled in as the passes find
// the means).
struct RecomputeInputs {
  uint64_t n = 0;
  const float* base = nullptr;
  const float* current = nullptr;
  DeviceLossStats stats;
  float* out = nullptr;
  weight_math::LossFactorRule factors;            // kFactor.
  double one_minus_mix = 1, mix = 0, mean_f = 1;  // kFactor.
  weight_math::ClampRule clamp;
  double mean_clamped = 1;
};

// The weights that the rule's shape reads (base for kFactor, current for kDirect).
template <typename Rule>
__device__ __forceinline__ const float* ShapeWeights(const RecomputeInputs& in) {
  return kFactorRule<Rule> ? in.base : in.current;
}

// raw_i (weight_math::LossRaw with f_i read from out for kFactor; the rule's Raw for kDirect)
// and whether the sample is excluded (a zero weight of the shape's weights).
template <typename Rule>
__device__ __forceinline__ double RawAt(const Rule& r, const RecomputeInputs& in, uint64_t i,
                                        bool* excluded) {
  const float* weights = ShapeWeights<Rule>(in);
  const float weight = WeightOr1(weights, i);
  *excluded = weights != nullptr && weight == 0;
  if constexpr (kFactorRule<Rule>) {
    return weight_math::LossRaw(weight, in.out[i], in.one_minus_mix, in.mean_f, in.mix);
  } else {
    const SampleLossStats s = LoadStats(in.stats, i);
    return r.Raw(weight, s.ema_loss, s.last_epoch, i);
  }
}

template <typename Rule>
__device__ __forceinline__ double ClampedAt(const Rule& r, const RecomputeInputs& in, uint64_t i) {
  bool excluded = false;
  const double raw = RawAt(r, in, i, &excluded);
  return weight_math::Clamped(raw, excluded, in.clamp);
}

// Sample i's signal (kFactor), read from the EMA array.
template <typename Rule>
__device__ __forceinline__ float SignalAt(const Rule& r, const RecomputeInputs& in, uint64_t i) {
  return r.Signal(__ldg(in.stats.ema + i), i);
}

// A sample's part of pass 1's first sum, kept across a chunk's barriers (SumChunksOfBlock):
// kFactor its signal if seen, else +0 (the term double(seen_signal) is then the definition's
// Select(seen, double(signal), 0.0)); kDirect raw_i.
template <typename Rule>
using ScanItem = std::conditional_t<kFactorRule<Rule>, float, double>;

// Pass 1: validation (weight_math::SampleIsBad, the positive weights) and what the rule needs
// from the statistics; the exact sums of the seen samples' signals (kFactor) or of raw_i
// (kDirect) into scalars->totals[kScanTotal], and kFactor with base weights of base_i into
// scalars->totals[kBaseTotal]. Writes nothing to `out`.
template <typename Rule>
__global__ void __launch_bounds__(kSumBlock, kSumBlocksLight)
    ScanKernel(Rule r, RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceScalars* scalars) {
  uint64_t first_bad = ~uint64_t{0}, seen = 0;
  uint32_t base_positive = 0, current_positive = 0, unseen = 0, ema_max_bits = 0;
  // kFactor with base weights also sums them (for weight_math::LossRawMean).
  const bool sum_base = kFactorRule<Rule> && in.base != nullptr;
  SumChunksOfBlock(
      in.n, chunk_sums, &scalars->totals[kScanTotal],
      sum_base ? &scalars->totals[kBaseTotal] : nullptr,
      [&](uint64_t i) {
        ScanItem<Rule> item = 0;
        // kFactor reads the EMA and the two bits only (not the counts and markers).
        const float ema = __ldg(in.stats.ema + i);
        if (weight_math::SampleIsBad(in.base, in.current, Bit(in.stats.defined, i), ema, i)) {
          first_bad = i < first_bad ? i : first_bad;
        }
        if (in.base != nullptr) {
          base_positive |= weight_math::PositiveBits(__float_as_uint(__ldg(in.base + i)));
        }
        if (in.current != nullptr) {
          current_positive |= weight_math::PositiveBits(__float_as_uint(__ldg(in.current + i)));
        }
        if constexpr (kFactorRule<Rule>) {
          const uint32_t v_bits = __float_as_uint(r.Signal(ema, i));
          const bool seen_i = Bit(in.stats.seen, i);
          seen += seen_i;
          unseen |= !seen_i;
          // The largest signal by its bits (non-negative floats order like their bits; -0 as
          // +0); a signal is read only for a seen sample.
          const uint32_t candidate = seen_i && v_bits != 0x80000000u ? v_bits : 0;
          ema_max_bits = candidate > ema_max_bits ? candidate : ema_max_bits;
          item = seen_i ? __uint_as_float(v_bits) : 0.0f;
        } else {
          bool excluded = false;
          item = RawAt(r, in, i, &excluded);
        }
        return item;
      },
      [](uint64_t, ScanItem<Rule> item) { return static_cast<double>(item); },
      // The base weights' sum (sum_base only): read again (L1 or L2), not kept.
      [&](uint64_t i, ScanItem<Rule>) { return static_cast<double>(__ldg(in.base + i)); });
  // The findings: a warp's reduction, then one atomic per warp.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, static_cast<ull>(first_bad), offset);
    first_bad = other < first_bad ? other : first_bad;
    seen += __shfl_xor_sync(0xffffffffu, static_cast<ull>(seen), offset);
    base_positive |= __shfl_xor_sync(0xffffffffu, base_positive, offset);
    current_positive |= __shfl_xor_sync(0xffffffffu, current_positive, offset);
    unseen |= __shfl_xor_sync(0xffffffffu, unseen, offset);
    const uint32_t other_max = __shfl_xor_sync(0xffffffffu, ema_max_bits, offset);
    ema_max_bits = other_max > ema_max_bits ? other_max : ema_max_bits;
  }
  if (threadIdx.x % 32 != 0) return;
  if (first_bad != ~uint64_t{0}) {
    atomicMin(reinterpret_cast<ull*>(&scalars->first_bad), static_cast<ull>(first_bad));
  }
  if (seen != 0) atomicAdd(reinterpret_cast<ull*>(&scalars->seen), static_cast<ull>(seen));
  if (base_positive != 0) atomicOr(&scalars->base_positive, 1u);
  if (current_positive != 0) atomicOr(&scalars->current_positive, 1u);
  if (unseen != 0) atomicOr(&scalars->unseen, 1u);
  if (ema_max_bits != 0) atomicMax(&scalars->ema_max_bits, ema_max_bits);
}

// kFactor pass 2: f_i (weight_math::LossFactor of the signal), parked in out[i]; the exact sums
// of f_i into totals[0] and, with base weights, of base_i f_i (weight_math::BaseFactorTerm) into
// totals[1].
template <typename Rule>
__global__ void __launch_bounds__(kSumBlock, kSumBlocks)
    FactorKernel(Rule r, RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceTotal* totals) {
  const bool with_base = in.base != nullptr;
  SumChunksOfBlock(
      in.n, chunk_sums, &totals[0], with_base ? &totals[1] : nullptr,
      [&](uint64_t i) {
        const float f =
            weight_math::LossFactor(Bit(in.stats.seen, i), SignalAt(r, in, i), in.factors);
        in.out[i] = f;
        return f;
      },
      [](uint64_t, float f) { return static_cast<double>(f); },
      // base_i read again (L1 or L2), not kept.
      [&](uint64_t i, float f) { return weight_math::BaseFactorTerm(__ldg(in.base + i), f); });
}

// The clamp pass: the exact sum of c_i into *total.
template <typename Rule>
__global__ void __launch_bounds__(kSumBlock, kSumBlocksLight)
    ClampedSumKernel(Rule r, RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceTotal* total) {
  SumChunksOfBlock(
      in.n, chunk_sums, total, nullptr, [&](uint64_t i) { return ClampedAt(r, in, i); },
      [](uint64_t, double c) { return c; }, [](uint64_t, double) { return 0.0; });
}

// The effective sample size floor's trial: the exact sums of w_i = FinalWeight(c_i,
// mean_clamped) and of SquareTerm(w_i) into totals[0] and totals[1] (the weights WriteKernel
// would write; nothing is written).
template <typename Rule>
__global__ void __launch_bounds__(kSumBlock, kSumBlocks)
    FinalSumKernel(Rule r, RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceTotal* totals) {
  SumChunksOfBlock(
      in.n, chunk_sums, &totals[0], &totals[1],
      [&](uint64_t i) { return weight_math::FinalWeight(ClampedAt(r, in, i), in.mean_clamped); },
      [](uint64_t, float w) { return static_cast<double>(w); },
      [](uint64_t, float w) { return weight_math::SquareTerm(w); });
}

// The last pass: out[i] = c_i / mean_clamped (kFactor reads f_i from out[i] first).
template <typename Rule>
__global__ void __launch_bounds__(kBlock) WriteKernel(Rule r, RecomputeInputs in) {
  for (uint64_t i = GlobalThread(); i < in.n; i += GridStride()) {
    const double c = ClampedAt(r, in, i);
    in.out[i] = weight_math::FinalWeight(c, in.mean_clamped);
  }
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (b may be null: no range).
bool Overlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  if (a == nullptr || b == nullptr) return false;
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Zeroes the totals [first, first + count) (a DeviceTotal of 0 is an empty sum), so that a pass
// that runs again (the floor's trials) starts from nothing.
cudaError_t ResetTotals(DeviceScalars* scalars, int first, int count, cudaStream_t stream) {
  return cudaMemsetAsync(&scalars->totals[first], 0, count * sizeof(DeviceTotal), stream);
}

// The clamp pass: the mean of c_i (`in.clamp` set), into in->mean_clamped.
template <typename Rule>
cudaError_t MeanClamped(const Rule& r, RecomputeInputs* in, DeviceChunkSum* chunk_sums,
                        DeviceScalars* scalars, cudaStream_t stream) {
  SAMPLERD_CUDA_TRY(ResetTotals(scalars, kClampedTotal, 1, stream));
  SAMPLERD_CUDA_TRY(LaunchExactSum(ClampedSumKernel<Rule>, in->n, 1, chunk_sums,
                                   &scalars->totals[kClampedTotal], stream, r, *in, chunk_sums,
                                   &scalars->totals[kClampedTotal]));
  DeviceScalars host;
  SAMPLERD_CUDA_TRY(ReadScalars(scalars, &host, stream));
  in->mean_clamped = weight_math::MeanOf(TotalOf(host.totals[kClampedTotal]), in->n);
  return cudaSuccess;
}

// The clamp pass and the last pass, every rule: the mean of c_i, then out[i] = c_i /
// mean_clamped (`in.clamp` set).
template <typename Rule>
cudaError_t ClampAndWrite(const Rule& r, RecomputeInputs in, DeviceChunkSum* chunk_sums,
                          DeviceScalars* scalars, cudaStream_t stream) {
  SAMPLERD_CUDA_TRY(MeanClamped(r, &in, chunk_sums, scalars, stream));
  WriteKernel<Rule><<<GridFor(in.n, kBlock), kBlock, 0, stream>>>(r, in);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

// Whether the final weights with `in.mix` (and in.clamp for it) meet the effective sample size
// floor (weight_math::MeetsEssFloor of their exact sums S1 and S2), into *meets.
template <typename Rule>
cudaError_t MeetsFloor(const Rule& r, RecomputeInputs in, double fraction,
                       DeviceChunkSum* chunk_sums, DeviceScalars* scalars, cudaStream_t stream,
                       bool* meets) {
  SAMPLERD_CUDA_TRY(MeanClamped(r, &in, chunk_sums, scalars, stream));
  SAMPLERD_CUDA_TRY(ResetTotals(scalars, kFinalTotal, 2, stream));
  SAMPLERD_CUDA_TRY(LaunchExactSum(FinalSumKernel<Rule>, in.n, 2, chunk_sums,
                                   &scalars->totals[kFinalTotal], stream, r, in, chunk_sums,
                                   &scalars->totals[kFinalTotal]));
  DeviceScalars host;
  SAMPLERD_CUDA_TRY(ReadScalars(scalars, &host, stream));
  *meets = weight_math::MeetsEssFloor(TotalOf(host.totals[kFinalTotal]),
                                      TotalOf(host.totals[kFinalSquareTotal]), fraction, in.n);
  return cudaSuccess;
}

// A kFactor rule's last passes, from the factors in `out` and raw_mean_of(mix) (the mean raw
// weight with that mix): the mix raised by the effective sample size floor (the bisection of
// weight_math::EssFloorMix on the host, each trial's answer from the device's exact sums, as the
// CPU's), then the clamp and the result.
template <typename Rule, typename RawMeanOf>
cudaError_t FloorClampWrite(const Rule& r, const RecomputeParams& params, RecomputeInputs in,
                            const RawMeanOf& raw_mean_of, DeviceChunkSum* chunk_sums,
                            DeviceScalars* scalars, cudaStream_t stream) {
  auto with_mix = [&](double mix) {
    RecomputeInputs trial = in;
    trial.mix = mix;
    trial.one_minus_mix = 1.0 - mix;
    trial.clamp = weight_math::ClampRule{raw_mean_of(mix), params.clamp_lo, params.clamp_hi};
    return trial;
  };
  double mix = params.mix;
  if (params.min_effective_fraction > 0) {
    cudaError_t error = cudaSuccess;
    mix = weight_math::EssFloorMix(mix, [&](double trial) {
      bool meets = true;  // After an error: stop asking (the error is returned below).
      if (error == cudaSuccess) {
        error = MeetsFloor(r, with_mix(trial), params.min_effective_fraction, chunk_sums, scalars,
                           stream, &meets);
      }
      return meets;
    });
    SAMPLERD_CUDA_TRY(error);
  }
  return ClampAndWrite(r, with_mix(mix), chunk_sums, scalars, stream);
}

// ---- Loss within groups ----------------------------------------------------------------------

// The group of sample i (weight_math::GroupOf of its base weight's key).
__device__ __forceinline__ uint32_t GroupAt(const RecomputeInputs& in, const uint32_t* keys,
                                            uint32_t count, uint64_t i) {
  return weight_math::GroupOf(keys, count, weight_math::GroupKey(__ldg(in.base + i)));
}

// The largest x_i of each group, as the bits of a positive double (they order like the values).
template <typename Rule>
__global__ void __launch_bounds__(kBlock)
    GroupMaxKernel(Rule r, RecomputeInputs in, const uint32_t* keys, uint32_t count,
                   ull* x_max_bits) {
  for (uint64_t i = GlobalThread(); i < in.n; i += GridStride()) {
    const double x = weight_math::LossX(Bit(in.stats.seen, i), SignalAt(r, in, i), in.factors);
    atomicMax(x_max_bits + GroupAt(in, keys, count, i), static_cast<ull>(det::Bits(x)));
  }
}

// f_i with its group's rule into out[i]; the groups' fixed-point sums of f_i.
template <typename Rule>
__global__ void __launch_bounds__(kBlock)
    GroupFactorKernel(Rule r, RecomputeInputs in, const uint32_t* keys, uint32_t count,
                      const weight_math::LossFactorRule* rules, ull* low, ull* high) {
  for (uint64_t i = GlobalThread(); i < in.n; i += GridStride()) {
    const uint32_t g = GroupAt(in, keys, count, i);
    const float f = weight_math::LossFactor(Bit(in.stats.seen, i), SignalAt(r, in, i), rules[g]);
    in.out[i] = f;
    const uint64_t units = weight_math::GroupFactorUnits(f);
    atomicAdd(low + g, static_cast<ull>(weight_math::GroupFactorLow(units)));
    atomicAdd(high + g, static_cast<ull>(weight_math::GroupFactorHigh(units)));
  }
}

// out[i] = f_i / mean_g as a float.
__global__ void __launch_bounds__(kBlock)
    GroupNormaliseKernel(RecomputeInputs in, const uint32_t* keys, uint32_t count,
                         const double* means) {
  for (uint64_t i = GlobalThread(); i < in.n; i += GridStride()) {
    in.out[i] = weight_math::GroupNormalisedFactor(in.out[i], means[GroupAt(in, keys, count, i)]);
  }
}

// Copies `count` values of T from the device to `host` once the stream got there.
template <typename T>
cudaError_t ReadBack(const T* device, uint32_t count, std::vector<T>* host, cudaStream_t stream) {
  host->resize(count);
  SAMPLERD_CUDA_TRY(
      cudaMemcpyAsync(host->data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  return cudaStreamSynchronize(stream);
}

// Pass 2 of the loss policy within groups (in.factors set): the normalised factors into `out`.
template <typename Rule>
cudaError_t GroupFactorPasses(const Rule& r, const RecomputeParams& params,
                              const RecomputeInputs& in, cudaStream_t stream) {
  const uint32_t k = params.num_groups;
  AsyncBuffer keys_buffer, sums_buffer, rules_buffer, means_buffer;
  SAMPLERD_CUDA_TRY(keys_buffer.Allocate(k * sizeof(uint32_t), stream));
  SAMPLERD_CUDA_TRY(sums_buffer.Allocate(3 * k * sizeof(ull), stream));
  SAMPLERD_CUDA_TRY(rules_buffer.Allocate(k * sizeof(weight_math::LossFactorRule), stream));
  SAMPLERD_CUDA_TRY(means_buffer.Allocate(k * sizeof(double), stream));
  uint32_t* keys = keys_buffer.as<uint32_t>();
  ull* x_max_bits = sums_buffer.as<ull>();
  ull* low = x_max_bits + k;
  ull* high = low + k;
  SAMPLERD_CUDA_TRY(cudaMemcpyAsync(keys, params.group_keys, k * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, stream));
  SAMPLERD_CUDA_TRY(cudaMemsetAsync(x_max_bits, 0, 3 * k * sizeof(ull), stream));
  GroupMaxKernel<Rule><<<GridFor(in.n, kBlock), kBlock, 0, stream>>>(r, in, keys, k, x_max_bits);
  SAMPLERD_CUDA_TRY_LAUNCH();
  std::vector<ull> host_max;
  SAMPLERD_CUDA_TRY(ReadBack(x_max_bits, k, &host_max, stream));
  std::vector<weight_math::LossFactorRule> rules(k);
  for (uint32_t g = 0; g < k; ++g) {
    rules[g] = weight_math::GroupFactorRule(in.factors, det::FromBits(host_max[g]));
  }
  SAMPLERD_CUDA_TRY(cudaMemcpyAsync(rules_buffer.as<void>(), rules.data(),
                                    k * sizeof(weight_math::LossFactorRule), cudaMemcpyHostToDevice,
                                    stream));
  GroupFactorKernel<Rule><<<GridFor(in.n, kBlock), kBlock, 0, stream>>>(
      r, in, keys, k, rules_buffer.as<weight_math::LossFactorRule>(), low, high);
  SAMPLERD_CUDA_TRY_LAUNCH();
  std::vector<ull> host_sums;
  SAMPLERD_CUDA_TRY(ReadBack(low, 2 * k, &host_sums, stream));
  std::vector<double> means(k);
  for (uint32_t g = 0; g < k; ++g) {
    means[g] = weight_math::GroupFactorMean(host_sums[k + g], host_sums[g], params.group_counts[g]);
  }
  SAMPLERD_CUDA_TRY(cudaMemcpyAsync(means_buffer.as<void>(), means.data(), k * sizeof(double),
                                    cudaMemcpyHostToDevice, stream));
  GroupNormaliseKernel<<<GridFor(in.n, kBlock), kBlock, 0, stream>>>(in, keys, k,
                                                                     means_buffer.as<double>());
  SAMPLERD_CUDA_TRY_LAUNCH();
  // The host vectors above are read by the copies: wait for them before they go.
  return cudaStreamSynchronize(stream);
}

// A kFactor rule's passes after validation: passes 2.. of CpuBackend::RecomputeWeights.
template <typename Rule>
cudaError_t FactorPasses(const Rule& r, const RecomputeParams& params, const DeviceScalars& scan,
                         RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceScalars* scalars,
                         cudaStream_t stream) {
  in.factors = weight_math::LossFactorRuleOf(
      params.has_prior_loss, params.prior_loss, params.epsilon, params.alpha, scan.seen,
      TotalOf(scan.totals[kScanTotal]), weight_math::FloatFromBits(scan.ema_max_bits),
      scan.unseen != 0);
  in.one_minus_mix = 1.0 - params.mix;
  in.mix = params.mix;
  if (params.within_groups) {
    // The normalised factors in `out`; the raw weights' mean is the base weights' (each group
    // keeps its base share); the floor, the clamp and the result as below.
    SAMPLERD_CUDA_TRY(GroupFactorPasses(r, params, in, stream));
    in.mean_f = 1.0;
    const double mean_b = weight_math::MeanOf(TotalOf(scan.totals[kBaseTotal]), in.n);
    return FloorClampWrite(
        r, params, in, [mean_b](double) { return mean_b; }, chunk_sums, scalars, stream);
  }
  // Pass 2: f_i, parked in `out` (validation is over), the mean of f_i and, with base weights,
  // of base_i f_i.
  const bool with_base = in.base != nullptr;
  SAMPLERD_CUDA_TRY(LaunchExactSum(FactorKernel<Rule>, in.n, with_base ? 2 : 1, chunk_sums,
                                   &scalars->totals[kFactorTotal], stream, r, in, chunk_sums,
                                   &scalars->totals[kFactorTotal]));
  DeviceScalars host;
  SAMPLERD_CUDA_TRY(ReadScalars(scalars, &host, stream));
  in.mean_f = weight_math::MeanOf(TotalOf(host.totals[kFactorTotal]), in.n);
  // The raw weights' mean in closed form (no pass of its own).
  double mean_bf = in.mean_f, mean_b = 1.0;
  if (with_base) {
    mean_bf = weight_math::MeanOf(TotalOf(host.totals[kBaseFactorTotal]), in.n);
    mean_b = weight_math::MeanOf(TotalOf(scan.totals[kBaseTotal]), in.n);
  }
  const double mean_f = in.mean_f;
  // The floor, then passes 3 and 4: the clamped weights' mean, the result.
  return FloorClampWrite(
      r, params, in,
      [=](double mix) { return weight_math::LossRawMean(1.0 - mix, mean_f, mix, mean_bf, mean_b); },
      chunk_sums, scalars, stream);
}

// A kDirect rule's passes after validation.
template <typename Rule>
cudaError_t DirectPasses(const Rule& r, const RecomputeParams& params, const DeviceScalars& scan,
                         RecomputeInputs in, DeviceChunkSum* chunk_sums, DeviceScalars* scalars,
                         cudaStream_t stream) {
  // The raw weights' sum came with pass 1; pass 2: the clamped weights' mean; pass 3: the result.
  in.clamp = weight_math::ClampRule{weight_math::MeanOf(TotalOf(scan.totals[kScanTotal]), in.n),
                                    params.clamp_lo, params.clamp_hi};
  return ClampAndWrite(r, in, chunk_sums, scalars, stream);
}

// Every pass of the rule `r` (validated arguments): pass 1, its check into *check, then the
// shape's passes unless the check failed.
template <typename Rule>
cudaError_t RulePasses(const Rule& r, const RecomputeParams& params, const RecomputeInputs& in,
                       RecomputeCheck* check, cudaStream_t stream) {
  AsyncBuffer chunk_buffer, scalar_buffer;
  // Up to two series per pass (kFactor with base weights, the floor's S1 and S2).
  SAMPLERD_CUDA_TRY(chunk_buffer.Allocate(2 * NumChunks(in.n) * sizeof(DeviceChunkSum), stream));
  SAMPLERD_CUDA_TRY(scalar_buffer.Allocate(sizeof(DeviceScalars), stream));
  DeviceChunkSum* chunk_sums = chunk_buffer.as<DeviceChunkSum>();
  DeviceScalars* scalars = scalar_buffer.as<DeviceScalars>();
  InitScalarsKernel<<<1, 1, 0, stream>>>(scalars);
  SAMPLERD_CUDA_TRY_LAUNCH();

  // Pass 1: validation; nothing is written to `out` before it is complete.
  const int scan_series = kFactorRule<Rule> && in.base != nullptr ? 2 : 1;
  SAMPLERD_CUDA_TRY(LaunchExactSum(ScanKernel<Rule>, in.n, scan_series, chunk_sums,
                                   &scalars->totals[kScanTotal], stream, r, in, chunk_sums,
                                   scalars));
  DeviceScalars scan;
  SAMPLERD_CUDA_TRY(ReadScalars(scalars, &scan, stream));
  check->first_bad = scan.first_bad;
  check->base_positive = scan.base_positive != 0;
  check->current_positive = scan.current_positive != 0;
  if (check->first_bad != ~uint64_t{0} || (in.base != nullptr && !check->base_positive) ||
      (!kFactorRule<Rule> && in.current != nullptr && !check->current_positive)) {
    return cudaSuccess;  // The caller's error; `out` untouched.
  }
  if constexpr (kFactorRule<Rule>) {
    return FactorPasses(r, params, scan, in, chunk_sums, scalars, stream);
  } else {
    return DirectPasses(r, params, scan, in, chunk_sums, scalars, stream);
  }
}

// ---- SummarizeWeights ----------------------------------------------------------------------

// The exact sums of w_i and w_i^2 (scalars->totals[0], [1]; chunk sums in chunk_sums[0, chunks)
// and [chunks, 2 chunks)), min and max of SummaryBits, the zeros.
__global__ void __launch_bounds__(kSumBlock)
    SummaryKernel(const float* weights, uint64_t n, DeviceChunkSum* chunk_sums,
                  DeviceScalars* scalars) {
  uint32_t min_bits = ~uint32_t{0}, max_bits = 0;
  uint64_t zeros = 0;
  SumChunksOfBlock(
      n, chunk_sums, &scalars->totals[0], &scalars->totals[1],
      [&](uint64_t i) {
        const float x = __ldg(weights + i);
        const uint32_t bits = weight_math::SummaryBits(x);
        min_bits = bits < min_bits ? bits : min_bits;
        max_bits = bits > max_bits ? bits : max_bits;
        zeros += bits == 0;
        return x;
      },
      [](uint64_t, float x) { return static_cast<double>(x); },
      [](uint64_t, float x) { return weight_math::SquareTerm(x); });
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint32_t other_min = __shfl_xor_sync(0xffffffffu, min_bits, offset);
    const uint32_t other_max = __shfl_xor_sync(0xffffffffu, max_bits, offset);
    min_bits = other_min < min_bits ? other_min : min_bits;
    max_bits = other_max > max_bits ? other_max : max_bits;
    zeros += __shfl_xor_sync(0xffffffffu, static_cast<ull>(zeros), offset);
  }
  if (threadIdx.x % 32 != 0) return;
  atomicMin(&scalars->min_bits, min_bits);
  atomicMax(&scalars->max_bits, max_bits);
  if (zeros != 0) atomicAdd(reinterpret_cast<ull*>(&scalars->zero_count), static_cast<ull>(zeros));
}

// ---- ApplyLosses, GatherImportance ---------------------------------------------------------

__global__ void __launch_bounds__(kBlock)
    ApplyLossesKernel(DeviceLossStats stats, const uint64_t* indices, const float* losses,
                      uint64_t count, uint16_t marker, float decay) {
  for (uint64_t k = GlobalThread(); k < count; k += GridStride()) {
    const uint64_t i = indices[k];
    // Plain loads, not LoadStats' read-only __ldg: this kernel writes these arrays.
    SampleLossStats s = LossStatsFrom(stats.ema[i], stats.meta[i]);
    if (!ApplyLoss(s, losses[k], marker, decay)) continue;
    stats.ema[i] = s.ema_loss;
    stats.meta[i] = LossStatsMeta(s);
    // Seen and defined now (count >= 1); other samples of the word may change at once.
    atomicOr(stats.seen + i / 32, 1u << (i % 32));
    atomicOr(stats.defined + i / 32, 1u << (i % 32));
  }
}

__global__ void __launch_bounds__(kBlock)
    GatherImportanceKernel(const float* weights, const uint64_t* indices, uint64_t count,
                           float* out) {
  for (uint64_t k = GlobalThread(); k < count; k += GridStride()) {
    out[k] = 1.0f / weights[indices[k]];
  }
}

}  // namespace

cudaError_t RecomputeWeights(const RecomputeParams& params, uint64_t n, const float* base,
                             const float* current, const DeviceLossStats& stats, float* out,
                             RecomputeCheck* check, cudaStream_t stream) {
  if (n == 0 || n > kMaxSamples || stats.ema == nullptr || stats.meta == nullptr ||
      stats.seen == nullptr || stats.defined == nullptr || out == nullptr || check == nullptr) {
    return cudaErrorInvalidValue;
  }
  const uint64_t weight_bytes = n * sizeof(float);
  const uint64_t word_bytes = LossStatsWords(n) * sizeof(uint32_t);
  if (Overlap(out, weight_bytes, base, weight_bytes) ||
      Overlap(out, weight_bytes, current, weight_bytes) ||
      Overlap(out, weight_bytes, stats.ema, weight_bytes) ||
      Overlap(out, weight_bytes, stats.meta, n * sizeof(uint32_t)) ||
      Overlap(out, weight_bytes, stats.seen, word_bytes) ||
      Overlap(out, weight_bytes, stats.defined, word_bytes)) {
    return cudaErrorInvalidValue;
  }
  RecomputeInputs in;
  in.n = n;
  in.base = base;
  in.current = current;
  in.stats = stats;
  in.out = out;
  return VisitPolicyRule(params.loss, params.rule_inputs(), [&](const auto& r) -> cudaError_t {
    using Rule = std::decay_t<decltype(r)>;
    if constexpr (Rule::kShape == PolicyRuleShape::kNone) {
      return cudaErrorInvalidValue;  // Not a loss policy: nothing to recompute.
    } else {
      if (!r.HasInputs() ||
          (params.within_groups &&
           (!kFactorRule<Rule> || base == nullptr || params.num_groups == 0 ||
            params.group_keys == nullptr || params.group_counts == nullptr))) {
        return cudaErrorInvalidValue;
      }
      *check = RecomputeCheck{};
      return RulePasses(r, params, in, check, stream);
    }
  });
}

cudaError_t SummarizeWeights(const float* weights, uint64_t n, WeightSummaryValues* summary,
                             cudaStream_t stream) {
  if (weights == nullptr || n == 0 || n > kMaxSamples || summary == nullptr) {
    return cudaErrorInvalidValue;
  }
  const uint64_t chunks = NumChunks(n);
  AsyncBuffer chunk_buffer, scalar_buffer;
  SAMPLERD_CUDA_TRY(chunk_buffer.Allocate(2 * chunks * sizeof(DeviceChunkSum), stream));
  SAMPLERD_CUDA_TRY(scalar_buffer.Allocate(sizeof(DeviceScalars), stream));
  DeviceChunkSum* chunk_sums = chunk_buffer.as<DeviceChunkSum>();
  DeviceScalars* scalars = scalar_buffer.as<DeviceScalars>();
  InitScalarsKernel<<<1, 1, 0, stream>>>(scalars);
  SAMPLERD_CUDA_TRY_LAUNCH();
  SAMPLERD_CUDA_TRY(LaunchExactSum(SummaryKernel, n, 2, chunk_sums, &scalars->totals[0], stream,
                                   weights, n, chunk_sums, scalars));
  DeviceScalars host;
  SAMPLERD_CUDA_TRY(ReadScalars(scalars, &host, stream));
  const double s1 = TotalOf(host.totals[0]), s2 = TotalOf(host.totals[1]);
  summary->min = static_cast<double>(weight_math::FloatFromBits(host.min_bits));
  summary->max = static_cast<double>(weight_math::FloatFromBits(host.max_bits));
  summary->mean = weight_math::MeanOf(s1, n);
  summary->effective_sample_size = weight_math::EffectiveSampleSize(s1, s2);
  summary->zero_count = host.zero_count;
  return cudaSuccess;
}

cudaError_t ApplyLosses(const DeviceLossStats& stats, const uint64_t* indices, const float* losses,
                        uint64_t count, uint16_t marker, float decay, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (stats.ema == nullptr || stats.meta == nullptr || stats.seen == nullptr ||
      stats.defined == nullptr || indices == nullptr || losses == nullptr) {
    return cudaErrorInvalidValue;
  }
  ApplyLossesKernel<<<GridFor(count, kBlock), kBlock, 0, stream>>>(stats, indices, losses, count,
                                                                   marker, decay);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

cudaError_t GatherImportance(const float* weights, const uint64_t* indices, uint64_t count,
                             float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (weights == nullptr || indices == nullptr || out == nullptr) return cudaErrorInvalidValue;
  GatherImportanceKernel<<<GridFor(count, kBlock), kBlock, 0, stream>>>(weights, indices, count,
                                                                        out);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

}  // namespace gpu
}  // namespace samplerd
