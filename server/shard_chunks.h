// ShardChunks: the chunks of one StreamShard call once its shard is acquired (Job::AcquireShard),
// free of gRPC's call objects: their size (max_chunk_size, cut to fit the server's message
// limit), the bytes they hold reserved from the stream budget, each chunk's indices extracted by
// the backend (and their importance weights), and the progress recorded after each is written.
// The ShardStreamReactor (shard_stream_reactor.h) writes them.
//
// Not thread-safe: one call's, used by one thread at a time.
#ifndef SAMPLERD_SERVER_SHARD_CHUNKS_H_
#define SAMPLERD_SERVER_SHARD_CHUNKS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job.h"
#include "server/metrics/registry.h"
#include "server/service_metrics.h"
#include "server/stream_budget.h"

namespace samplerd {

// What StreamShard checks before it looks the job up: max_chunk_size (INVALID_ARGUMENT).
absl::Status CheckStreamShardRequest(const v1::StreamShardRequest& request);

// The floats a chunk carries per index beside it: its importance weight (with_is_weights) and
// its irreducible loss (with_irreducible_losses), 0 to 2.
int FloatsPerIndex(const v1::StreamShardRequest& request);

// Bytes of a ShardChunk message kept for its fields other than the per-index arrays (epoch,
// rank, offset, shard_length, last, the arrays' tags and lengths: about 60 at most): a chunk's
// indices and floats fill the rest of --max_message_bytes.
inline constexpr uint64_t kShardChunkHeaderBytes = 128;

// Bytes a StreamShard call holds while one chunk of `indices` indices is in flight: the
// extracted indices (8 bytes each), the ShardChunk message, and gRPC's serialized copy of it
// until the reader takes it; `floats_per_index` (FloatsPerIndex) 4-byte values travel with each.
uint64_t ShardChunkBytes(uint64_t indices, bool wide_indices, int floats_per_index);

class ShardChunks {
 public:
  // Checks the start offset, sizes the chunks to fit `max_message_bytes`, and reserves the bytes
  // of the largest from `budget` (RESOURCE_EXHAUSTED if they do not fit) until destroyed.
  // FAILED_PRECONDITION naming the job and the field for with_irreducible_losses when the
  // lease holds none (the job's loss policy is not REDUCIBLE_LOSS).
  static absl::StatusOr<std::unique_ptr<ShardChunks>> Start(const v1::StreamShardRequest& request,
                                                            std::shared_ptr<Job> job,
                                                            ShardLease lease, int max_message_bytes,
                                                            StreamBudget* budget,
                                                            ServiceMetrics* metrics);

  // Fills `chunk` with the next chunk (at least one: an empty shard still says `last`).
  absl::Status Next(ComputeBackend* backend, v1::ShardChunk* chunk);

  // The chunk Next filled was written: counts it and records the progress. NOT_FOUND if the job
  // was deleted meanwhile with positions left (the proto promises it); shutting down
  // (UNAVAILABLE), an in-flight stream may finish within the grace period, the server cancels
  // it after.
  absl::Status Written();

  // Every chunk was made.
  bool done() const { return started_ && pos_ == lease_.shard_length; }

 private:
  ShardChunks(const v1::StreamShardRequest& request, std::shared_ptr<Job> job, ShardLease lease,
              bool wide, uint64_t chunk_size, StreamBudget::Reservation reserved,
              std::shared_ptr<metrics::Counter> streamed);

  const v1::StreamShardRequest request_;
  const std::shared_ptr<Job> job_;
  const ShardLease lease_;
  const bool wide_;
  const uint64_t chunk_size_;
  StreamBudget::Reservation reserved_;
  const std::shared_ptr<metrics::Counter> streamed_;
  std::vector<uint64_t> buffer_;
  uint64_t pos_;
  uint64_t last_count_ = 0;
  bool started_ = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SHARD_CHUNKS_H_
