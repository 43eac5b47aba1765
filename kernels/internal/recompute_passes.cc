#include "kernels/internal/recompute_passes.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/det_math.h"
#include "kernels/internal/det_math_batch.h"
#include "kernels/policy_rules.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace internal {
namespace {

// The loops below are written without branches on the data, so that the compiler vectorises
// them, and force-inlined into one function per SIMD level (bottom of the file), which compiles
// them for that level. Each pass works in blocks: a vectorised loop computes the block's terms
// into the chunk's buffer, and once a chunk's terms are all there, two more vectorised loops
// find their largest and add them up as integers (SumChunks, exact_sum.h).

constexpr uint64_t kBlock = 512;  // Samples per block: 4 KiB of terms, in L1.

// A SampleLossStats read as one 64-bit word (one load, which vectorises; the fields are of mixed
// sizes): the EMA's bits in bits 0-31, count in 32-47, last_epoch in 48-63.
static_assert(sizeof(SampleLossStats) == 8 && offsetof(SampleLossStats, ema_loss) == 0 &&
                  offsetof(SampleLossStats, count) == 4 &&
                  offsetof(SampleLossStats, last_epoch) == 6,
              "SampleLossStats layout");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the stats word assumes little-endian");

SAMPLERD_INLINE uint64_t StatsWord(const SampleLossStats* s) {
  uint64_t w;
  std::memcpy(&w, s, sizeof w);
  return w;
}
SAMPLERD_INLINE uint32_t EmaBits(uint64_t word) { return static_cast<uint32_t>(word); }
SAMPLERD_INLINE uint32_t CountOf(uint64_t word) { return (word >> 32) & 0xffff; }
SAMPLERD_INLINE uint32_t MarkerOf(uint64_t word) { return static_cast<uint32_t>(word >> 48); }
// count > 0 or last_epoch > 0: a loss was applied, so the EMA is defined (weight_math.h).
SAMPLERD_INLINE uint32_t EmaDefined(uint64_t word) {
  return weight_math::EmaDefined(CountOf(word), MarkerOf(word));
}

using weight_math::BadBits;
using weight_math::FloatBits;
using weight_math::FloatFromBits;
using weight_math::PositiveBits;
using weight_math::Select;

// The bad entry of sample i (ChunkScan::first_bad), one sample at a time: only called for a
// block known to hold one.
bool BadAt(const RecomputeArrays& a, uint64_t i) {
  return weight_math::SampleIsBad(a.base, a.current, a.stats[i], i);
}

// The passes are templates over the policy's rule (kernels/policy_rules.h) and its shape; the
// kind chooses the rule in VisitPolicyRule only. kFactor: the weights read are the base weights,
// kDirect: the current weights.
template <typename Rule>
constexpr bool kFactorRule = Rule::kShape == PolicyRuleShape::kFactor;
template <typename Rule>
constexpr bool kDirectRule = Rule::kShape == PolicyRuleShape::kDirect;

// The weights that the rule's shape reads (base for kFactor, current for kDirect).
template <typename Rule>
SAMPLERD_INLINE const float* ShapeWeights(const RecomputeArrays& a) {
  return kFactorRule<Rule> ? a.base : a.current;
}

// raw_i of RawWeightRule (weight_math.h's LossRaw for kFactor, the rule's Raw for kDirect).
// kWeights: whether the shape's weights are given; 1 otherwise, and 1 * v is v.
template <typename Rule, bool kWeights>
SAMPLERD_INLINE double RawAt(const Rule& r, const RecomputeArrays& a, const RawWeightRule& rule,
                             double one_minus_mix, uint64_t i) {
  const double weight = kWeights ? double{ShapeWeights<Rule>(a)[i]} : 1.0;
  if constexpr (kFactorRule<Rule>) {
    return weight_math::LossRaw(weight, a.out[i], one_minus_mix, rule.mean_f, rule.mix);
  } else {
    const uint64_t word = StatsWord(a.stats + i);
    return r.Raw(weight, FloatFromBits(EmaBits(word)), MarkerOf(word), i);
  }
}

template <typename Rule, bool kWeights>
SAMPLERD_INLINE bool ExcludedAt(const RecomputeArrays& a, uint64_t i) {
  if constexpr (!kWeights) return false;
  return ShapeWeights<Rule>(a)[i] == 0;
}

// c_i of ClampRule (weight_math::Clamped).
template <typename Rule, bool kWeights>
SAMPLERD_INLINE double ClampedAt(const Rule& r, const RecomputeArrays& a,
                                 const RawWeightRule& rule, double one_minus_mix,
                                 const ClampRule& clamp, uint64_t i) {
  return weight_math::Clamped(RawAt<Rule, kWeights>(r, a, rule, one_minus_mix, i),
                              ExcludedAt<Rule, kWeights>(a, i), clamp);
}

// The largest of the terms t[0, count) by their bits (an integer maximum; -0, negative as a
// signed integer, never wins over +0).
SAMPLERD_INLINE int64_t MaxBits(const double* t, uint64_t count) {
  int64_t max_bits = 0;
  for (uint64_t j = 0; j < count; ++j) {
    int64_t bits;
    std::memcpy(&bits, &t[j], sizeof bits);
    max_bits = std::max(max_bits, bits);
  }
  return max_bits;
}

// The exact sum of a chunk's terms t[0, count) (exact_sum.h) whose largest has bits max_bits:
// the terms quantised and added in two 64-bit halves (each below 2^44 for 4096 terms, so no
// carry is lost and the loop vectorises).
SAMPLERD_INLINE exact_sum::ChunkSum SumTerms(const double* t, uint64_t count, int64_t max_bits) {
  exact_sum::ChunkSum result;
  result.exponent = exact_sum::ChunkExponent(static_cast<uint64_t>(max_bits));
  uint64_t low = 0, high = 0;
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t q = exact_sum::Quantise(exact_sum::TermBits(t[j]), result.exponent);
    low += q & 0xffffffffu;
    high += q >> 32;
  }
  result.sum = (static_cast<exact_sum::uint128>(high) << 32) + low;
  return result;
}

