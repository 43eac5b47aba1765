#include "kernels/internal/sampling.h"

#include <algorithm>

#include "kernels/det_math.h"

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kGrain = 1 << 16;
// Below this many samples a selection uses nth_element instead of the parallel radix select.
constexpr uint64_t kSmallSelect = 1 << 16;

// Number of bits needed to write n: n < 2^BitWidth(n).
int BitWidth(uint64_t n) {
  int w = 0;
  while (w < 64 && (n >> w) != 0) ++w;
  return w;
}

}  // namespace

template <typename T>
void DrawUniform(int threads, uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first_position,
                 absl::Span<T> out) {
  ParallelForChunks(threads, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      out[k] = static_cast<T>(UniformDraw(seed, epoch, n, first_position + k));
    }
  });
}
template void DrawUniform(int, uint64_t, uint64_t, uint64_t, uint64_t, absl::Span<uint32_t>);
template void DrawUniform(int, uint64_t, uint64_t, uint64_t, uint64_t, absl::Span<uint64_t>);

QuantisationScale ChooseQuantisationScale(absl::Span<const float> weights) {
  float w_max = 0;
  for (float w : weights) w_max = std::max(w_max, w);
  // w_max < 2^max_exp (w_max > 0, a float, so a normal double).
  const int max_exp = static_cast<int>((det::Bits(double{w_max}) >> 52) & 0x7ff) - 1023 + 1;
  // q_i <= w_max * 2^s < 2^(62 - BitWidth(n)), so sum q_i < 2^62 + n < 2^63.
  return QuantisationScale{det::Pow2(62 - BitWidth(weights.size()) - max_exp)};
}

std::vector<uint64_t> QuantiseWeights(int threads, absl::Span<const float> weights) {
  const QuantisationScale scale = ChooseQuantisationScale(weights);
  std::vector<uint64_t> q(weights.size());
  ParallelForChunks(threads, weights.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) q[i] = scale.Quantise(weights[i]);
  });
  return q;
}

DrawTable BuildDrawTable(int threads, absl::Span<const float> weights) {
  DrawTable table;
  const uint64_t n = weights.size();
  table.num_samples = n;
  const QuantisationScale scale = ChooseQuantisationScale(weights);
  // Exclusive prefix sums of the quantised weights: per-chunk sums, then per-chunk offsets
  // (integers: exact in any order). The quantised values are recomputed, never stored.
  table.prefix.resize(n + 1);
  const uint64_t chunks = NumChunks(n, kGrain);
  std::vector<uint64_t> chunk_sum(chunks, 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t s = 0;
    for (uint64_t i = b; i < e; ++i) s += scale.Quantise(weights[i]);
    chunk_sum[c] = s;
  });
  std::vector<uint64_t> chunk_offset(chunks, 0);
  uint64_t running = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    chunk_offset[c] = running;
    running += chunk_sum[c];
  }
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t s = chunk_offset[c];
    for (uint64_t i = b; i < e; ++i) {
      table.prefix[i] = s;
      s += scale.Quantise(weights[i]);
    }
  });
  table.prefix[n] = running;
  table.total = running;

  // Guide table: 2^g buckets of r, N/8 < 2^g <= N/4 (at most 2 bytes per sample): a scan
  // then covers ~4-8 prefix sums, mostly one cache line.
  const int g = std::min(26, std::max(0, BitWidth(n) - 3));
  table.guide_shift = 64 - g;
  const uint64_t buckets = uint64_t{1} << g;
  table.guide.resize(buckets);
  auto last_at_or_below = [&](uint64_t t) -> uint64_t {
    return static_cast<uint64_t>(std::upper_bound(table.prefix.begin(), table.prefix.end(), t) -
                                 table.prefix.begin() - 1);
  };
  ParallelForChunks(threads, buckets, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    auto bucket_start_t = [&](uint64_t k) {
      return g == 0 ? 0 : MulHi64(k << table.guide_shift, table.total);
    };
    uint64_t i = last_at_or_below(bucket_start_t(b));
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t t = bucket_start_t(k);
      while (table.prefix[i + 1] <= t) ++i;
      table.guide[k] = i;
    }
  });
  return table;
}

uint64_t WeightedDrawBinarySearch(const DrawTable& table, uint64_t seed, uint64_t epoch,
                                  uint64_t j) {
  const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, j);
  const uint64_t t = MulHi64(r, table.total);
  return static_cast<uint64_t>(std::upper_bound(table.prefix.begin(), table.prefix.end(), t) -
                               table.prefix.begin() - 1);
}

