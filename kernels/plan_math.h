// The per-element rules of the plan side of docs/SAMPLING.md, as host + device functions: the
// Efraimidis-Spirakis key, the shuffle's buckets and swap words, the quantisation of the draws
// with replacement, and the shards (which plan positions a rank serves, and how many). One home
// for each: the CPU backend (kernels/plan.cc, shard.cc, internal/shuffle.cc,
// internal/draw_table.cc, internal/es_select.cc), the CUDA kernels (kernels/cuda/*.cu) and the
// sequential reference (kernels/cuda/reference.cc) all call these. The weight side's sibling is
// weight_math.h.
//
// Compiled by g++ as host code (CI tests it: plan_math_test.cc, and reference_test against the
// CPU backend) and by nvcc for the device (-fmad=false: the same bits). Header-only and free of
// Abseil and libm, so that nvcc compiles it for the device. Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_PLAN_MATH_H_
#define SAMPLERD_KERNELS_PLAN_MATH_H_

#include <cstdint>
#include <cstring>

#include "kernels/det_math.h"
#include "kernels/philox.h"

namespace samplerd {

// ---- Shard layouts (plain data: the server's JobSpec, the backends, the device) ----------------

enum class PartitionMode {
  kInterleaved,  // Rank r: plan positions r, r+R, r+2R, ... (torch DistributedSampler).
  kContiguous,   // Rank r: one contiguous block.
};

enum class UnevenMode {
  kPad,       // Every shard ceil(M/R) long; positions >= M wrap to position mod M.
  kDropLast,  // Every shard floor(M/R) long; the tail is dropped.
  kUneven,    // Lengths floor(M/R) or ceil(M/R); every position exactly once (evaluation).
};

// How a plan is dealt to R data-parallel ranks (docs/SAMPLING.md, "Shards").
struct ShardSpec {
  uint32_t world_size = 1;  // R >= 1.
  PartitionMode partition = PartitionMode::kInterleaved;
  UnevenMode uneven = UnevenMode::kPad;
};

namespace plan_math {

// IEEE bits of +inf: the Efraimidis-Spirakis key of a sample that is never selected.
constexpr uint64_t kInfinityKeyBits = 0x7ff0000000000000ull;

// Number of bits needed to write n: n < 2^BitWidth(n) (0 for 0).
SAMPLERD_HD int BitWidth(uint64_t n) {
  int w = 0;
  while (w < 64 && (n >> w) != 0) ++w;
  return w;
}

// ---- Without replacement, M < N: Efraimidis-Spirakis keys -------------------------------------

// key_i = -Log2(UniformOpen01(RandomBits64(seed, epoch, 1, i))) / w_i as IEEE bits; +inf when
// w_i <= 0 (or NaN: the caller validated the weights). Positive doubles order like their bits.
SAMPLERD_HD uint64_t EsKeyBits(uint64_t seed, uint64_t epoch, uint64_t i, float weight) {
  if (!(weight > 0)) return kInfinityKeyBits;
  const double u = det::UniformOpen01(RandomBits64(seed, epoch, RandomStream::kEsKey, i));
  return det::Bits(-det::Log2(u) / static_cast<double>(weight));
}

// ---- The shuffle -------------------------------------------------------------------------------

// Inputs per bucket: b = the smallest b with M <= kShuffleBucketTarget * 2^b, so buckets hold
// 512-1024 inputs on average (M > 1024): a bucket of block-relative 16-bit offsets fits a
// thread's share of shared memory.
constexpr uint64_t kShuffleBucketTarget = 1024;

SAMPLERD_HD int ShuffleBucketBits(uint64_t m) {
  int bits = 0;
  while (bits < 40 && (kShuffleBucketTarget << bits) < m) ++bits;
  return bits;
}

// The largest shuffle (M without replacement) the definition allows: SwapWords counts from
// B * 2^40 in a 64-bit counter, so bucket numbers B < 2^24, b <= 24 bits and M <= 1024 * 2^24
// = 2^34. PlanEpoch rejects larger M without replacement (INVALID_ARGUMENT).
constexpr uint64_t kMaxShuffleBucketBits = 24;
constexpr uint64_t kMaxShuffleInputs = kShuffleBucketTarget << kMaxShuffleBucketBits;

// B_k: the top `bits` bits of word k mod 4 of RandomBlock(seed, epoch, 2, k / 4); 0 for bits 0.
SAMPLERD_HD uint32_t ShuffleBucketOf(uint64_t seed, uint64_t epoch, int bits, uint64_t k) {
  if (bits == 0) return 0;
  const Philox4x32Counter block = RandomBlock(seed, epoch, RandomStream::kShuffle, k / 4);
  // A selection, not block.v[k % 4]: a run-time index would put the block in local memory on
  // the device.
  const uint64_t w = k % 4;
  const uint32_t word = w == 0   ? block.v[0]
                        : w == 1 ? block.v[1]
                        : w == 2 ? block.v[2]
                                 : block.v[3];
  return word >> (32 - bits);
}

// The words u_0, u_1, ... of bucket B's Fisher-Yates: u_t = word t mod 4 of
// RandomBlock(seed, epoch, 4, B * 2^40 + t / 4). One Philox call per four words.
class SwapWords {
 public:
  SAMPLERD_HD SwapWords(uint64_t seed, uint64_t epoch, uint64_t bucket)
      : seed_(seed), epoch_(epoch), counter_(bucket << 40) {}