// The chunks' exact sums of kSums series of terms over a group of chunks: [begin, end), begin a
// multiple of kSumChunk, holds up to kChunksPerGroup chunks. block_terms(chunk, first, count,
// blocks) writes the terms of samples [first, first + count) (count <= kBlock) of the group's
// chunk `chunk` to blocks[k][0, count) for each series k and returns how many it wrote (count,
// or 0 for a chunk it gave up: the scan at a bad entry; that chunk's sums are then unspecified).
// sums[k][chunk] (k < kSums) = series k's ChunkSum of the chunk. The largest term is found block by
// block, while the block is in L1.
template <int kSums, typename BlockTerms>
SAMPLERD_INLINE void SumChunksOf(uint64_t begin, uint64_t end, const BlockTerms& block_terms,
                                 exact_sum::ChunkSum* const* sums) {
  alignas(64) double terms[kSums][kSumChunk];  // 32 KiB per series: a chunk's terms, in L1/L2.
  for (uint64_t chunk = 0; begin + chunk * kSumChunk < end; ++chunk) {
    const uint64_t chunk_begin = begin + chunk * kSumChunk;
    const uint64_t chunk_end = std::min(end, chunk_begin + kSumChunk);
    uint64_t written = 0;
    int64_t max_bits[kSums] = {};
    for (uint64_t first = chunk_begin; first < chunk_end; first += kBlock) {
      const uint64_t count = std::min(kBlock, chunk_end - first);
      double* blocks[kSums];
      for (int k = 0; k < kSums; ++k) blocks[k] = terms[k] + (first - chunk_begin);
      const uint64_t wrote = block_terms(chunk, first, count, blocks);
      for (int k = 0; k < kSums; ++k)
        max_bits[k] = std::max(max_bits[k], MaxBits(blocks[k], wrote));
      written += wrote;
      if (wrote < count) break;
    }
    for (int k = 0; k < kSums; ++k) sums[k][chunk] = SumTerms(terms[k], written, max_bits[k]);
  }
}

// One series: block_terms(chunk, first, count, terms) writes to terms[0, count).
template <typename BlockTerms>
SAMPLERD_INLINE void SumChunks(uint64_t begin, uint64_t end, const BlockTerms& block_terms,
                               exact_sum::ChunkSum* sums) {
  exact_sum::ChunkSum* const series[1] = {sums};
  SumChunksOf<1>(
      begin, end,
      [&](uint64_t chunk, uint64_t first, uint64_t count, double* const* blocks)
          __attribute__((always_inline)) { return block_terms(chunk, first, count, blocks[0]); },
      series);
}

