// StreamBudget: the bound on the memory that all open StreamShard calls together may hold for
// their chunks (the --max_stream_buffer_bytes flag).
//
// Each StreamShard call holds one chunk at a time, but it holds it for as long as its reader
// takes to accept it: a reader that stalls keeps the chunk (up to ~24 MB at max_chunk_size =
// 2^20) alive, and nothing else limits how many such calls clients open (a call waiting on its
// reader holds no thread: sampler_service.h). A call reserves its chunk's bytes before it
// streams and releases them when it ends; a reservation that does not fit fails at once
// (RESOURCE_EXHAUSTED), it never waits for memory that stalled calls hold.
//
// Thread-safe.
#ifndef SAMPLERD_SERVER_STREAM_BUDGET_H_
#define SAMPLERD_SERVER_STREAM_BUDGET_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace samplerd {

// Largest default of --max_stream_buffer_bytes / Options::max_stream_buffer_bytes (a quarter of
// --max_memory_bytes up to it: server/memory_budget.h): 1 GiB, room for about a thousand
// streams at the default chunk size (65536 indices, ~1 MiB each).
inline constexpr uint64_t kDefaultMaxStreamBufferBytes = uint64_t{1} << 30;

// The delay a refused stream is told to wait before it tries again (a hint: the clients wait
// at least this, and their own backoff).
inline constexpr absl::Duration kStreamBudgetRetryAfter = absl::Milliseconds(100);

class StreamBudget {
 public:
  // Bytes held by one call, given back when destroyed. Move-only; must not outlive its budget.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

    uint64_t bytes() const { return bytes_; }

   private:
    friend class StreamBudget;
    Reservation(StreamBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    void Release();

    StreamBudget* budget_;
    uint64_t bytes_;
  };

  explicit StreamBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  StreamBudget(const StreamBudget&) = delete;
  StreamBudget& operator=(const StreamBudget&) = delete;

  // Reserves `bytes` if they fit beside what the other calls hold. RESOURCE_EXHAUSTED, naming
  // the bytes asked for, the bytes in use, the limit and the --max_stream_buffer_bytes flag,
  // if they do not. When they would fit once other calls end, the refusal says "retry later"
  // and is marked WithRetryAfter(kStreamBudgetRetryAfter) (proto/retry_signal.h: the adapter
  // sends it as the samplerd-retry-after-ms trailer, by which the clients retry, proto
  // StreamShard); not when they exceed the whole limit (the same request would never fit).
  absl::StatusOr<Reservation> Reserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Give(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const uint64_t limit_;
  mutable absl::Mutex mu_;
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_STREAM_BUDGET_H_
