#include "kernels/internal/shuffle.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/internal/parallel.h"
#include "kernels/internal/philox_batch.h"
#include "kernels/large_array.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kBlock = 512;  // Inputs per batch of bucket numbers.
// Bucket bits left to the second pass at most: its bucket numbers are kept in 16 bits.
constexpr int kMaxLowBits = 16;
// Bits of the first pass when there are two: its two writers' lines (value and low bits:
// 2 x 1024 x 64 bytes) stay in L2. Measured at N = 1e7 and 1e8 on the 2-core build machine:
// 8 to 11 top bits, 10 best or tied (bench/RESULTS.md).
constexpr int kTwoLevelTopBits = 10;

// Bits of the first partition pass for b bucket bits: all of them when b <= max_top_bits (one
// level); else min(max_top_bits, kTwoLevelTopBits), at least b - kMaxLowBits.
int TopBits(int bits, int max_top_bits) {
  if (bits <= max_top_bits) return bits;
  return std::max(std::min(max_top_bits, kTwoLevelTopBits), bits - kMaxLowBits);
}

// The inputs, read by one thread at a time through a Reader: Load(k, count) (count <= kBlock)
// comes before Value(k), ..., Value(k + count - 1).
// Inputs 0..m-1.
struct RangeSource {
  struct Reader {
    explicit Reader(const RangeSource&) {}
    void Load(uint64_t, uint64_t) {}
    uint64_t Value(uint64_t k) const { return k; }
  };
};

// Inputs from an array.
struct ArraySource {
  const uint64_t* values;
  struct Reader {
    explicit Reader(const ArraySource& source) : values(source.values) {}
    void Load(uint64_t, uint64_t) {}
    uint64_t Value(uint64_t k) const { return values[k]; }
    const uint64_t* values;
  };
};

// Inputs computed a block at a time by the caller's function (ShuffleGenerated).
struct GeneratedSource {
  const InputBlockFn* fill;
  struct Reader {
    explicit Reader(const GeneratedSource& source) : fill(source.fill) {}
    void Load(uint64_t k, uint64_t count) {
      (*fill)(k, count, block);
      first = k;
    }
    uint64_t Value(uint64_t k) const { return block[k - first]; }
    const InputBlockFn* fill;
    uint64_t first = 0;
    uint64_t block[kBlock];
  };
};

// bucket[i] = B_{k+i} of the definition for i < count (count <= kBlock), bits >= 1.
void BucketsOf(uint64_t seed, uint64_t epoch, int bits, uint64_t k, uint64_t count,
               uint32_t* bucket) {
  uint32_t words[kBlock + 8];
  const uint64_t first = k / 4, last = (k + count + 3) / 4;
  RandomWords32Range(seed, epoch, RandomStream::kShuffle, first, last - first, words);
  const uint32_t* w = words + k % 4;
  const int shift = 32 - bits;
  for (uint64_t i = 0; i < count; ++i) bucket[i] = w[i] >> shift;
}

// Step 3 of the definition for bucket `bucket`, a[0, n), n < 2^32.
template <typename T>
void FisherYates(uint64_t seed, uint64_t epoch, uint64_t bucket, T* a, uint64_t n) {
  assert(n < (uint64_t{1} << 32));
  constexpr uint64_t kCounters = 256;
  uint32_t words[4 * kCounters];
  uint64_t counter = bucket << 40, pos = 0, available = 0;
  // The next word u_t; `wanted` (>= 1) words at least are still to come: no more are computed.
  auto next = [&](uint64_t wanted) {
    if (pos == available) {
      const uint64_t counters = std::min(kCounters, (wanted + 3) / 4);
      RandomWords32Range(seed, epoch, RandomStream::kShuffleSwap, counter, counters, words);
      counter += counters;
      pos = 0;
      available = 4 * counters;
    }
    return words[pos++];
  };
  for (uint64_t i = n - 1; i > 0; --i) {
    const uint32_t range = static_cast<uint32_t>(i + 1);
    uint64_t product = uint64_t{next(i)} * range;
    if (static_cast<uint32_t>(product) < range) {       // Rare: maybe in the biased tail.
      const uint32_t threshold = (0u - range) % range;  // 2^32 mod range.
      while (static_cast<uint32_t>(product) < threshold) product = uint64_t{next(i)} * range;
    }
    std::swap(a[i], a[product >> 32]);
  }
}