// ---- ScanChunks

// The series the scan sums: the signals (kFactor) or raw_i (kDirect), and for kFactor with base
// weights the base weights too.
template <typename Rule, bool kBase>
constexpr int kScanSums = kFactorRule<Rule> && kBase ? 2 : 1;

// Validates samples [first, first + count) into `scan` and writes the block's terms: terms[0]
// (kFactor: the signals of the seen samples, +0 for the others; kDirect: raw_i; kNone: 0) and for
// kFactor with base weights terms[1] (base_i). Returns false at a bad entry, with scan.first_bad
// set.
template <typename Rule, bool kBase, bool kCurrent>
SAMPLERD_INLINE bool ScanBlock(const Rule& r, const RecomputeArrays& a, const RawWeightRule& rule,
                               uint64_t first, uint64_t count, ChunkScan& scan,
                               uint32_t& ema_max_bits, double* const* terms) {
  // Reductions of this loop only (the vectoriser takes those of an innermost loop).
  uint32_t bad = 0, base_positive = 0, current_positive = 0, unseen = 0, max_bits = 0, seen = 0;
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t i = first + j;
    const uint64_t word = StatsWord(a.stats + i);
    const uint32_t ema_bits = EmaBits(word);
    bad |= BadBits(ema_bits) & EmaDefined(word);
    if constexpr (kBase) {
      const uint32_t b = FloatBits(a.base[i]);
      bad |= BadBits(b);
      base_positive |= PositiveBits(b);
    }
    if constexpr (kCurrent) {
      const uint32_t b = FloatBits(a.current[i]);
      bad |= BadBits(b);
      current_positive |= PositiveBits(b);
    }
    if constexpr (kFactorRule<Rule>) {
      const uint32_t seen_i = CountOf(word) != 0;
      seen += seen_i;
      unseen |= seen_i ^ 1;
      // The signal, read only for a seen sample.
      const uint32_t v_bits = FloatBits(r.Signal(FloatFromBits(ema_bits), i));
      // The largest signal by its bits (non-negative floats order like their bits; -0 as +0).
      max_bits = std::max(max_bits, v_bits & -(seen_i & (v_bits != 0x80000000u)));
      terms[0][j] = Select(seen_i, FloatFromBits(v_bits), 0.0);
      if constexpr (kBase) terms[1][j] = a.base[i];
    } else if constexpr (kDirectRule<Rule>) {
      terms[0][j] = RawAt<Rule, kCurrent>(r, a, rule, 0.0, i);
    } else {
      terms[0][j] = 0;
    }
  }
  if (bad) {
    for (uint64_t i = first;; ++i) {
      if (BadAt(a, i)) {
        scan.first_bad = i;
        return false;
      }
    }
  }
  scan.base_positive |= base_positive;
  scan.current_positive |= current_positive;
  scan.unseen |= unseen;
  scan.seen += seen;
  ema_max_bits = std::max(ema_max_bits, max_bits);
  return true;
}

template <typename Rule, bool kBase, bool kCurrent>
SAMPLERD_INLINE void ScanTyped(const Rule& r, const RecomputeArrays& a, const RawWeightRule& rule,
                               uint64_t begin, uint64_t end, ChunkScan* scans) {
  constexpr int kSums = kScanSums<Rule, kBase>;
  ChunkScan chunk_scan[kChunksPerGroup];
  uint32_t ema_max_bits[kChunksPerGroup] = {};
  exact_sum::ChunkSum sums[kSums][kChunksPerGroup];
  exact_sum::ChunkSum* series[kSums];
  for (int k = 0; k < kSums; ++k) series[k] = sums[k];
  SumChunksOf<kSums>(
      begin, end,
      [&](uint64_t chunk, uint64_t first, uint64_t count, double* const* terms)
          __attribute__((always_inline))
              ->uint64_t {
                if (chunk_scan[chunk].first_bad != kNoSample) return 0;
                return ScanBlock<Rule, kBase, kCurrent>(r, a, rule, first, count,
                                                        chunk_scan[chunk], ema_max_bits[chunk],
                                                        terms)
                           ? count
                           : 0;
              },
      series);
  const uint64_t chunks = (end - begin + kSumChunk - 1) / kSumChunk;
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    ChunkScan& scan = chunk_scan[chunk];
    scan.ema_max = FloatFromBits(ema_max_bits[chunk]);
    (kFactorRule<Rule> ? scan.ema_sum : scan.raw_sum) = sums[0][chunk];
    if constexpr (kSums == 2) scan.base_sum = sums[1][chunk];
    scans[chunk] = scan;
  }
}

