#include "kernels/internal/shuffle.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/internal/parallel.h"
#include "kernels/internal/philox_batch.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kKeyBlock = 512;       // Keys computed per vectorised Philox call.
constexpr uint64_t kSmall = 4096;         // Below this many indices: one plain sort.
constexpr uint64_t kBucketTarget = 4096;  // Indices per top-level bucket, about (L2-sized).
constexpr int kMaxTopBits = 16;

// Indices 0..m-1.
struct RangeSource {
  uint64_t Index(uint64_t k) const { return k; }
  void Keys(uint64_t seed, uint64_t epoch, uint64_t k, uint64_t count, uint64_t* keys) const {
    RandomBits64Range(seed, epoch, RandomStream::kShuffle, k, count, keys);
  }
};

// Indices from an array.
struct ArraySource {
  const uint64_t* indices;
  uint64_t Index(uint64_t k) const { return indices[k]; }
  void Keys(uint64_t seed, uint64_t epoch, uint64_t k, uint64_t count, uint64_t* keys) const {
    RandomBits64Gather(seed, epoch, RandomStream::kShuffle, indices + k, count, keys);
  }
};

// Sorts (key, index) pairs and writes the indices: the definition, for small inputs.
template <typename T>
void SortPairs(std::vector<std::pair<uint64_t, uint64_t>>& pairs, T* out) {
  std::sort(pairs.begin(), pairs.end());
  for (size_t i = 0; i < pairs.size(); ++i) out[i] = static_cast<T>(pairs[i].second);
}

// Scratch of one thread for SortBucket, reused across buckets.
template <typename T>
struct BucketScratch {
  std::vector<T> indices;
  std::vector<uint64_t> packed, sorted;
  std::vector<uint32_t> count;
  std::vector<std::pair<uint64_t, uint64_t>> tied;
};

