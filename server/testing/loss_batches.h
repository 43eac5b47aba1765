// Loss batches for server tests: the pairs a rank was really served, with their shard positions.
#ifndef SAMPLERD_SERVER_TESTING_LOSS_BATCHES_H_
#define SAMPLERD_SERVER_TESTING_LOSS_BATCHES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "proto/samplerd.pb.h"
#include "server/loss_batch.h"

namespace samplerd {
namespace testutil {

// A LossBatchView with its own arrays.
struct OwnedLossBatch {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint64_t seq = 0;
  std::vector<uint64_t> indices;
  std::vector<float> losses;
  std::vector<uint64_t> positions;
  uint32_t deal = 0;

  LossBatchView view() const {
    LossBatchView v{epoch, rank, seq, indices, losses, positions};
    v.deal = deal;
    return v;
  }
};

// The pairs of `shard` (a rank's shard as streamed: position k holds shard[k]) at `positions`,
// each with loss `loss(index)`.
inline OwnedLossBatch BatchAt(uint64_t epoch, uint32_t rank, uint64_t seq,
                              absl::Span<const uint64_t> shard, std::vector<uint64_t> positions,
                              const std::function<float(uint64_t index)>& loss) {
  OwnedLossBatch b{epoch, rank, seq, {}, {}, std::move(positions)};
  for (uint64_t p : b.positions) {
    b.indices.push_back(shard[p]);
    b.losses.push_back(loss(shard[p]));
  }
  return b;
}

// The pairs at shard positions [from, to).
inline OwnedLossBatch BatchOfRange(uint64_t epoch, uint32_t rank, uint64_t seq,
                                   absl::Span<const uint64_t> shard, uint64_t from, uint64_t to,
                                   const std::function<float(uint64_t index)>& loss) {
  std::vector<uint64_t> positions;
  for (uint64_t p = from; p < to; ++p) positions.push_back(p);
  return BatchAt(epoch, rank, seq, shard, std::move(positions), loss);
}

// The LossBatch message a client sends (ReportLosses) of job `job` with the pairs of `b`.
inline v1::LossBatch MessageOf(const std::string& job, const OwnedLossBatch& b) {
  v1::LossBatch m;
  m.set_job(job);
  m.set_epoch(b.epoch);
  m.set_rank(b.rank);
  m.set_seq(b.seq);
  m.set_deal(b.deal);
  m.mutable_indices()->Add(b.indices.begin(), b.indices.end());
  m.mutable_losses()->Add(b.losses.begin(), b.losses.end());
  m.mutable_positions()->Add(b.positions.begin(), b.positions.end());
  return m;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_LOSS_BATCHES_H_