SAMPLERD_INLINE void ScanLoop(const RecomputeArrays& a, const RawWeightRule& rule, uint64_t begin,
                              uint64_t end, ChunkScan* scans) {
  VisitPolicyRule(
      rule.kind, RuleInputsOf(a, rule), [&](const auto& r) __attribute__((always_inline)) {
        using Rule = std::decay_t<decltype(r)>;
        if (a.base != nullptr) {
          a.current != nullptr ? ScanTyped<Rule, true, true>(r, a, rule, begin, end, scans)
                               : ScanTyped<Rule, true, false>(r, a, rule, begin, end, scans);
        } else {
          a.current != nullptr ? ScanTyped<Rule, false, true>(r, a, rule, begin, end, scans)
                               : ScanTyped<Rule, false, false>(r, a, rule, begin, end, scans);
        }
      });
}

// ---- LossFactorsChunks

// The factors of samples [first, first + count) (count <= kBlock) into out and x[0, count).
template <typename Rule>
SAMPLERD_INLINE void LossFactorsBlock(const Rule& r, SimdLevel level, const RecomputeArrays& a,
                                      const LossFactorParams& p, uint64_t first, uint64_t count,
                                      double* x) {
  for (uint64_t j = 0; j < count; ++j) {
    const uint64_t word = StatsWord(a.stats + first + j);
    x[j] = weight_math::LossX(CountOf(word) != 0, r.Signal(FloatFromBits(EmaBits(word)), first + j),
                              p);
  }
  // weight_math::LossFactor, with Log2 and Exp2 batched.
  if (p.alpha == 1.0) {
    for (uint64_t j = 0; j < count; ++j) x[j] = weight_math::LossRatio(x[j], p);
  } else {  // (x / x_max)^alpha = 2^(alpha (log2 x - log2 x_max)).
    Log2ManyWith(level, x, count, x);
    for (uint64_t j = 0; j < count; ++j) x[j] = weight_math::LossExponent(x[j], p);
    Exp2ManyWith(level, x, count, x);
  }
  for (uint64_t j = 0; j < count; ++j) {
    const float f = static_cast<float>(x[j]);
    a.out[first + j] = f;
    x[j] = f;
  }
}

template <typename Rule>
SAMPLERD_INLINE void LossFactorsTyped(const Rule& r, SimdLevel level, const RecomputeArrays& a,
                                      const LossFactorParams& p, uint64_t begin, uint64_t end,
                                      exact_sum::ChunkSum* sums,
                                      exact_sum::ChunkSum* base_factor_sums) {
  if (a.base == nullptr) {
    SumChunks(
        begin, end,
        [&](uint64_t, uint64_t first, uint64_t count, double* x) __attribute__((always_inline))
            ->uint64_t {
              LossFactorsBlock(r, level, a, p, first, count, x);
              return count;
            },
        sums);
    return;
  }
  exact_sum::ChunkSum* const series[2] = {sums, base_factor_sums};
  SumChunksOf<2>(
      begin, end,
      [&](uint64_t, uint64_t first, uint64_t count, double* const* terms)
          __attribute__((always_inline))
              ->uint64_t {
                LossFactorsBlock(r, level, a, p, first, count, terms[0]);
                for (uint64_t j = 0; j < count; ++j) {
                  terms[1][j] = weight_math::BaseFactorTerm(a.base[first + j],
                                                            static_cast<float>(terms[0][j]));
                }
                return count;
              },
      series);
}

SAMPLERD_INLINE void LossFactorsLoop(SimdLevel level, const RecomputeArrays& a,
                                     const RawWeightRule& rule, const LossFactorParams& p,
                                     uint64_t begin, uint64_t end, exact_sum::ChunkSum* sums,
                                     exact_sum::ChunkSum* base_factor_sums) {
  VisitPolicyRule(
      rule.kind, RuleInputsOf(a, rule), [&](const auto& r) __attribute__((always_inline)) {
        using Rule = std::decay_t<decltype(r)>;
        if constexpr (kFactorRule<Rule>) {
          LossFactorsTyped(r, level, a, p, begin, end, sums, base_factor_sums);
        }
      });
}