  SAMPLERD_HD uint32_t Next() {
    if (used_ == 4) {
      block_ = RandomBlock(seed_, epoch_, RandomStream::kShuffleSwap, counter_++);
      used_ = 0;
    }
    // A switch, not block_.v[used_]: a run-time index would put the block in local memory on
    // the device.
    const int w = used_++;
    return w == 0 ? block_.v[0] : w == 1 ? block_.v[1] : w == 2 ? block_.v[2] : block_.v[3];
  }

  // j uniform in [0, i] for the step at position i (i + 1 < 2^32): Lemire's multiply-shift with
  // rejection, exactly as docs/SAMPLING.md (the rejected words are consumed).
  SAMPLERD_HD uint32_t SwapTarget(uint32_t i) {
    const uint32_t range = i + 1;
    uint64_t product = static_cast<uint64_t>(Next()) * range;
    if (static_cast<uint32_t>(product) < range) {       // Rare: maybe in the biased tail.
      const uint32_t threshold = (0u - range) % range;  // 2^32 mod range.
      while (static_cast<uint32_t>(product) < threshold) {
        product = static_cast<uint64_t>(Next()) * range;
      }
    }
    return static_cast<uint32_t>(product >> 32);
  }

 private:
  uint64_t seed_, epoch_, counter_;
  Philox4x32Counter block_{};
  int used_ = 4;
};

// ---- With replacement --------------------------------------------------------------------------

// q = floor(w * scale), 1 for a positive weight that truncates to 0 (scale = 2^s: see
// QuantisationScale; a positive weight is never silently dropped). w finite, >= 0,
// w * scale < 2^63: the signed conversion is exact, and cheaper than the unsigned one. Scaling
// by a power of two and truncating give the same integers on every IEEE machine.
SAMPLERD_HD uint64_t Quantise(float w, double scale) {
  const uint64_t q = static_cast<uint64_t>(static_cast<int64_t>(static_cast<double>(w) * scale));
  return (q == 0 && w > 0) ? 1 : q;
}

// 2^s with s = 62 - BitWidth(n) - e_max, w_max < 2^e_max, from the IEEE bits of the largest
// weight (> 0; a float, so a normal double): q_i <= w_max * 2^s < 2^(62 - BitWidth(n)), so
// sum q_i < 2^62 + n < 2^63 (the + n: weights rounded up to 1).
SAMPLERD_HD double QuantisationScale(uint64_t n, uint32_t max_weight_bits) {
  float w_max;
  std::memcpy(&w_max, &max_weight_bits, sizeof w_max);
  const int max_exp =
      static_cast<int>((det::Bits(static_cast<double>(w_max)) >> 52) & 0x7ff) - 1023 + 1;
  return det::Pow2(62 - BitWidth(n) - max_exp);
}

// The device's draw table keeps the exclusive prefix sums of q only at every kDrawBlock-th sample
// (the block prefix: block_prefix[b] = prefix[b * kDrawBlock], 1 B per sample instead of 8) and
// recomputes the q of one block from its weights at each draw: a block's 8 weights are one
// 32-byte sector, as prefix[i] and prefix[i + 1] were. The draw is the definition's (the i with
// prefix[i] <= t < prefix[i + 1]); only where the sums are kept changed.
constexpr uint64_t kDrawBlock = 8;

// Blocks of n samples.
SAMPLERD_HD uint64_t DrawBlocks(uint64_t n) { return (n + kDrawBlock - 1) / kDrawBlock; }

// The sum of q over block b (samples [b kDrawBlock, min(n, (b + 1) kDrawBlock))); 0 for b >=
// DrawBlocks(n) (the scan's last entry).
SAMPLERD_HD uint64_t BlockQuantisedSum(const float* weights, uint64_t n, double scale,
                                       uint64_t block) {
  uint64_t sum = 0;
  const uint64_t first = block * kDrawBlock;
  for (uint64_t i = first; i < first + kDrawBlock && i < n; ++i) sum += Quantise(weights[i], scale);
  return sum;
}

// The draw for t within block b, given block_start = prefix[b kDrawBlock] <= t < the block's
// end prefix: the i of the block with prefix[i] <= t < prefix[i + 1] (a zero weight's q = 0
// is never the answer: its prefix[i + 1] equals prefix[i]). Without branches on the data: the
// prefix ends of the block's samples but its last are nondecreasing, so the number of them <= t
// is the answer's offset in the block (no divergence: every thread of a warp runs the same
// iterations). The CPU backend keeps the prefix of every sample instead (draw_table.h): there
// these recomputed q cost ~1.5x in draw time for 1/7 of the memory (measured at N = 1e7).
SAMPLERD_HD uint64_t DrawInBlock(const float* weights, uint64_t n, double scale, uint64_t block,
                                 uint64_t block_start, uint64_t t) {
  const uint64_t first = block * kDrawBlock;
  const uint64_t count = first + kDrawBlock < n ? kDrawBlock : n - first;
  uint64_t end = block_start, steps = 0;
  for (uint64_t j = 0; j + 1 < count; ++j) {
    end += Quantise(weights[first + j], scale);
    steps += end <= t ? 1 : 0;
  }
  return first + steps;
}

// ---- Shards ------------------------------------------------------------------------------------

// Length of rank `rank`'s shard of a plan of `plan_length` (M) positions: the one home of the
// rule (kernels/shard.h's checked ShardLength, the reference and the clients call it).
// Preconditions (not checked: kernels/shard.h's CheckRank does): spec.world_size >= 1,
// rank < world_size.
SAMPLERD_HD uint64_t ShardLength(uint64_t plan_length, const ShardSpec& spec, uint32_t rank) {
  const uint64_t r = spec.world_size;
  switch (spec.uneven) {
    case UnevenMode::kPad:
      return (plan_length + r - 1) / r;
    case UnevenMode::kDropLast:
      return plan_length / r;
    case UnevenMode::kUneven:
      break;
  }
  return plan_length / r + (rank < plan_length % r ? 1 : 0);
}

// The plan position of a shard position: the one home of the rule (kernels/shard.cc's
// ShardToPlanPosition and the device's ExtractShard call it). Preconditions: rank < R,
// shard_pos < ShardLength(plan_length, spec, rank).
SAMPLERD_HD uint64_t ShardPlanPosition(uint64_t plan_length, const ShardSpec& spec, uint32_t rank,
                                       uint64_t shard_pos) {
  const uint64_t r = spec.world_size;
  uint64_t p;
  if (spec.partition == PartitionMode::kInterleaved) {
    p = rank + shard_pos * r;
  } else if (spec.uneven == UnevenMode::kUneven) {
    // Rank r's block starts after the ranks before it: rank * floor(M/R) plus one for each of
    // them that holds one of the M mod R longer shards.
    const uint64_t base = plan_length / r, extra = plan_length % r;
    p = rank * base + (rank < extra ? rank : extra) + shard_pos;
  } else {
    p = rank * ShardLength(plan_length, spec, rank) + shard_pos;  // Every shard is as long.
  }
  return p < plan_length ? p : p % plan_length;  // Only kPad passes the plan's end.
}

}  // namespace plan_math
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_PLAN_MATH_H_