// Scatters values into many buckets of `out` through one cache line of buffer per bucket
// (software write combining): a full line goes to memory in one non-temporal store, without
// first reading the line into the cache, instead of 16 scattered stores that each miss.
// Lines at the edges of a (thread, bucket) region, which other threads or buckets share, are
// written entry by entry.
template <typename T>
class LineWriter {
 public:
  static constexpr uint64_t kPerLine = 64 / sizeof(T);

  // cursor[b]: next position of bucket b (advanced by Push); start[b]: first position of this
  // writer's region in bucket b.
  LineWriter(T* out, uint64_t* cursor, const uint64_t* start, uint64_t buckets)
      : out_(out), cursor_(cursor), start_(start), lines_(buckets * kPerLine + kPerLine) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(out);
    // Positions p with (p + phase_) % kPerLine == 0 start a 64-byte line of `out`.
    phase_ = ((address % 64) / sizeof(T)) % kPerLine;
    buffer_ = lines_.data();
    while (reinterpret_cast<uintptr_t>(buffer_) % 64 != 0) ++buffer_;
  }

  void Push(uint64_t bucket, T value) {
    const uint64_t p = cursor_[bucket]++;
    const uint64_t slot = (p + phase_) % kPerLine;
    T* line = buffer_ + bucket * kPerLine;
    line[slot] = value;
    if (slot == kPerLine - 1) {
      if (p + 1 >= start_[bucket] + kPerLine) {
        StoreLine(out_ + (p + 1 - kPerLine), line);
      } else {
        WriteEntries(bucket, p + 1, kPerLine);
      }
    }
  }

  // Writes what is left in the buffers.
  void Finish() {
    const uint64_t buckets = (lines_.size() - kPerLine) / kPerLine;
    for (uint64_t b = 0; b < buckets; ++b) {
      WriteEntries(b, cursor_[b], (cursor_[b] + phase_) % kPerLine);
    }
#if defined(__SSE2__)
    _mm_sfence();  // Non-temporal stores are visible to other threads after this.
#endif
  }

 private:
  // Writes the last `pending` buffered entries of `bucket` (those before position `end`) one by
  // one, except any before the region's start.
  void WriteEntries(uint64_t bucket, uint64_t end, uint64_t pending) {
    const uint64_t first = std::max(start_[bucket], end - std::min(end, pending));
    const T* line = buffer_ + bucket * kPerLine;
    for (uint64_t q = first; q < end; ++q) out_[q] = line[(q + phase_) % kPerLine];
  }

  static void StoreLine(T* dst, const T* line) {
#if defined(__SSE2__)
    __m128i* d = reinterpret_cast<__m128i*>(dst);
    const __m128i* s = reinterpret_cast<const __m128i*>(line);
    _mm_stream_si128(d, _mm_load_si128(s));
    _mm_stream_si128(d + 1, _mm_load_si128(s + 1));
    _mm_stream_si128(d + 2, _mm_load_si128(s + 2));
    _mm_stream_si128(d + 3, _mm_load_si128(s + 3));
#else
    std::copy(line, line + kPerLine, dst);
#endif
  }

  T* out_;
  uint64_t* cursor_;
  const uint64_t* start_;
  std::vector<T> lines_;
  T* buffer_;
  uint64_t phase_;
};