// ---- SumClampedChunks, SumFinalChunks, WriteWeightsRange

template <typename Rule, bool kWeights>
SAMPLERD_INLINE void SumClampedTyped(const Rule& r, const RecomputeArrays& a,
                                     const RawWeightRule& rule, const ClampRule& clamp,
                                     uint64_t begin, uint64_t end, exact_sum::ChunkSum* sums) {
  const double one_minus_mix = 1.0 - rule.mix;
  SumChunks(
      begin, end,
      [&](uint64_t, uint64_t first, uint64_t count, double* terms) __attribute__((always_inline))
          ->uint64_t {
            for (uint64_t j = 0; j < count; ++j) {
              terms[j] = ClampedAt<Rule, kWeights>(r, a, rule, one_minus_mix, clamp, first + j);
            }
            return count;
          },
      sums);
}

template <typename Rule, bool kWeights>
SAMPLERD_INLINE void SumFinalTyped(const Rule& r, const RecomputeArrays& a,
                                   const RawWeightRule& rule, const ClampRule& clamp,
                                   double mean_clamped, uint64_t begin, uint64_t end,
                                   exact_sum::ChunkSum* sums, exact_sum::ChunkSum* square_sums) {
  const double one_minus_mix = 1.0 - rule.mix;
  exact_sum::ChunkSum* const series[2] = {sums, square_sums};
  SumChunksOf<2>(
      begin, end,
      [&](uint64_t, uint64_t first, uint64_t count, double* const* terms)
          __attribute__((always_inline))
              ->uint64_t {
                for (uint64_t j = 0; j < count; ++j) {
                  const double c =
                      ClampedAt<Rule, kWeights>(r, a, rule, one_minus_mix, clamp, first + j);
                  const float w = weight_math::FinalWeight(c, mean_clamped);
                  terms[0][j] = w;
                  terms[1][j] = weight_math::SquareTerm(w);
                }
                return count;
              },
      series);
}

template <typename Rule, bool kWeights>
SAMPLERD_INLINE void WriteTyped(const Rule& r, const RecomputeArrays& a, const RawWeightRule& rule,
                                const ClampRule& clamp, double mean_clamped, uint64_t begin,
                                uint64_t end) {
  const double one_minus_mix = 1.0 - rule.mix;
  for (uint64_t i = begin; i < end; ++i) {
    const double c = ClampedAt<Rule, kWeights>(r, a, rule, one_minus_mix, clamp, i);
    a.out[i] = weight_math::FinalWeight(c, mean_clamped);
  }
}

// Calls Typed<Rule, weights given>(rule object, a, rule, ...) for the rule of rule.kind (the
// clamp and the result: kFactor and kDirect rules; never called for kNone).
#define SAMPLERD_BY_RULE(Typed, a, rule, ...)                                                 \
  VisitPolicyRule(                                                                            \
      (rule).kind, RuleInputsOf(a, rule), [&](const auto& r) __attribute__((always_inline)) { \
        using Rule = std::decay_t<decltype(r)>;                                               \
        if constexpr (!std::is_same_v<Rule, NoLossRule>) {                                    \
          ShapeWeights<Rule>(a) != nullptr ? Typed<Rule, true>(r, a, rule, __VA_ARGS__)       \
                                           : Typed<Rule, false>(r, a, rule, __VA_ARGS__);     \
        }                                                                                     \
      })

SAMPLERD_INLINE void SumClampedLoop(const RecomputeArrays& a, const RawWeightRule& rule,
                                    const ClampRule& clamp, uint64_t begin, uint64_t end,
                                    exact_sum::ChunkSum* sums) {
  SAMPLERD_BY_RULE(SumClampedTyped, a, rule, clamp, begin, end, sums);
}

SAMPLERD_INLINE void SumFinalLoop(const RecomputeArrays& a, const RawWeightRule& rule,
                                  const ClampRule& clamp, double mean_clamped, uint64_t begin,
                                  uint64_t end, exact_sum::ChunkSum* sums,
                                  exact_sum::ChunkSum* square_sums) {
  SAMPLERD_BY_RULE(SumFinalTyped, a, rule, clamp, mean_clamped, begin, end, sums, square_sums);
}

