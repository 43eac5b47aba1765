#include "kernels/internal/es_select.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "kernels/det_math.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/philox_batch.h"
#include "kernels/large_array.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kGrain = 1 << 16;
constexpr uint64_t kKeyBlock = 512;
// Below this many samples: one nth_element on (key, index) instead of the radix select.
constexpr uint64_t kSmallSelect = 1 << 16;
constexpr int kDigitBits = 16;
constexpr uint64_t kDigits = uint64_t{1} << kDigitBits;

using det::FromBits;
inline uint64_t ToBits(double d) { return det::Bits(d); }

// plan_math::EsKeyBits of 64 random bits each, written without branches so that the compiler
// vectorises it; the operations are exactly those of det::UniformOpen01, det::Log2 (for its normal
// inputs in (0, 1), the only ones UniformOpen01 gives) and the division, in the same order. Inlined
// into one function per SIMD level; FMA contraction is off for all of them
// (-ffp-contract=off), so every version returns the same bits (es_select_test.cc checks).
__attribute__((always_inline)) inline void KeysLoop(const uint64_t* r, const float* weights,
                                                    uint64_t count, uint64_t* keys) {
  for (uint64_t k = 0; k < count; ++k) {
    // double(r >> 12), exactly, by bits (r >> 12 < 2^52): 2^52 + v has v as its mantissa.
    // Integer conversions are avoided (AVX2 has none for 64-bit integers; 32 bits are fine).
    const double v = FromBits(0x4330000000000000ull | (r[k] >> 12)) - 4503599627370496.0;
    const double u = (v + 0.5) * (1.0 / 4503599627370496.0);
    const uint64_t b = ToBits(u);
    const int32_t e0 = static_cast<int32_t>((b >> 52) & 0x7ff) - 1023;
    const double m0 = FromBits((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    const uint64_t halve = m0 > 1.4142135623730951;
    const double m = m0 * FromBits(0x3ff0000000000000ull - (halve << 52));  // * 0.5 or * 1.
    const int32_t e = e0 + static_cast<int32_t>(halve);
    const double log2_u = det::Log2OfReduced(m, static_cast<double>(e));
    const double w = weights[k];
    const uint64_t positive = -static_cast<uint64_t>(w > 0);  // All ones when w > 0.
    keys[k] = (ToBits(-log2_u / w) & positive) | (plan_math::kInfinityKeyBits & ~positive);
  }
}

SAMPLERD_TARGET_AVX512 void KeysAvx512(const uint64_t* r, const float* weights, uint64_t count,
                                       uint64_t* keys) {
  KeysLoop(r, weights, count, keys);
}
SAMPLERD_TARGET_AVX2 void KeysAvx2(const uint64_t* r, const float* weights, uint64_t count,
                                   uint64_t* keys) {
  KeysLoop(r, weights, count, keys);
}
void KeysScalar(const uint64_t* r, const float* weights, uint64_t count, uint64_t* keys) {
  KeysLoop(r, weights, count, keys);
}

void KeysFromBits(SimdLevel level, const uint64_t* r, const float* weights, uint64_t count,
                  uint64_t* keys) {
  switch (level) {
    case SimdLevel::kAvx512:
      return KeysAvx512(r, weights, count, keys);
    case SimdLevel::kAvx2:
      return KeysAvx2(r, weights, count, keys);
    case SimdLevel::kScalar:
      break;
  }
  KeysScalar(r, weights, count, keys);
}

}  // namespace

void EsKeyBitsRange(uint64_t seed, uint64_t epoch, uint64_t first, uint64_t count,
                    const float* weights, uint64_t* keys) {
  EsKeyBitsRangeWith(BestSimdLevel(), seed, epoch, first, count, weights, keys);
}

void EsKeyBitsRangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, uint64_t first,
                        uint64_t count, const float* weights, uint64_t* keys) {
  uint64_t r[kKeyBlock];
  float ones[kKeyBlock];
  if (weights == nullptr) std::fill(ones, ones + kKeyBlock, 1.0f);
  for (uint64_t k = 0; k < count; k += kKeyBlock) {
    const uint64_t block = std::min(kKeyBlock, count - k);
    RandomBits64Range(seed, epoch, RandomStream::kEsKey, first + k, block, r);
    KeysFromBits(level, r, weights == nullptr ? ones : weights + k, block, keys + k);
  }
}