template <typename T, typename Source>
void Shuffle(int threads, uint64_t seed, uint64_t epoch, const Source& source, absl::Span<T> out,
             int max_top_bits) {
  assert(max_top_bits >= 1);
  const uint64_t m = out.size();
  assert(m <= plan_math::kMaxShuffleInputs);
  const int bits = plan_math::ShuffleBucketBits(m);
  if (bits == 0) {  // One bucket: the inputs in order, shuffled.
    typename Source::Reader reader(source);
    for (uint64_t k = 0; k < m; k += kBlock) {
      const uint64_t count = std::min(kBlock, m - k);
      reader.Load(k, count);
      for (uint64_t i = 0; i < count; ++i) out[k + i] = static_cast<T>(reader.Value(k + i));
    }
    if (m > 1) FisherYates(seed, epoch, 0, out.data(), m);
    return;
  }
  // The stable partition by the b bucket bits runs in two levels when b is large: pass A
  // scatters by the top `top_bits` (few enough buckets for both writers' lines to stay in L2),
  // keeping each input's remaining `low_bits` in `low` (in the same order as `out`);
  // pass B partitions each top-level bucket by those (stable: a counting sort). Both levels
  // are stable, so every final bucket holds its inputs in input order, as one level would.
  const int top_bits = TopBits(bits, max_top_bits);
  const int low_bits = bits - top_bits;
  const uint64_t top_buckets = uint64_t{1} << top_bits;
  const uint32_t low_mask = (uint32_t{1} << low_bits) - 1;
  LargeVector<uint16_t> low;
  if (low_bits > 0) low.resize(m);  // Not zero-filled: pass A writes every entry.

  // Pass A1: per-thread top-level histograms over a static split of the inputs (pass A2 uses
  // the same split, so every bucket receives its inputs in input order whatever the split).
  const int t_count = std::max(1, threads);
  std::vector<std::vector<uint64_t>> cursor(t_count, std::vector<uint64_t>(top_buckets, 0));
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    uint32_t bucket[kBlock];
    std::vector<uint64_t>& h = cursor[t];
    for (uint64_t k = b; k < e; k += kBlock) {
      const uint64_t count = std::min(kBlock, e - k);
      BucketsOf(seed, epoch, bits, k, count, bucket);
      for (uint64_t i = 0; i < count; ++i) ++h[bucket[i] >> low_bits];
    }
  });
  // Top-level bucket starts, and the start of each (thread, bucket) region within its bucket.
  std::vector<uint64_t> top_start(top_buckets + 1);
  uint64_t running = 0, largest = 0;
  for (uint64_t b = 0; b < top_buckets; ++b) {
    top_start[b] = running;
    for (int t = 0; t < t_count; ++t) {
      const uint64_t c = cursor[t][b];
      cursor[t][b] = running;
      running += c;
    }
    largest = std::max(largest, running - top_start[b]);
  }
  top_start[top_buckets] = running;

  // Pass A2: the bucket numbers again; the inputs, and their low bucket bits, scattered into
  // their top-level buckets.
  const std::vector<std::vector<uint64_t>> region_start = cursor;
  std::vector<std::vector<uint64_t>> low_cursor;
  if (low_bits > 0) low_cursor = cursor;
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    LineWriter<T> writer(out.data(), cursor[t].data(), region_start[t].data(), top_buckets);
    typename Source::Reader reader(source);
    uint32_t bucket[kBlock];
    if (low_bits == 0) {
      for (uint64_t k = b; k < e; k += kBlock) {
        const uint64_t count = std::min(kBlock, e - k);
        BucketsOf(seed, epoch, bits, k, count, bucket);
        reader.Load(k, count);
        for (uint64_t i = 0; i < count; ++i) {
          writer.Push(bucket[i], static_cast<T>(reader.Value(k + i)));
        }
      }
    } else {
      LineWriter<uint16_t> low_writer(low.data(), low_cursor[t].data(), region_start[t].data(),
                                      top_buckets);
      for (uint64_t k = b; k < e; k += kBlock) {
        const uint64_t count = std::min(kBlock, e - k);
        BucketsOf(seed, epoch, bits, k, count, bucket);
        reader.Load(k, count);
        for (uint64_t i = 0; i < count; ++i) {
          const uint32_t top = bucket[i] >> low_bits;
          writer.Push(top, static_cast<T>(reader.Value(k + i)));
          low_writer.Push(top, static_cast<uint16_t>(bucket[i] & low_mask));
        }
      }
      low_writer.Finish();
    }
    writer.Finish();
  });

  // Pass B: every top-level bucket on its own (in L2): partitioned by its low bits, then every
  // final bucket B = (top << low_bits) | low shuffled.
  constexpr uint64_t kTopGrain = 8;
  ParallelForChunks(threads, top_buckets, kTopGrain, [&](uint64_t, uint64_t b0, uint64_t b1) {
    if (low_bits == 0) {
      for (uint64_t top = b0; top < b1; ++top) {
        FisherYates(seed, epoch, top, out.data() + top_start[top],
                    top_start[top + 1] - top_start[top]);
      }
      return;
    }
    std::unique_ptr<T[]> copy(new T[largest]);  // Not zero-filled: each use writes it first.
    std::vector<uint64_t> sub_start((uint64_t{1} << low_bits) + 1);
    for (uint64_t top = b0; top < b1; ++top) {
      const uint64_t s = top_start[top], n = top_start[top + 1] - s;
      T* a = out.data() + s;
      const uint16_t* l = low.data() + s;
      std::fill(sub_start.begin(), sub_start.end(), 0);
      for (uint64_t i = 0; i < n; ++i) ++sub_start[l[i] + 1];
      for (uint64_t j = 1; j < sub_start.size(); ++j) sub_start[j] += sub_start[j - 1];
      std::copy(a, a + n, copy.get());
      for (uint64_t i = 0; i < n; ++i) a[sub_start[l[i]]++] = copy[i];
      // Now sub_start[j] is the end of sub-bucket j.
      uint64_t first = 0;
      for (uint64_t j = 0; j + 1 < sub_start.size(); ++j) {
        FisherYates(seed, epoch, (top << low_bits) | j, a + first, sub_start[j] - first);
        first = sub_start[j];
      }
    }
  });
}