SAMPLERD_INLINE void WriteWeightsLoop(const RecomputeArrays& a, const RawWeightRule& rule,
                                      const ClampRule& clamp, double mean_clamped, uint64_t begin,
                                      uint64_t end) {
  SAMPLERD_BY_RULE(WriteTyped, a, rule, clamp, mean_clamped, begin, end);
}

// ---- One function per SIMD level for each pass, and the choice between them.

#define SAMPLERD_PER_LEVEL(Name, Params, Args)                                \
  SAMPLERD_TARGET_AVX512 void Name##Avx512 Params { return Name##Loop Args; } \
  SAMPLERD_TARGET_AVX2 void Name##Avx2 Params { return Name##Loop Args; }     \
  void Name##Scalar Params { return Name##Loop Args; }

#define SAMPLERD_CHOOSE_LEVEL(level, Name, Args) \
  switch (level) {                               \
    case SimdLevel::kAvx512:                     \
      return Name##Avx512 Args;                  \
    case SimdLevel::kAvx2:                       \
      return Name##Avx2 Args;                    \
    case SimdLevel::kScalar:                     \
      break;                                     \
  }                                              \
  return Name##Scalar Args

SAMPLERD_PER_LEVEL(Scan,
                   (const RecomputeArrays& a, const RawWeightRule& rule, uint64_t b, uint64_t e,
                    ChunkScan* scans),
                   (a, rule, b, e, scans))
SAMPLERD_PER_LEVEL(LossFactors,
                   (SimdLevel level, const RecomputeArrays& a, const RawWeightRule& rule,
                    const LossFactorParams& p, uint64_t b, uint64_t e, exact_sum::ChunkSum* sums,
                    exact_sum::ChunkSum* base_factor_sums),
                   (level, a, rule, p, b, e, sums, base_factor_sums))
SAMPLERD_PER_LEVEL(SumClamped,
                   (const RecomputeArrays& a, const RawWeightRule& rule, const ClampRule& c,
                    uint64_t b, uint64_t e, exact_sum::ChunkSum* sums),
                   (a, rule, c, b, e, sums))
SAMPLERD_PER_LEVEL(SumFinal,
                   (const RecomputeArrays& a, const RawWeightRule& rule, const ClampRule& c,
                    double mean_clamped, uint64_t b, uint64_t e, exact_sum::ChunkSum* sums,
                    exact_sum::ChunkSum* square_sums),
                   (a, rule, c, mean_clamped, b, e, sums, square_sums))
SAMPLERD_PER_LEVEL(WriteWeights,
                   (const RecomputeArrays& a, const RawWeightRule& rule, const ClampRule& c,
                    double mean_clamped, uint64_t b, uint64_t e),
                   (a, rule, c, mean_clamped, b, e))

}  // namespace

void ScanChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                uint64_t begin, uint64_t end, ChunkScan* scans) {
  SAMPLERD_CHOOSE_LEVEL(level, Scan, (arrays, rule, begin, end, scans));
}

void LossFactorsChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                       const LossFactorParams& params, uint64_t begin, uint64_t end,
                       exact_sum::ChunkSum* sums, exact_sum::ChunkSum* base_factor_sums) {
  SAMPLERD_CHOOSE_LEVEL(level, LossFactors,
                        (level, arrays, rule, params, begin, end, sums, base_factor_sums));
}

void SumClampedChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                      const ClampRule& clamp, uint64_t begin, uint64_t end,
                      exact_sum::ChunkSum* sums) {
  SAMPLERD_CHOOSE_LEVEL(level, SumClamped, (arrays, rule, clamp, begin, end, sums));
}

void SumFinalChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                    const ClampRule& clamp, double mean_clamped, uint64_t begin, uint64_t end,
                    exact_sum::ChunkSum* sums, exact_sum::ChunkSum* square_sums) {
  SAMPLERD_CHOOSE_LEVEL(level, SumFinal,
                        (arrays, rule, clamp, mean_clamped, begin, end, sums, square_sums));
}

void WriteWeightsRange(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                       const ClampRule& clamp, double mean_clamped, uint64_t begin, uint64_t end) {
  SAMPLERD_CHOOSE_LEVEL(level, WriteWeights, (arrays, rule, clamp, mean_clamped, begin, end));
}

}  // namespace internal
}  // namespace samplerd