uint64_t SelectScratchBytes(int threads, uint64_t n, uint64_t m) {
  if (n <= kSmallSelect) {  // keys, (key, index) pairs, the result.
    return n * sizeof(uint64_t) + n * 2 * sizeof(uint64_t) + m * sizeof(uint64_t);
  }
  const uint64_t t_count = static_cast<uint64_t>(std::max(1, threads));
  const uint64_t chunks = NumChunks(n, kGrain);
  const uint64_t keys = LargeArrayBytes(n * sizeof(uint64_t));
  const uint64_t histograms = t_count * kDigits * sizeof(uint64_t);
  // The selected indices per chunk, reserved at 9/8 of their expected count (+ 16).
  const uint64_t selected_lists = (m + m / 8 + 16 * chunks) * sizeof(uint64_t);
  // Candidates: a sample's key falls in one given digit (a 1/16-wide slice of an octave) with
  // probability at most max_x e^-x (1 - e^(-x/16)) < 1/(16 e) = 2.3%, whatever its weight; as
  // 16-byte pairs that is 0.37 bytes per sample, twice that in vectors that grew by doubling,
  // and once more for their concatenation. 1 byte per sample covers the lists, 1 more the copy.
  const uint64_t candidate_lists = n, candidates = n;
  const uint64_t result = m * sizeof(uint64_t);
  // While the keys live: keys, histograms, then the lists being filled. After: the lists, the
  // candidates' concatenation and the merged result (the keys are freed first).
  const uint64_t with_keys = keys + histograms + selected_lists + candidate_lists;
  const uint64_t merging = selected_lists + candidate_lists + candidates + result;
  return std::max(with_keys, merging);
}

std::vector<uint64_t> SelectEfraimidisSpirakis(int threads, uint64_t seed, uint64_t epoch,
                                               uint64_t n, uint64_t m,
                                               absl::Span<const float> weights) {
  const float* w = weights.empty() ? nullptr : weights.data();
  if (n <= kSmallSelect) {
    // Small inputs: a plain selection on (key, index), the same total order as below.
    std::vector<uint64_t> keys(n);
    EsKeyBitsRange(seed, epoch, 0, n, w, keys.data());
    std::vector<std::pair<uint64_t, uint64_t>> items(n);
    for (uint64_t i = 0; i < n; ++i) items[i] = {keys[i], i};
    std::nth_element(items.begin(), items.begin() + (m - 1), items.end());
    std::vector<uint64_t> selected(m);
    for (uint64_t k = 0; k < m; ++k) selected[k] = items[k].second;
    std::sort(selected.begin(), selected.end());
    return selected;
  }
  // The keys, uninitialised until the threads write them (their pages are touched in parallel;
  // huge pages, see large_array.h), with the histogram of their top 16 bits counted on the way.
  LargeVector<uint64_t> keys(n);
  const int t_count = std::max(1, threads);
  std::vector<std::vector<uint64_t>> hist(t_count, std::vector<uint64_t>(kDigits, 0));
  ParallelForThreads(t_count, n, [&](int t, uint64_t b, uint64_t e) {
    EsKeyBitsRange(seed, epoch, b, e - b, w == nullptr ? nullptr : w + b, keys.data() + b);
    std::vector<uint64_t>& h = hist[t];
    for (uint64_t i = b; i < e; ++i) ++h[keys[i] >> (64 - kDigitBits)];
  });

  // The digit (top 16 bits) of the m-th smallest key, and its 1-based rank among the keys with
  // that digit: every key with a smaller digit is selected, `rank` of those with this digit are.
  for (size_t t = 1; t < hist.size(); ++t) {
    for (uint64_t d = 0; d < kDigits; ++d) hist[0][d] += hist[t][d];
  }
  uint64_t digit = 0, rank = m;
  for (; hist[0][digit] < rank; ++digit) rank -= hist[0][digit];
  const uint64_t in_digit = hist[0][digit];
  hist.clear();

  // One parallel pass: per chunk, the indices with a smaller digit (selected) and the (key,
  // index) pairs with the threshold's digit (candidates: a few percent of n at most, since a
  // digit spans 1/16 of a power of two of the keys).
  const uint64_t chunks = NumChunks(n, kGrain);
  std::vector<std::vector<uint64_t>> chunk_selected(chunks);
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> chunk_candidates(chunks);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& list = chunk_selected[c];
    list.reserve((m / chunks) * 9 / 8 + 16);
    for (uint64_t i = b; i < e; ++i) {
      const uint64_t d = keys[i] >> (64 - kDigitBits);
      if (d < digit) {
        list.push_back(i);
      } else if (d == digit) {
        chunk_candidates[c].emplace_back(keys[i], i);
      }
    }
  });
  keys = LargeVector<uint64_t>();

  // The `rank` smallest candidates by (key, index), in index order.
  std::vector<std::pair<uint64_t, uint64_t>> candidates;
  candidates.reserve(in_digit);
  for (auto& list : chunk_candidates) {
    candidates.insert(candidates.end(), list.begin(), list.end());
    list = {};
  }
  std::nth_element(candidates.begin(), candidates.begin() + (rank - 1), candidates.end());
  std::vector<uint64_t> chosen(rank);
  for (uint64_t k = 0; k < rank; ++k) chosen[k] = candidates[k].second;
  candidates = {};
  std::sort(chosen.begin(), chosen.end());

  // Both lists are in index order: concatenate and merge.
  std::vector<uint64_t> selected;
  selected.reserve(m);
  for (auto& list : chunk_selected) {
    selected.insert(selected.end(), list.begin(), list.end());
    list = {};
  }
  const uint64_t below = selected.size();
  selected.insert(selected.end(), chosen.begin(), chosen.end());
  std::inplace_merge(selected.begin(), selected.begin() + below, selected.end());
  return selected;
}

}  // namespace internal
}  // namespace samplerd