// Sorts data[0, n) -- indices whose keys share their top `top_bits` bits -- by (key, index).
//
// Each index becomes one word: the next 32 key bits above a 32-bit payload, the index itself
// when T is 32 bits, else its position in the bucket. A counting sort on the top bits of those
// words (about one word per slot), then an insertion sort (which rarely moves anything), order
// the words; runs whose 32 key bits are equal (rare: ~n^2 / 2^33 pairs) are then ordered by
// (full key, index). Everything stays in this thread's L2 cache.
template <typename T>
void SortBucket(uint64_t seed, uint64_t epoch, int top_bits, T* data, uint64_t n,
                BucketScratch<T>& s) {
  constexpr bool kIndexInWord = sizeof(T) == 4;
  if (n < 2) return;
  if (!kIndexInWord && n >= (uint64_t{1} << 32)) {  // Positions would not fit: plain sort.
    s.tied.resize(n);
    for (uint64_t i = 0; i < n; ++i) s.tied[i] = {ShuffleKey(seed, epoch, data[i]), data[i]};
    SortPairs(s.tied, data);
    return;
  }
  if (!kIndexInWord) s.indices.assign(data, data + n);
  s.packed.resize(n);
  s.sorted.resize(n);
  int sub_bits = 0;  // ~1 word per counting-sort slot.
  while (sub_bits < 16 && (uint64_t{1} << sub_bits) < n) ++sub_bits;
  const int digit_shift = 64 - sub_bits;
  s.count.assign(size_t{1} << sub_bits, 0);
  uint64_t* packed = s.packed.data();
  uint64_t keys[kKeyBlock];
  for (uint64_t k = 0; k < n; k += kKeyBlock) {
    const uint64_t count = std::min(kKeyBlock, n - k);
    RandomBits64Gather(seed, epoch, RandomStream::kShuffle, data + k, count, keys);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t payload = kIndexInWord ? uint64_t{data[k + i]} : k + i;
      const uint64_t word = (((keys[i] << top_bits) >> 32) << 32) | payload;
      packed[k + i] = word;
      if (sub_bits > 0) ++s.count[word >> digit_shift];
    }
  }
  uint64_t* sorted = s.sorted.data();
  if (sub_bits > 0) {
    uint32_t running = 0;
    for (uint32_t& c : s.count) {
      const uint32_t here = c;
      c = running;
      running += here;
    }
    for (uint64_t i = 0; i < n; ++i) sorted[s.count[packed[i] >> digit_shift]++] = packed[i];
  } else {
    std::copy(packed, packed + n, sorted);
  }
  uint64_t largest = sorted[0];  // Of sorted[0, i): kept in a register, not reloaded.
  for (uint64_t i = 1; i < n; ++i) {
    const uint64_t word = sorted[i];
    if (word >= largest) {
      largest = word;
      continue;
    }
    uint64_t j = i;
    for (; j > 0 && word < sorted[j - 1]; --j) sorted[j] = sorted[j - 1];
    sorted[j] = word;
  }
  auto index_of = [&](uint64_t word) -> T {
    const uint64_t payload = word & 0xffffffffu;
    return kIndexInWord ? static_cast<T>(payload) : s.indices[payload];
  };
  // Usually no two words share their 32 key bits: then the output is a plain copy (both loops
  // vectorise).
  uint64_t ties = 0;
  for (uint64_t i = 1; i < n; ++i) ties += (sorted[i] >> 32) == (sorted[i - 1] >> 32);
  if (ties == 0) {
    for (uint64_t i = 0; i < n; ++i) data[i] = index_of(sorted[i]);
    return;
  }
  for (uint64_t i = 0; i < n;) {
    uint64_t j = i + 1;
    while (j < n && (sorted[j] >> 32) == (sorted[i] >> 32)) ++j;
    if (j - i == 1) {
      data[i] = index_of(sorted[i]);
    } else {  // Equal in 32 key bits: by the full key, then the index.
      s.tied.clear();
      for (uint64_t k = i; k < j; ++k) {
        const T index = index_of(sorted[k]);
        s.tied.emplace_back(ShuffleKey(seed, epoch, index), index);
      }
      SortPairs(s.tied, data + i);
    }
    i = j;
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
void Shuffle(int threads, uint64_t seed, uint64_t epoch, uint64_t m, const Source& source,
             const std::function<absl::Span<T>()>& allocate) {
  if (m < kSmall) {
    const absl::Span<T> out = allocate();
    std::vector<std::pair<uint64_t, uint64_t>> pairs(m);
    for (uint64_t k = 0; k < m; ++k) {
      const uint64_t index = source.Index(k);
      pairs[k] = {ShuffleKey(seed, epoch, index), index};
    }
    SortPairs(pairs, out.data());
    return;
  }
  int top_bits = 1;
  while (top_bits < kMaxTopBits && (kBucketTarget << top_bits) < m) ++top_bits;
  const uint64_t buckets = uint64_t{1} << top_bits;
  const int shift = 64 - top_bits;

  // Per-thread histograms over a static split (the scatter below uses the same split); each
  // bucket then receives its indices in input order whatever the split, and is fully sorted
  // afterwards anyway.
  const int t_count = std::max(1, threads);
  std::vector<std::vector<uint64_t>> cursor(t_count, std::vector<uint64_t>(buckets, 0));
  absl::Span<T> out;
  ParallelForThreadsWhile(
      t_count, m,
      [&](int t, uint64_t b, uint64_t e) {
        uint64_t keys[kKeyBlock];
        std::vector<uint64_t>& h = cursor[t];
        for (uint64_t k = b; k < e; k += kKeyBlock) {
          const uint64_t count = std::min(kKeyBlock, e - k);
          source.Keys(seed, epoch, k, count, keys);
          for (uint64_t i = 0; i < count; ++i) ++h[keys[i] >> shift];
        }
      },
      [&] { out = allocate(); });
  std::vector<uint64_t> bucket_start(buckets + 1);
  uint64_t running = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    bucket_start[b] = running;
    for (int t = 0; t < t_count; ++t) {
      const uint64_t c = cursor[t][b];
      cursor[t][b] = running;
      running += c;
    }
  }
  bucket_start[buckets] = running;
  // Region of each (thread, bucket) pair: [cursor, end) before the scatter moves the cursor.
  std::vector<std::vector<uint64_t>> region_start = cursor;
  ParallelForThreads(t_count, m, [&](int t, uint64_t b, uint64_t e) {
    LineWriter<T> writer(out.data(), cursor[t].data(), region_start[t].data(), buckets);
    uint64_t keys[kKeyBlock];
    for (uint64_t k = b; k < e; k += kKeyBlock) {
      const uint64_t count = std::min(kKeyBlock, e - k);
      source.Keys(seed, epoch, k, count, keys);
      for (uint64_t i = 0; i < count; ++i) {
        writer.Push(keys[i] >> shift, static_cast<T>(source.Index(k + i)));
      }
    }
    writer.Finish();
  });
  cursor.clear();
  ParallelForChunks(threads, buckets, 8, [&](uint64_t, uint64_t b0, uint64_t b1) {
    BucketScratch<T> scratch;
    for (uint64_t b = b0; b < b1; ++b) {
      SortBucket(seed, epoch, top_bits, out.data() + bucket_start[b],
                 bucket_start[b + 1] - bucket_start[b], scratch);
    }
  });
}

}  // namespace

template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, uint64_t m,
                  const std::function<absl::Span<T>()>& allocate) {
  Shuffle(threads, seed, epoch, m, RangeSource{}, allocate);
}

template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    const std::function<absl::Span<T>()>& allocate) {
  Shuffle(threads, seed, epoch, indices.size(), ArraySource{indices.data()}, allocate);
}

template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, absl::Span<T> out) {
  ShuffleRange<T>(threads, seed, epoch, out.size(), [out] { return out; });
}

template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    absl::Span<T> out) {
  ShuffleIndices<T>(threads, seed, epoch, indices, [out] { return out; });
}

template void ShuffleRange(int, uint64_t, uint64_t, absl::Span<uint32_t>);
template void ShuffleRange(int, uint64_t, uint64_t, absl::Span<uint64_t>);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             absl::Span<uint32_t>);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             absl::Span<uint64_t>);
template void ShuffleRange(int, uint64_t, uint64_t, uint64_t,
                           const std::function<absl::Span<uint32_t>()>&);
template void ShuffleRange(int, uint64_t, uint64_t, uint64_t,
                           const std::function<absl::Span<uint64_t>()>&);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             const std::function<absl::Span<uint32_t>()>&);
template void ShuffleIndices(int, uint64_t, uint64_t, absl::Span<const uint64_t>,
                             const std::function<absl::Span<uint64_t>()>&);

}  // namespace internal
}  // namespace samplerd
