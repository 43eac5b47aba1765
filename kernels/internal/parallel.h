// A minimal parallel-for for the CPU backend.
//
// Work is split into chunks whose boundaries depend only on the problem size, never on the
// number of threads, so per-chunk partial results combined in chunk order are bit-identical for
// any thread count (the determinism contract).
#ifndef SAMPLERD_KERNELS_INTERNAL_PARALLEL_H_
#define SAMPLERD_KERNELS_INTERNAL_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace samplerd {
namespace internal {

// Number of chunks of at most `grain` items covering [0, n).
inline uint64_t NumChunks(uint64_t n, uint64_t grain) {
  return n == 0 ? 0 : (n + grain - 1) / grain;
}

// Calls fn(chunk, begin, end) for every chunk [chunk * grain, min(n, (chunk + 1) * grain)) of
// [0, n), on up to `num_threads` threads (the caller's thread included). Chunks are handed out
// dynamically; fn must only write state owned by its chunk.
template <typename Fn>
void ParallelForChunks(int num_threads, uint64_t n, uint64_t grain, const Fn& fn) {
  const uint64_t chunks = NumChunks(n, grain);
  if (chunks == 0) return;
  std::atomic<uint64_t> next{0};
  auto worker = [&] {
    for (uint64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      fn(c, c * grain, std::min(n, (c + 1) * grain));
    }
  };
  const int threads = static_cast<int>(std::min<uint64_t>(std::max(1, num_threads), chunks));
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

// Number of threads ParallelForThreads uses for n items (small inputs are not worth a thread
// each: kMinPerThread items at least), and the static range of thread t.
inline int ThreadsFor(int num_threads, uint64_t n) {
  constexpr uint64_t kMinPerThread = 1 << 15;
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>(std::max(1, num_threads), n / kMinPerThread)));
}
inline uint64_t ThreadRangeBegin(int threads, uint64_t n, int t) { return n * t / threads; }

// Calls fn(thread_index, begin, end) once per thread over a static split of [0, n) into
// ThreadsFor(num_threads, n) contiguous ranges (for per-thread scratch such as histograms). Use
// only where the final result does not depend on the split.
template <typename Fn>
void ParallelForThreads(int num_threads, uint64_t n, const Fn& fn) {
  const int threads = ThreadsFor(num_threads, n);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back(
        [&, t] { fn(t, ThreadRangeBegin(threads, n, t), ThreadRangeBegin(threads, n, t + 1)); });
  }
  fn(0, 0, ThreadRangeBegin(threads, n, 1));
  for (std::thread& t : pool) t.join();
}

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_PARALLEL_H_
