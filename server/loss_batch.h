// LossBatchView: one batch of (index, loss) pairs as the core sees it, and the one place that
// decides whether a batch is well-formed.
//
// The service unpacks a v1::LossBatch into spans (no copy); the journal logs and replays the same
// view. Plain data; no gRPC.
#ifndef SAMPLERD_SERVER_LOSS_BATCH_H_
#define SAMPLERD_SERVER_LOSS_BATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/shard.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

// Largest number of (index, loss) pairs in one batch: the API's limit, defined in the .proto.
inline constexpr uint64_t kMaxLossBatchPairs = v1::MAX_LOSS_BATCH_PAIRS;

struct LossBatchView {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint64_t seq = 0;  // Chosen by the reporter; names the batch in errors.
  absl::Span<const uint64_t> indices;
  absl::Span<const float> losses;
  // The shard position each index was served at, the pair's identity (see position_set.h):
  // `positions[k]`, or with `consecutive`, first_position + k (proto LossBatch.first_position).
  absl::Span<const uint64_t> positions;
  bool consecutive = false;
  uint64_t first_position = 0;

  uint32_t deal = 0;  // The epoch's deal the positions are in (proto LossBatch.deal).
  // The reporter's rank claim (proto LossBatch.incarnation; 0: it does not claim).
  uint64_t incarnation = 0;

  uint64_t position(size_t k) const { return consecutive ? first_position + k : positions[k]; }
};

// The view of a LossBatch message (no copy: `batch` must outlive it).
LossBatchView ViewOf(const v1::LossBatch& batch);

// OK if `batch` is well-formed for a job of `num_samples` samples: as many losses and positions
// (or consecutive positions from first_position, and no list) as indices, 1 to
// kMaxLossBatchPairs pairs, every index < num_samples, every loss finite and >= 0.
// INVALID_ARGUMENT naming the first offending field and value otherwise. Does not look at what
// depends on the job's state: the epoch, the deal, the rank and the positions (below), and
// whether the shard holds each index at its position (the job checks it against the deal's
// plan).
absl::Status ValidateLossBatch(const LossBatchView& batch, uint64_t num_samples);

// After ValidateLossBatch, with the length of the rank's shard in the batch's deal: OK if every
// position is inside [0, shard_length); INVALID_ARGUMENT naming the first that is not.
absl::Status ValidateLossPositions(const LossBatchView& batch, uint64_t shard_length);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOSS_BATCH_H_