template <typename T>
void DrawWeighted(int threads, const DrawTable& table, uint64_t seed, uint64_t epoch,
                  uint64_t first_position, absl::Span<T> out) {
  // The same result as WeightedDraw for each position, computed in groups of kGroup draws
  // whose two dependent table loads (guide, then prefix) are prefetched for the whole group
  // first, so that their cache misses overlap instead of stalling one draw at a time.
  constexpr uint64_t kGroup = 32;
  const uint64_t* prefix = table.prefix.data();
  const uint64_t* guide = table.guide.data();
  const int shift = table.guide_shift;
  ParallelForChunks(threads, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    uint64_t t[kGroup], i[kGroup];
    for (uint64_t g = b; g < e; g += kGroup) {
      const uint64_t count = std::min(kGroup, e - g);
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, first_position + g + k);
        t[k] = MulHi64(r, table.total);
        i[k] = shift == 64 ? 0 : r >> shift;
        __builtin_prefetch(&guide[i[k]]);
      }
      for (uint64_t k = 0; k < count; ++k) {
        i[k] = guide[i[k]];
        __builtin_prefetch(&prefix[i[k] + 1]);
      }
      for (uint64_t k = 0; k < count; ++k) {
        uint64_t idx = i[k];
        while (prefix[idx + 1] <= t[k]) ++idx;
        out[g + k] = static_cast<T>(idx);
      }
    }
  });
}

template void DrawWeighted(int, const DrawTable&, uint64_t, uint64_t, uint64_t,
                           absl::Span<uint32_t>);
template void DrawWeighted(int, const DrawTable&, uint64_t, uint64_t, uint64_t,
                           absl::Span<uint64_t>);

uint64_t EsKeyBits(uint64_t seed, uint64_t epoch, uint64_t i, double weight) {
  if (!(weight > 0)) return 0x7ff0000000000000ull;  // +inf: never among the m smallest.
  const double u = det::UniformOpen01(RandomBits64(seed, epoch, RandomStream::kEsKey, i));
  return det::Bits(-det::Log2(u) / weight);
}

std::vector<uint64_t> SelectEfraimidisSpirakis(int threads, uint64_t seed, uint64_t epoch,
                                               uint64_t n, uint64_t m,
                                               absl::Span<const float> weights) {
  std::vector<uint64_t> keys(n);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) {
      keys[i] = EsKeyBits(seed, epoch, i, weights.empty() ? 1.0 : double{weights[i]});
    }
  });

  if (n <= kSmallSelect) {
    // Small inputs: a plain selection on (key, index), the same total order as below.
    std::vector<std::pair<uint64_t, uint64_t>> items(n);
    for (uint64_t i = 0; i < n; ++i) items[i] = {keys[i], i};
    std::nth_element(items.begin(), items.begin() + (m - 1), items.end());
    std::vector<uint64_t> selected(m);
    for (uint64_t k = 0; k < m; ++k) selected[k] = items[k].second;
    std::sort(selected.begin(), selected.end());
    return selected;
  }

  // Radix select, 16 bits per pass from the top: find the m-th smallest key K and how many keys
  // equal to K are taken (the ones with the smallest indices).
  constexpr int kDigitBits = 16;
  constexpr uint64_t kDigits = uint64_t{1} << kDigitBits;
  uint64_t prefix = 0;  // Top bits of K fixed so far.
  uint64_t rank = m;    // 1-based rank of K among the keys sharing `prefix`.
  const int t_count = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, n)));
  std::vector<std::vector<uint64_t>> hist(t_count, std::vector<uint64_t>(kDigits));
  for (int pass = 0; pass < 64 / kDigitBits; ++pass) {
    const int shift = 64 - kDigitBits * (pass + 1);
    const int prefix_shift = shift + kDigitBits;  // Bits above the current digit.
    for (auto& h : hist) std::fill(h.begin(), h.end(), 0);
    ParallelForThreads(t_count, n, [&](int t, uint64_t b, uint64_t e) {
      std::vector<uint64_t>& h = hist[t];
      for (uint64_t i = b; i < e; ++i) {
        const uint64_t k = keys[i];
        if (pass == 0 || (k >> prefix_shift) == prefix) ++h[(k >> shift) & (kDigits - 1)];
      }
    });
    uint64_t digit = 0;
    for (; digit < kDigits; ++digit) {
      uint64_t c = 0;
      for (int t = 0; t < t_count; ++t) c += hist[t][digit];
      if (c >= rank) break;
      rank -= c;
    }
    prefix = (prefix << kDigitBits) | digit;
  }
  const uint64_t threshold = prefix;
  hist.clear();

  // Collect in index order: keys below the threshold, and the first `rank` keys equal to it.
  const uint64_t chunks = NumChunks(n, kGrain);
  std::vector<uint64_t> below(chunks), equal(chunks);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t lt = 0, eq = 0;
    for (uint64_t i = b; i < e; ++i) {
      lt += keys[i] < threshold;
      eq += keys[i] == threshold;
    }
    below[c] = lt;
    equal[c] = eq;
  });
  std::vector<uint64_t> offset(chunks), take_equal(chunks);
  uint64_t running = 0, ties_left = rank;
  for (uint64_t c = 0; c < chunks; ++c) {
    take_equal[c] = std::min(equal[c], ties_left);
    ties_left -= take_equal[c];
    offset[c] = running;
    running += below[c] + take_equal[c];
  }
  std::vector<uint64_t> selected(running);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t out = offset[c], ties = take_equal[c];
    for (uint64_t i = b; i < e; ++i) {
      if (keys[i] < threshold || (keys[i] == threshold && ties > 0 && ties-- > 0)) {
        selected[out++] = i;
      }
    }
  });
  return selected;
}

}  // namespace internal
}  // namespace samplerd
