#include "server/loss_batch.h"

#include "absl/strings/str_cat.h"
#include "proto/loss_pairs.h"

namespace samplerd {

absl::Status ValidateLossBatch(const LossBatchView& batch, uint64_t num_samples) {
  if (absl::Status s = ValidateLossPairs(batch.indices, batch.losses, num_samples); !s.ok()) {
    return s;
  }
  if (batch.consecutive && !batch.positions.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "positions: ", batch.positions.size(),
        " entries and first_position = ", batch.first_position, ": give one of the two"));
  }
  if (!batch.consecutive && batch.positions.size() != batch.indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "positions: ", batch.positions.size(), " entries but indices: ", batch.indices.size(),
        " (every loss names the shard position its index was served at: positions, or "
        "first_position for consecutive ones)"));
  }
  if (batch.indices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices: empty batch; send 1 to ", kMaxLossBatchPairs, " pairs"));
  }
  if (batch.indices.size() > kMaxLossBatchPairs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indices: ", batch.indices.size(), " pairs in one batch; at most ", kMaxLossBatchPairs));
  }
  return absl::OkStatus();
}

absl::Status ValidateLossPositions(const LossBatchView& batch, uint64_t shard_length) {
  const std::string deal =
      batch.deal > 0 ? absl::StrCat(" in deal ", batch.deal, " of epoch ", batch.epoch) : "";
  if (batch.consecutive) {
    if (batch.first_position >= shard_length ||
        shard_length - batch.first_position < batch.indices.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "first_position = ", batch.first_position, " with ", batch.indices.size(),
          " pairs passes the end of rank ", batch.rank, "'s shard [0, ", shard_length, ")", deal));
    }
    return absl::OkStatus();
  }
  for (size_t k = 0; k < batch.positions.size(); ++k) {
    if (batch.positions[k] >= shard_length) {
      return absl::InvalidArgumentError(absl::StrCat("positions[", k, "] = ", batch.positions[k],
                                                     " is outside rank ", batch.rank,
                                                     "'s shard [0, ", shard_length, ")", deal));
    }
  }
  return absl::OkStatus();
}

LossBatchView ViewOf(const v1::LossBatch& batch) {
  LossBatchView view;
  view.epoch = batch.epoch();
  view.rank = batch.rank();
  view.seq = batch.seq();
  view.deal = batch.deal();
  view.incarnation = batch.incarnation();
  view.indices = absl::MakeConstSpan(batch.indices().data(), batch.indices_size());
  view.losses = absl::MakeConstSpan(batch.losses().data(), batch.losses_size());
  view.positions = absl::MakeConstSpan(batch.positions().data(), batch.positions_size());
  view.consecutive = batch.has_first_position();
  view.first_position = batch.first_position();
  return view;
}

}  // namespace samplerd