// The number of entries of the largest top-level bucket that ShuffleScratchBytes provides for:
// its mean plus 16 standard deviations (and 64). Buckets are binomial; by Chernoff's bound a
// bucket exceeds this with probability below e^-30 even for tiny means (e^-120 at the sizes
// where it matters), so the estimate holds for every seed that will ever be used.
uint64_t LargestTopBucketBound(uint64_t m, int top_bits) {
  const double mean = static_cast<double>(m) / static_cast<double>(uint64_t{1} << top_bits);
  const double bound = mean + 16.0 * std::sqrt(mean) + 64.0;
  return std::min<uint64_t>(m, static_cast<uint64_t>(bound));
}

}  // namespace

uint64_t ShuffleScratchBytes(int threads, uint64_t m) {
  const int bits = plan_math::ShuffleBucketBits(std::min(m, plan_math::kMaxShuffleInputs));
  if (bits == 0) return 0;  // Shuffled in place.
  const int top_bits = TopBits(bits, kMaxShuffleTopBits);
  const int low_bits = bits - top_bits;
  const uint64_t top_buckets = uint64_t{1} << top_bits;
  const uint64_t t_count = static_cast<uint64_t>(std::max(1, threads));
  // cursor and region_start (t_count x top_buckets each), top_start, and per thread one
  // LineWriter: top_buckets + 1 lines of 64 bytes.
  uint64_t bytes = t_count * top_buckets * 2 * sizeof(uint64_t) +
                   (top_buckets + 1) * sizeof(uint64_t) + t_count * (top_buckets + 1) * 64;
  if (low_bits > 0) {
    // The low bucket bits (2 bytes per input), their cursors and LineWriters; in pass B per
    // thread a copy of the largest top-level bucket (at most 8 bytes per entry) and the
    // sub-bucket starts.
    bytes += LargeArrayBytes(m * sizeof(uint16_t)) + t_count * top_buckets * sizeof(uint64_t) +
             t_count * (top_buckets + 1) * 64 +
             t_count * (LargestTopBucketBound(m, top_bits) * sizeof(uint64_t) +
                        ((uint64_t{1} << low_bits) + 1) * sizeof(uint64_t));
  }
  return bytes;
}

template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, absl::Span<T> out, int max_top_bits) {
  Shuffle(threads, seed, epoch, RangeSource{}, out, max_top_bits);
}

template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    absl::Span<T> out, int max_top_bits) {
  assert(indices.size() == out.size());
  Shuffle(threads, seed, epoch, ArraySource{indices.data()}, out, max_top_bits);
}

template <typename T>
void ShuffleGenerated(int threads, uint64_t seed, uint64_t epoch, const InputBlockFn& inputs,
                      absl::Span<T> out, int max_top_bits) {
  Shuffle(threads, seed, epoch, GeneratedSource{&inputs}, out, max_top_bits);
}

template void ShuffleRange(int, uint64_t, uint64_t, absl::Span<uint32_t>, int);
template void ShuffleRange(int, uint64_t, uint64_t, absl::Span<uint64_t>, int);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             absl::Span<uint32_t>, int);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             absl::Span<uint64_t>, int);
template void ShuffleGenerated(int, uint64_t, uint64_t, const InputBlockFn&, absl::Span<uint64_t>,
                               int);

}  // namespace internal
}  // namespace samplerd
