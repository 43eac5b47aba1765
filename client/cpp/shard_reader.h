// ShardReader: this rank's shard of each epoch, prefetched by a background thread, handed to the
// training loop in batches without a network round trip.
//
// A trainer rank makes one ShardReader for its (job, rank, world_size), opens an epoch with
// StartEpoch, and takes batches with Next(n) (or NextToDevice) until an empty batch says the
// shard is done; then it ends the epoch on the server (SamplerClient::EndEpoch) and opens the
// next one. Behind it, a thread streams the shard (SamplerClient::StreamShard) into a bounded
// queue of `queue_capacity` indices: Next only waits when the queue is empty, i.e. when training
// outruns the server.
//
// Failures: a broken stream and a server restarted with --data_dir are ridden through by
// SamplerClient's retries (ClientOptions::retry_budget, backoff): the stream is reopened at the
// next position not yet queued, so no index is lost or repeated. When the retries run out the
// error is kept and returned by the first Next that needs an index the queue does not have (the
// indices queued before the failure are served first), naming job, epoch, rank and position.
// After an error, StartEpoch or Resume(position()) reopens the stream where Next stopped.
//
// Checkpoints: position() is exactly after the last index Next returned. A restarted trainer
// passes the saved value (ReaderPosition, client/cpp/reader_position.h) to EpochLoop::Resume,
// which checks it against the job's state first (client/cpp/resume_check.h), or to Resume here,
// which opens exactly that position (see there).
//
// Thread safety: the public methods must not be called concurrently (one training thread per
// reader, or external locking); the prefetch thread is internal. The SamplerClient may be shared
// with other users (a LossReporter, other readers); the reader keeps it alive.
#ifndef SAMPLERD_CLIENT_CPP_SHARD_READER_H_
#define SAMPLERD_CLIENT_CPP_SHARD_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/device_port.h"  // DeviceStream: cudaStream_t, without the CUDA headers.
#include "client/cpp/reader_position.h"
#include "client/cpp/sampler_client.h"

namespace samplerd {

struct ShardReaderOptions {
  std::string job;
  uint32_t rank = 0;
  // Must equal the job's world size (the server checks it when an epoch is opened).
  uint32_t world_size = 1;
  // Indices the prefetch queue holds (8 bytes each), >= 2. Next(n) needs n <= queue_capacity.
  size_t queue_capacity = size_t{1} << 21;
  // Indices per chunk asked of the server: 0 for the server's default; at most
  // v1::MAX_SHARD_CHUNK_SIZE. Capped at queue_capacity / 2 so that a chunk always fits once half
  // the queue is free.
  uint32_t max_chunk_size = 0;
  // Pinned staging buffers of NextToDevice (device_port::Uploader), >= 1.
  int device_staging_slots = 3;
  // The rank's claim (client/cpp/rank_claim.h; must outlive the reader), whose incarnation the
  // streams carry; null: the streams are refused (FAILED_PRECONDITION) while another process
  // holds the rank. EpochLoop sets it.
  ClaimSource* claim = nullptr;
};

// What Next returns: `indices` are the shard positions [position, position + indices.size()) of
// this rank's shard of `epoch`, in order. Empty at the end of the shard (and at every later Next).
struct ShardBatch {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t shard_length = 0;
  // Points into the reader: valid until the next call on the reader (or its destruction).
  absl::Span<const uint64_t> indices;

  bool end_of_shard() const { return indices.empty(); }
};

class ShardReader {
 public:
  // INVALID_ARGUMENT naming the option for a null client, an empty job, world_size = 0,
  // rank >= world_size, queue_capacity < 2, max_chunk_size > v1::MAX_SHARD_CHUNK_SIZE,
  // device_staging_slots < 1. Contacts no server.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Create(std::shared_ptr<SamplerClient> client,
                                                             ShardReaderOptions options);
  // Stops the prefetch thread (cancelling its stream) and waits for device copies in flight.
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Drops whatever epoch was open and starts reading `epoch` from shard position
  // `start_position`. Returns once the first chunk has arrived, so the server's refusal comes
  // back here: NOT_FOUND (unknown job), FAILED_PRECONDITION (an epoch that is not open, e.g.
  // already ended; a world size that is not the job's), INVALID_ARGUMENT (rank outside the job's
  // world, a start past the shard), each naming job, epoch and rank. An epoch not yet open (the
  // other ranks have not all ended the previous one) is waited for, up to ClientOptions::timeout.
  // On error no epoch is open.
  // `deal`: the epoch's deal (v1::Job::deal; 0 unless the group was resized in the epoch).
  absl::Status StartEpoch(uint64_t epoch, uint64_t start_position = 0, uint32_t deal = 0);

