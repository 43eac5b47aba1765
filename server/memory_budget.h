// MemoryBudget: how --max_memory_bytes is split between what serving holds and the jobs.
//
// samplerd's memory is the jobs' (their estimates, server/job_memory.h) plus what serving the
// ranks holds whatever the jobs: the chunks that open StreamShard calls buffer (StreamBudget,
// --max_stream_buffer_bytes) and gRPC's transports: the connections' read buffers and the
// requests being received and decoded (--max_transport_buffer_bytes: gRPC's resource quota, see
// below). Both are taken from the budget at start-up, as a serving reserve; the jobs are
// admitted against what is left. A reserve that does not fit the budget stops the server at
// start-up, naming the flags.
//
// Transport buffers. gRPC 1.51 reads a request whole before a handler (or the token check) sees
// it, and it does so whatever --max_message_bytes says (a larger request is refused only once
// read): what a peer announces in a message's length prefix, up to 4 GiB, is what the server
// buffers. The one bound gRPC offers on that memory is its resource quota
// (grpc::ResourceQuota::Resize), which counts the transports' read buffers: ~13 KB per
// connection while it waits for data (measured: 8,192 connections did not fit in 64 MiB, 1,024
// did, with 8 streams each), and the bytes of every request being received until its handler
// frees them. Beyond it gRPC closes idle connections and then resets streams (RST_STREAM
// ENHANCE_YOUR_CALM, which the client sees as RESOURCE_EXHAUSTED) until the memory is back under
// the quota. The bound is gRPC's, enforced as memory is allocated, so a burst can overshoot it
// by what is in flight at that moment (measured in docs/OPERATIONS.md).
//
// Defaults (a flag at 0): the budget 80% of the machine or container (DefaultMaxMemoryBytes);
// the stream buffers a quarter of it, at most kDefaultMaxStreamBufferBytes (1 GiB); the
// transport buffers a quarter too, at most kDefaultMaxTransportBufferBytes (1 GiB: 16,384
// connections, ~210 MB, and some sixty loss batches of 13 MiB in flight). In a 2 GiB container:
// budget 1.6 GiB, stream buffers 410 MiB, transport buffers 410 MiB (~20,000 idle connections,
// fewer with requests in flight), jobs 0.8 GiB.
//
// Pure functions; thread-safe.
#ifndef SAMPLERD_SERVER_MEMORY_BUDGET_H_
#define SAMPLERD_SERVER_MEMORY_BUDGET_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/stream_budget.h"

namespace samplerd {

// Largest default of --max_transport_buffer_bytes (see above). That of --max_stream_buffer_bytes
// is kDefaultMaxStreamBufferBytes (server/stream_budget.h).
inline constexpr uint64_t kDefaultMaxTransportBufferBytes = uint64_t{1} << 30;

struct MemoryBudget {
  uint64_t total = 0;              // --max_memory_bytes.
  uint64_t stream_buffers = 0;     // --max_stream_buffer_bytes.
  uint64_t transport_buffers = 0;  // --max_transport_buffer_bytes.

  // What serving holds back from the jobs: stream_buffers + transport_buffers.
  uint64_t serving_reserve() const { return stream_buffers + transport_buffers; }
  // What the jobs' estimates may add up to: total - serving_reserve().
  uint64_t jobs() const { return total - serving_reserve(); }
};

// The budget from the three flags, each 0 for its default (see above). INVALID_ARGUMENT, naming
// the flags and their values, when the serving reserve leaves the jobs nothing.
absl::StatusOr<MemoryBudget> MakeMemoryBudget(uint64_t max_memory_bytes,
                                              uint64_t max_stream_buffer_bytes,
                                              uint64_t max_transport_buffer_bytes);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_MEMORY_BUDGET_H_
