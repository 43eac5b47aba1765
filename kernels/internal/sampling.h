// Sampling primitives of the CPU backend. Each is a pure function of its arguments; results do
// not depend on `threads`. A CUDA backend must reproduce them exactly (same Philox streams, same
// integer arithmetic, same tie-breaking), which the golden hashes in the tests pin down.
#ifndef SAMPLERD_KERNELS_INTERNAL_SAMPLING_H_
#define SAMPLERD_KERNELS_INTERNAL_SAMPLING_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "kernels/internal/parallel.h"
#include "kernels/philox.h"

namespace samplerd {
namespace internal {

// ---- With replacement -------------------------------------------------------------------------

// Draw at plan position `j` with uniform weights: floor(r * N / 2^64), r = Philox(seed, e, j).
inline uint64_t UniformDraw(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t j) {
  return MulHi64(RandomBits64(seed, epoch, RandomStream::kDraw, j), n);
}

// out[k] = UniformDraw(..., first_position + k). T: uint32_t (N <= 2^32) or uint64_t.
template <typename T>
void DrawUniform(int threads, uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first_position,
                 absl::Span<T> out);

// Integer weights and their exact prefix sums, plus a guide table that turns the search for a
// draw into one lookup and a short scan (Chen and Asau's indexed search).
//
// Draw j: r = Philox(seed, e, j); t = floor(r * total / 2^64); the result is the unique i with
// prefix[i] <= t < prefix[i + 1], i.e. exactly what a binary search over `prefix` returns (a GPU
// does that). guide[k] is that i for the smallest t of the r-bucket k = r >> guide_shift.
struct DrawTable {
  std::vector<uint64_t> prefix;  // N + 1 exclusive prefix sums of the quantised weights.
  std::vector<uint64_t> guide;   // 2^guide_bits entries.
  int guide_shift = 64;          // 64 - guide_bits.
  uint64_t total = 0;            // prefix[N] < 2^63.
  uint64_t num_samples = 0;
};

// Quantises `weights` (finite, >= 0, not all zero; validated by the caller) to integers: q_i =
// floor(w_i * 2^s) with the power of two 2^s chosen from the largest weight so that the total
// stays below 2^63; every positive weight gets q_i >= 1 (never silently dropped). Exact: scaling
// by a power of two and truncation give the same integers on every IEEE machine.
std::vector<uint64_t> QuantiseWeights(int threads, absl::Span<const float> weights);

// The power of two 2^s of QuantiseWeights, and the quantisation of one weight with it.
struct QuantisationScale {
  double scale;  // 2^s.
  uint64_t Quantise(float w) const {
    const uint64_t q = static_cast<uint64_t>(double{w} * scale);
    return (q == 0 && w > 0) ? 1 : q;
  }
};
QuantisationScale ChooseQuantisationScale(absl::Span<const float> weights);

DrawTable BuildDrawTable(int threads, absl::Span<const float> weights);

// The draw of plan position j, by the guide table.
inline uint64_t WeightedDraw(const DrawTable& table, uint64_t seed, uint64_t epoch, uint64_t j) {
  const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, j);
  const uint64_t t = MulHi64(r, table.total);
  uint64_t i = table.guide[table.guide_shift == 64 ? 0 : r >> table.guide_shift];
  while (table.prefix[i + 1] <= t) ++i;
  return i;
}

// The same draw by binary search over the prefix sums (the reference the guide table must match).
uint64_t WeightedDrawBinarySearch(const DrawTable& table, uint64_t seed, uint64_t epoch,
                                  uint64_t j);

// out[k] = WeightedDraw(table, seed, epoch, first_position + k). T as for DrawUniform.
template <typename T>
void DrawWeighted(int threads, const DrawTable& table, uint64_t seed, uint64_t epoch,
                  uint64_t first_position, absl::Span<T> out);

// ---- Without replacement ----------------------------------------------------------------------

// Efraimidis-Spirakis key of sample i as comparable bits: key = -log2(U_i) / w_i with U_i from
// Philox(seed, e, i, kEsKey) and the deterministic Log2; weight 0 gives +inf (never selected).
// Keys are positive doubles, whose IEEE bit patterns order like the values.
uint64_t EsKeyBits(uint64_t seed, uint64_t epoch, uint64_t i, double weight);

// The indices of the m smallest keys (ties broken by the smaller index), in increasing index
// order. weights empty = all 1. Requires m <= number of positive weights, m < n.
std::vector<uint64_t> SelectEfraimidisSpirakis(int threads, uint64_t seed, uint64_t epoch,
                                               uint64_t n, uint64_t m,
                                               absl::Span<const float> weights);

// Sort key of index `idx` in the uniform shuffle: the plan lists the selected indices by
// increasing (ShuffleKey, idx).
inline uint64_t ShuffleKey(uint64_t seed, uint64_t epoch, uint64_t idx) {
  return RandomBits64(seed, epoch, RandomStream::kShuffle, idx);
}

// Writes the m indices get(0..m-1) to `out` ordered by (ShuffleKey, index): a uniformly random
// permutation. Bucket sort: the top bits of the key pick one of ~m/32 buckets (per-thread
// histograms, then a scatter), and each small bucket is sorted by the next 32 key bits and the
// index, with the full key deciding the rare ties of those 32 bits. The result is exactly the
// order of a sort on (full key, index) -- what a GPU radix sort returns -- for any thread count.
// Scratch: 12 bytes per element (the keys, then 32 key bits per output slot).
template <typename GetIndex, typename T>
void ShuffleIntoBuckets(int threads, uint64_t seed, uint64_t epoch, uint64_t m, const GetIndex& get,
                        absl::Span<T> out) {
  if (m == 0) return;
  int bucket_bits = 0;
  while (bucket_bits < 26 && (uint64_t{32} << bucket_bits) < m) ++bucket_bits;
  const uint64_t buckets = uint64_t{1} << bucket_bits;
  const int shift = 64 - bucket_bits;  // >= 38: 32 more key bits lie below the bucket bits.
  auto bucket_of = [&](uint64_t key) -> uint64_t { return bucket_bits == 0 ? 0 : key >> shift; };
  auto sub_key = [&](uint64_t key) -> uint32_t {
    return static_cast<uint32_t>(key >> (shift - 32));
  };

  // Scratch without zero-filling (every slot is written before it is read).
  std::unique_ptr<uint64_t[]> keys(new uint64_t[m]);
  const int t_count = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, m)));
  std::vector<std::vector<uint32_t>> hist(t_count, std::vector<uint32_t>(buckets, 0));
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      keys[k] = ShuffleKey(seed, epoch, get(k));
      ++hist[t][bucket_of(keys[k])];
    }
  });
  // Exclusive scan over (bucket, thread): cursor[t][b] is thread t's first slot in bucket b.
  std::vector<std::vector<uint64_t>> cursor(t_count, std::vector<uint64_t>(buckets));
  std::vector<uint64_t> bucket_start(buckets + 1, 0);
  uint64_t running = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    bucket_start[b] = running;
    for (int t = 0; t < t_count; ++t) {
      cursor[t][b] = running;
      running += hist[t][b];
    }
  }
  bucket_start[buckets] = running;
  hist.clear();
  std::unique_ptr<uint32_t[]> sub(new uint32_t[m]);
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& cur = cursor[t];
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t pos = cur[bucket_of(keys[k])]++;
      out[pos] = static_cast<T>(get(k));
      sub[pos] = sub_key(keys[k]);
    }
  });
  keys.reset();
  cursor.clear();
  // Sort each bucket by (32 key bits, index); runs with equal 32 bits by (full key, index).
  ParallelForChunks(threads, buckets, 4096, [&](uint64_t, uint64_t b0, uint64_t b1) {
    std::vector<std::pair<uint32_t, uint64_t>> items;
    std::vector<std::pair<uint64_t, uint64_t>> tied;
    for (uint64_t b = b0; b < b1; ++b) {
      const uint64_t lo = bucket_start[b], hi = bucket_start[b + 1];
      if (hi - lo < 2) continue;
      items.clear();
      for (uint64_t p = lo; p < hi; ++p) items.emplace_back(sub[p], out[p]);
      if (items.size() <= 48) {  // Buckets hold ~32 on average: insertion sort is fastest.
        for (size_t i = 1; i < items.size(); ++i) {
          const auto item = items[i];
          size_t j = i;
          for (; j > 0 && item < items[j - 1]; --j) items[j] = items[j - 1];
          items[j] = item;
        }
      } else {
        std::sort(items.begin(), items.end());
      }
      for (size_t i = 0; i < items.size();) {
        size_t j = i + 1;
        while (j < items.size() && items[j].first == items[i].first) ++j;
        if (j - i > 1) {  // Equal in 32 bits: order this run by the full key.
          tied.clear();
          for (size_t k = i; k < j; ++k) {
            tied.emplace_back(ShuffleKey(seed, epoch, items[k].second), items[k].second);
          }
          std::sort(tied.begin(), tied.end());
          for (size_t k = i; k < j; ++k) items[k].second = tied[k - i].second;
        }
        i = j;
      }
      for (uint64_t p = lo; p < hi; ++p) out[p] = static_cast<T>(items[p - lo].second);
    }
  });
}