  // StartEpoch(position.epoch, position.position, position.deal) for a position saved by this
  // job's rank (ReaderPosition::CheckOwner): INVALID_ARGUMENT if its job or rank is not this
  // reader's, FAILED_PRECONDITION if its world size is not (the shards are not the same ones).
  // It opens exactly that position, as after a stream error (Resume(position())), and does not
  // check it against the job's history: the server refuses an epoch closed since (the
  // FAILED_PRECONDITION of StartEpoch), but a position that predates a rewind would resume
  // silently. A restarted trainer resumes a checkpoint with EpochLoop::Resume, which applies
  // CheckResume (client/cpp/resume_check.h) first; that check is the loop's, not the reader's,
  // because what follows a position at the end of a closed epoch's shard -- the next epoch in
  // the loop's deal, without the saved epoch's hook and EndEpoch -- is the loop's to do, and
  // the reader reopens positions of the epoch it reads (after stream errors, and for every epoch
  // the loop opens) where the check would cost an RPC and could only pass. A trainer on a bare
  // ShardReader calls CheckResume itself with GetJobStatus's facts.
  absl::Status Resume(const ReaderPosition& position);

  // The next min(n, rest of the shard) indices, waiting for the prefetch thread if it has not
  // queued them yet; an empty batch at the end of the shard. INVALID_ARGUMENT for n = 0 or
  // n > queue_capacity; FAILED_PRECONDITION with no epoch open; the stream's error (see above)
  // if it failed before queueing them, and then position() is unchanged.
  absl::StatusOr<ShardBatch> Next(size_t n);

  // Next(n), and the batch's indices copied to `device_indices` (device memory of at least n
  // int64_t: the index type of torch and of CUDA gather kernels; every index is < 2^63) with
  // cudaMemcpyAsync on `stream`, through pinned staging buffers (DeviceUploader): returns once
  // the copy is enqueued, never synchronising `stream`; use the indices on that stream (or after
  // an event recorded on it). The host span in the batch stays valid as for Next.
  // FAILED_PRECONDITION (the CUDA runtime's reason) without a usable GPU or in the CPU-only
  // library (//client/cpp:trainer_cpu: client/cpp/device_port.h), and the CUDA error of a failed
  // copy; in all cases nothing is consumed (position() is unchanged).
  absl::StatusOr<ShardBatch> NextToDevice(size_t n, int64_t* device_indices, DeviceStream stream);

  // Where reading stands: exactly after the last index Next returned (the start position right
  // after StartEpoch), with the shard's length (the server said it on opening).
  // FAILED_PRECONDITION with no epoch open.
  absl::StatusOr<ReaderPosition> position() const;

  const ShardReaderOptions& options() const { return options_; }

 private:
  class EpochStream;

  ShardReader(std::shared_ptr<SamplerClient> client, ShardReaderOptions options);
  // Stops and forgets the open epoch's stream, if any.
  void CloseEpoch();
  absl::Status CheckCanRead(size_t n) const;

  const std::shared_ptr<SamplerClient> client_;
  const ShardReaderOptions options_;
  const uint32_t chunk_size_;  // Asked of the server.
  // The prefetch queue's storage: a ring of options_.queue_capacity indices, filled by the open
  // EpochStream (which synchronises access to it) and reused from epoch to epoch.
  std::unique_ptr<uint64_t[]> ring_;
  // Null with no epoch open.
  std::unique_ptr<EpochStream> stream_;
  // Indices of the open epoch taken by Next so far (the position is stream_'s start plus this).
  uint64_t read_ = 0;
  // Holds a batch that wraps around the end of the ring, contiguous.
  std::vector<uint64_t> wrapped_;
  // Created by the first NextToDevice.
  std::unique_ptr<device_port::Uploader> uploader_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_SHARD_READER_H_
