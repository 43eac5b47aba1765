#include "kernels/internal/draw_table.h"

#include <algorithm>

#include "kernels/internal/parallel.h"
#include "kernels/internal/philox_batch.h"
#include "kernels/plan_math.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kGrain = 1 << 16;
constexpr uint64_t kGroup = 64;  // Draws whose memory accesses are overlapped (see DrawWeighted).
constexpr uint64_t kPrefixPadding = 8;  // Entries after prefix[N].

}  // namespace

QuantisationScale ChooseQuantisationScale(int threads, absl::Span<const float> weights) {
  const uint64_t n = weights.size();
  // The largest weight, by its IEEE bits with -0 taken as +0 (weight_math::SummaryBits, the
  // rule the device's scan uses too): for floats >= 0 they order like the values, and an integer
  // maximum vectorises. (The raw bits of -0, 0x80000000, would beat every positive weight.)
  std::vector<uint32_t> chunk_max(NumChunks(n, kGrain), 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint32_t m = 0;
    for (uint64_t i = b; i < e; ++i) {
      const uint32_t bits = weight_math::SummaryBits(weights[i]);
      m = bits > m ? bits : m;
    }
    chunk_max[c] = m;
  });
  uint32_t max_bits = 0;
  for (uint32_t m : chunk_max) max_bits = std::max(max_bits, m);
  return QuantisationScale{plan_math::QuantisationScale(n, max_bits)};
}

std::vector<uint64_t> QuantiseWeights(int threads, absl::Span<const float> weights) {
  const QuantisationScale scale = ChooseQuantisationScale(threads, weights);
  std::vector<uint64_t> q(weights.size());
  ParallelForChunks(threads, weights.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) q[i] = scale.Quantise(weights[i]);
  });
  return q;
}

namespace {
// The guide table's 2^g entries for n <= 2^32 weights: N/4 < 2^g <= N/2 (see BuildDrawTable).
int GuideBits(uint64_t n) { return std::max(1, plan_math::BitWidth(n) - 2); }
}  // namespace

uint64_t DrawTableBytes(uint64_t n) {
  const uint64_t prefix = LargeArrayBytes((n + 1 + kPrefixPadding) * sizeof(uint64_t));
  const uint64_t guide =
      n > (uint64_t{1} << 32) ? 0 : LargeArrayBytes((uint64_t{1} << GuideBits(n)) * 4);
  return prefix + guide + NumChunks(n, kGrain) * sizeof(uint64_t);
}

DrawTable BuildDrawTable(int threads, absl::Span<const float> weights) {
  DrawTable table;
  const uint64_t n = weights.size();
  table.num_samples = n;
  const QuantisationScale scale = ChooseQuantisationScale(threads, weights);
  // Exclusive prefix sums: per-chunk sums, per-chunk offsets, then the sums within each chunk
  // (integers: exact in any order). The q_i are recomputed rather than stored; the prefix array
  // is left uninitialised until the threads write it, so its pages are touched in parallel.
  table.prefix.resize(n + 1 + kPrefixPadding);
  const uint64_t chunks = NumChunks(n, kGrain);
  std::vector<uint64_t> chunk_offset(chunks, 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t s = 0;
    for (uint64_t i = b; i < e; ++i) s += scale.Quantise(weights[i]);
    chunk_offset[c] = s;
  });
  uint64_t running = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t s = chunk_offset[c];
    chunk_offset[c] = running;
    running += s;
  }
  uint64_t* prefix = table.prefix.data();
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    uint64_t s = chunk_offset[c];
    for (uint64_t i = b; i < e; ++i) {
      prefix[i] = s;
      s += scale.Quantise(weights[i]);
    }
  });
  prefix[n] = running;
  // Padding above every t, so that a draw may compare a few entries past the end.
  for (uint64_t k = 1; k <= kPrefixPadding; ++k) prefix[n + k] = ~uint64_t{0};
  table.total = running;
  if (n > (uint64_t{1} << 32)) return table;  // Guide entries are 32 bits: binary search.

  // Guide table: 2^g entries with N/4 < 2^g <= N/2 (at most 2 bytes per sample), so a draw
  // scans ~2-4 prefix sums, mostly within one cache line.
  const int g = GuideBits(n);
  table.guide_shift = 64 - g;
  const uint64_t buckets = uint64_t{1} << g;
  table.guide.resize(buckets);
  ParallelForChunks(threads, buckets, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    // Smallest t of bucket k: t = floor(r * T / 2^64) is nondecreasing in r.
    auto bucket_t = [&](uint64_t k) { return MulHi64(k << table.guide_shift, table.total); };
    // Last i with prefix[i] <= t: the interval holding t (empty intervals skipped).
    uint64_t i =
        static_cast<uint64_t>(std::upper_bound(prefix, prefix + n + 1, bucket_t(b)) - prefix - 1);
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t t = bucket_t(k);
      while (prefix[i + 1] <= t) ++i;
      table.guide[k] = static_cast<uint32_t>(i);
    }
  });
  return table;
}