// The same order as ShuffleIntoBuckets for indices below 2^32, faster for large m (all that is
// random is in the key, so both are exact sorts on (key, index)): keys are computed twice instead
// of stored; the scatter goes to 1024 top-bit buckets (cache-resident write streams) as packed
// (32 key bits below the top 10, index) words; each bucket (~m/1024 words, L2-resident) is then
// sorted by an LSD radix sort on the 32 key bits, which is stable and so keeps equal keys in
// index order; runs equal in those 32 bits are finally ordered by their full keys.
// Scratch: 8 bytes per element.
template <typename GetIndex>
void ShuffleIntoRadix(int threads, uint64_t seed, uint64_t epoch, uint64_t m, const GetIndex& get,
                      absl::Span<uint32_t> out) {
  constexpr int kTopBits = 10;
  constexpr uint64_t kBuckets = uint64_t{1} << kTopBits;
  constexpr int kTopShift = 64 - kTopBits;
  const int t_count = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, m)));
  std::vector<std::vector<uint64_t>> cursor(t_count, std::vector<uint64_t>(kBuckets, 0));
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& h = cursor[t];
    for (uint64_t k = b; k < e; ++k) ++h[ShuffleKey(seed, epoch, get(k)) >> kTopShift];
  });
  std::vector<uint64_t> bucket_start(kBuckets + 1, 0);
  uint64_t running = 0;
  for (uint64_t b = 0; b < kBuckets; ++b) {
    bucket_start[b] = running;
    for (int t = 0; t < t_count; ++t) {
      const uint64_t c = cursor[t][b];
      cursor[t][b] = running;
      running += c;
    }
  }
  bucket_start[kBuckets] = running;
  std::unique_ptr<uint64_t[]> packed(new uint64_t[m]);
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& cur = cursor[t];
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t idx = get(k);
      const uint64_t key = ShuffleKey(seed, epoch, idx);
      packed[cur[key >> kTopShift]++] = ((key >> (kTopShift - 32)) << 32) | idx;
    }
  });
  ParallelForChunks(threads, kBuckets, 1, [&](uint64_t, uint64_t b0, uint64_t b1) {
    std::vector<uint64_t> tmp;
    std::vector<std::pair<uint64_t, uint64_t>> tied;
    for (uint64_t b = b0; b < b1; ++b) {
      uint64_t* data = packed.get() + bucket_start[b];
      const uint64_t n = bucket_start[b + 1] - bucket_start[b];
      tmp.resize(n);
      uint64_t* src = data;
      uint64_t* dst = tmp.data();
      // LSD radix sort on bits 32..63: digits of 11, 11 and 10 bits.
      for (int shift : {32, 43, 54}) {
        const int bits = shift == 54 ? 10 : 11;
        uint32_t count[2048] = {0};
        for (uint64_t i = 0; i < n; ++i) ++count[(src[i] >> shift) & ((1u << bits) - 1)];
        uint32_t sum = 0;
        for (int d = 0; d < (1 << bits); ++d) {
          const uint32_t c = count[d];
          count[d] = sum;
          sum += c;
        }
        for (uint64_t i = 0; i < n; ++i)
          dst[count[(src[i] >> shift) & ((1u << bits) - 1)]++] = src[i];
        std::swap(src, dst);
      }
      // Three passes: the sorted words are in tmp. Ties in the 32 bits: by the full key.
      for (uint64_t i = 0; i < n;) {
        uint64_t j = i + 1;
        while (j < n && (src[j] >> 32) == (src[i] >> 32)) ++j;
        if (j - i > 1) {
          tied.clear();
          for (uint64_t k = i; k < j; ++k) {
            const uint64_t idx = src[k] & 0xffffffffu;
            tied.emplace_back(ShuffleKey(seed, epoch, idx), idx);
          }
          std::sort(tied.begin(), tied.end());
          for (uint64_t k = i; k < j; ++k) src[k] = tied[k - i].second;
        }
        i = j;
      }
      uint32_t* o = out.data() + bucket_start[b];
      for (uint64_t i = 0; i < n; ++i) o[i] = static_cast<uint32_t>(src[i]);
    }
  });
}

// Below this many elements ShuffleInto uses ShuffleIntoBuckets (the radix version's 1024 buckets
// and per-bucket passes do not pay off).
inline constexpr uint64_t kRadixShuffleMin = uint64_t{1} << 20;

// Writes get(0..m-1) to `out` ordered by (ShuffleKey, index): see ShuffleIntoBuckets.
template <typename GetIndex, typename T>
void ShuffleInto(int threads, uint64_t seed, uint64_t epoch, uint64_t m, const GetIndex& get,
                 absl::Span<T> out) {
  if constexpr (std::is_same_v<T, uint32_t>) {
    if (m >= kRadixShuffleMin) return ShuffleIntoRadix(threads, seed, epoch, m, get, out);
  }
  ShuffleIntoBuckets(threads, seed, epoch, m, get, out);
}

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_SAMPLING_H_
