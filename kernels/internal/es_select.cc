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

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kGrain = 1 << 16;
constexpr uint64_t kKeyBlock = 512;
constexpr uint64_t kInfinityBits = 0x7ff0000000000000ull;
// Below this many samples: one nth_element on (key, index) instead of the radix select.
constexpr uint64_t kSmallSelect = 1 << 16;
constexpr int kDigitBits = 16;
constexpr uint64_t kDigits = uint64_t{1} << kDigitBits;

using det::FromBits;
inline uint64_t ToBits(double d) { return det::Bits(d); }

// EsKeyBits of 64 random bits each, written without branches so that the compiler vectorises
// it; the operations are exactly those of det::UniformOpen01, det::Log2 (for its normal inputs
// in (0, 1), the only ones UniformOpen01 gives) and the division, in the same order. Inlined
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
    keys[k] = (ToBits(-log2_u / w) & positive) | (kInfinityBits & ~positive);
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

uint64_t EsKeyBits(uint64_t seed, uint64_t epoch, uint64_t i, double weight) {
  if (!(weight > 0)) return kInfinityBits;  // +inf: never among the m smallest.
  const double u = det::UniformOpen01(RandomBits64(seed, epoch, RandomStream::kEsKey, i));
  return det::Bits(-det::Log2(u) / weight);
}

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

  // Radix select, 16 bits at a time from the top: the m-th smallest key K (the threshold) and
  // how many keys equal to K are taken (`rank` of them: the ones with the smallest indices).
  // After the first digit only the keys that share it can matter: they are copied out (a few
  // percent of n: a 16-bit prefix of a double spans 1/16 of a power of two), and the remaining
  // digits are found in the copy.
  uint64_t prefix = 0;  // The top `fixed` bits of K.
  int fixed = 0;
  uint64_t rank = m;  // 1-based rank of K among the keys that share `prefix`.
  std::vector<uint64_t> candidates;
  while (true) {
    // hist[0] (the sum over threads) counts the next digit of the keys that share `prefix`.
    for (size_t t = 1; t < hist.size(); ++t) {
      for (uint64_t d = 0; d < kDigits; ++d) hist[0][d] += hist[t][d];
    }
    uint64_t digit = 0;
    for (; hist[0][digit] < rank; ++digit) rank -= hist[0][digit];
    const uint64_t in_digit = hist[0][digit];
    prefix = (prefix << kDigitBits) | digit;
    fixed += kDigitBits;
    if (fixed == 64) break;
    const int shift = 64 - fixed;
    if (fixed == kDigitBits) {
      candidates.resize(in_digit);
      uint64_t c = 0;
      for (uint64_t i = 0; i < n; ++i) {
        candidates[c] = keys[i];
        c += (keys[i] >> shift) == prefix;  // Branch-free: almost every key is skipped.
        if (c == in_digit) break;
      }
      hist.resize(1);
    }
    std::fill(hist[0].begin(), hist[0].end(), 0);
    for (uint64_t k : candidates) {
      if ((k >> shift) == prefix) ++hist[0][(k >> (shift - kDigitBits)) & (kDigits - 1)];
    }
  }
  const uint64_t threshold = prefix;
  hist.clear();
  candidates = std::vector<uint64_t>();

  // Collect in index order: keys below the threshold, and the first `rank` keys equal to it.
  // One pass: each chunk lists its indices with key <= threshold (about m / chunks of them),
  // then the lists are concatenated in chunk order, dropping equal keys past the first `rank`.
  const uint64_t chunks = NumChunks(n, kGrain);
  std::vector<std::vector<uint64_t>> chunk_selected(chunks);
  std::vector<uint64_t> chunk_equal(chunks, 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& list = chunk_selected[c];
    list.reserve((m / chunks) * 9 / 8 + 16);
    uint64_t eq = 0;
    for (uint64_t i = b; i < e; ++i) {
      const uint64_t k = keys[i];
      if (k <= threshold) {
        list.push_back(i);
        eq += k == threshold;
      }
    }
    chunk_equal[c] = eq;
  });
  keys = LargeVector<uint64_t>();
  std::vector<uint64_t> selected;
  selected.reserve(m);
  uint64_t ties_left = rank;
  for (uint64_t c = 0; c < chunks; ++c) {
    const std::vector<uint64_t>& list = chunk_selected[c];
    if (chunk_equal[c] <= ties_left) {
      selected.insert(selected.end(), list.begin(), list.end());
      ties_left -= chunk_equal[c];
    } else {  // Rare: keys equal to the threshold beyond the first `rank` are not taken.
      for (uint64_t i : list) {
        const bool tie = EsKeyBits(seed, epoch, i, w == nullptr ? 1.0 : double{w[i]}) == threshold;
        if (!tie || ties_left > 0) {
          selected.push_back(i);
          ties_left -= tie;
        }
      }
    }
    chunk_selected[c] = std::vector<uint64_t>();
  }
  return selected;
}

}  // namespace internal
}  // namespace samplerd