uint64_t DrawByBinarySearch(const DrawTable& table, uint64_t r) {
  const uint64_t t = MulHi64(r, table.total);
  const uint64_t* prefix = table.prefix.data();
  return static_cast<uint64_t>(std::upper_bound(prefix, prefix + table.num_samples + 1, t) -
                               prefix - 1);
}

template <typename T>
void DrawWeighted(int threads, const DrawTable& table, uint64_t seed, uint64_t epoch,
                  uint64_t first_position, absl::Span<T> out) {
  if (table.guide.empty()) {
    ParallelForChunks(threads, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      for (uint64_t k = b; k < e; ++k) {
        out[k] = static_cast<T>(DrawByBinarySearch(
            table, RandomBits64(seed, epoch, RandomStream::kDraw, first_position + k)));
      }
    });
    return;
  }
  // DrawByGuide for each position, in groups of kGroup draws whose two dependent loads (guide,
  // then prefix sums) are prefetched for the whole group first, so that the cache misses of a
  // group overlap instead of stalling one draw at a time.
  const uint64_t* prefix = table.prefix.data();
  const uint32_t* guide = table.guide.data();
  const int shift = table.guide_shift;
  const uint64_t total = table.total;
  ParallelForChunks(threads, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    uint64_t r[kGroup], t[kGroup], i[kGroup];
    for (uint64_t g = b; g < e; g += kGroup) {
      const uint64_t count = std::min(kGroup, e - g);
      RandomBits64Range(seed, epoch, RandomStream::kDraw, first_position + g, count, r);
      for (uint64_t k = 0; k < count; ++k) {
        t[k] = MulHi64(r[k], total);
        i[k] = r[k] >> shift;
        __builtin_prefetch(&guide[i[k]]);
      }
      for (uint64_t k = 0; k < count; ++k) {
        i[k] = guide[i[k]];
        __builtin_prefetch(&prefix[i[k] + 1]);
        __builtin_prefetch(&prefix[i[k] + 4]);
      }
      for (uint64_t k = 0; k < count; ++k) {
        // prefix is nondecreasing, so the number of the next entries <= t is the number of
        // steps to the answer: four compares without branches cover the usual 1-3 steps.
        const uint64_t* p = prefix + i[k] + 1;
        const uint64_t tk = t[k];
        const uint64_t steps = uint64_t{p[0] <= tk} + uint64_t{p[1] <= tk} + uint64_t{p[2] <= tk} +
                               uint64_t{p[3] <= tk};
        uint64_t idx = i[k] + steps;
        if (steps == 4) {
          while (prefix[idx + 1] <= tk) ++idx;
        }
        out[g + k] = static_cast<T>(idx);
      }
    }
  });
}
template void DrawWeighted(int, const DrawTable&, uint64_t, uint64_t, uint64_t,
                           absl::Span<uint32_t>);
template void DrawWeighted(int, const DrawTable&, uint64_t, uint64_t, uint64_t,
                           absl::Span<uint64_t>);

template <typename T>
void DrawUniform(int threads, uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first_position,
                 absl::Span<T> out) {
  ParallelForChunks(threads, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    uint64_t r[kGroup];
    for (uint64_t g = b; g < e; g += kGroup) {
      const uint64_t count = std::min(kGroup, e - g);
      RandomBits64Range(seed, epoch, RandomStream::kDraw, first_position + g, count, r);
      for (uint64_t k = 0; k < count; ++k) out[g + k] = static_cast<T>(MulHi64(r[k], n));
    }
  });
}
template void DrawUniform(int, uint64_t, uint64_t, uint64_t, uint64_t, absl::Span<uint32_t>);
template void DrawUniform(int, uint64_t, uint64_t, uint64_t, uint64_t, absl::Span<uint64_t>);

}  // namespace internal
}  // namespace samplerd
