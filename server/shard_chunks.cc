#include "server/shard_chunks.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/plan.h"

namespace samplerd {

absl::Status CheckStreamShardRequest(const v1::StreamShardRequest& request) {
  const uint32_t max_chunk = v1::MAX_SHARD_CHUNK_SIZE;
  if (request.max_chunk_size() > max_chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_chunk_size = ", request.max_chunk_size(), ": must be <= ", max_chunk));
  }
  return absl::OkStatus();
}

int FloatsPerIndex(const v1::StreamShardRequest& request) {
  return (request.with_is_weights() ? 1 : 0) + (request.with_irreducible_losses() ? 1 : 0);
}

uint64_t ShardChunkBytes(uint64_t indices, bool wide_indices, int floats_per_index) {
  const uint64_t wire = (wide_indices ? 8 : 4) + 4 * static_cast<uint64_t>(floats_per_index);
  return indices * (sizeof(uint64_t) + 2 * wire);
}

absl::StatusOr<std::unique_ptr<ShardChunks>> ShardChunks::Start(
    const v1::StreamShardRequest& request, std::shared_ptr<Job> job, ShardLease lease,
    int max_message_bytes, StreamBudget* budget, ServiceMetrics* metrics) {
  const uint64_t length = lease.shard_length;
  if (request.start_offset() > length) {
    return absl::InvalidArgumentError(absl::StrCat("start_offset = ", request.start_offset(),
                                                   " is past the shard length ", length,
                                                   " of rank ", request.rank()));
  }
  if (request.with_irreducible_losses() && lease.irreducible == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job->name(), "' holds no irreducible losses (policy.loss = ",
        v1::LossPolicy_Name(job->config().normalized.policy().loss()),
        "): StreamShardRequest.with_irreducible_losses needs a REDUCIBLE_LOSS job whose "
        "irreducible losses were uploaded (UploadIrreducibleLosses; mix = 1 draws uniformly)"));
  }
  const bool wide = !Plan::Narrow(lease.view.plan->num_samples);
  const int floats = FloatsPerIndex(request);
  // Fit a chunk in one message: 4 or 8 bytes per index, 4 more per float carried beside it
  // (importance weight, irreducible loss), plus the header fields.
  const uint64_t bytes_per_index = (wide ? 8 : 4) + 4 * static_cast<uint64_t>(floats);
  const uint64_t fits =
      std::max<int64_t>(max_message_bytes - static_cast<int64_t>(kShardChunkHeaderBytes), 0) /
      bytes_per_index;
  const uint64_t requested = request.max_chunk_size() == 0
                                 ? static_cast<uint64_t>(v1::DEFAULT_SHARD_CHUNK_SIZE)
                                 : request.max_chunk_size();
  const uint64_t chunk_size = std::max<uint64_t>(1, std::min<uint64_t>(requested, fits));
  // Held until the call ends: what its largest chunk costs while a slow reader holds it.
  absl::StatusOr<StreamBudget::Reservation> reserved = budget->Reserve(ShardChunkBytes(
      std::max<uint64_t>(1, std::min(chunk_size, length - request.start_offset())), wide, floats));
  if (!reserved.ok()) return reserved.status();
  return std::unique_ptr<ShardChunks>(new ShardChunks(request, std::move(job), std::move(lease),
                                                      wide, chunk_size, *std::move(reserved),
                                                      metrics->IndicesStreamed(request.job())));
}

ShardChunks::ShardChunks(const v1::StreamShardRequest& request, std::shared_ptr<Job> job,
                         ShardLease lease, bool wide, uint64_t chunk_size,
                         StreamBudget::Reservation reserved,
                         std::shared_ptr<metrics::Counter> streamed)
    : request_(request),
      job_(std::move(job)),
      lease_(std::move(lease)),
      wide_(wide),
      chunk_size_(chunk_size),
      reserved_(std::move(reserved)),
      streamed_(std::move(streamed)),
      pos_(request.start_offset()) {}

absl::Status ShardChunks::Next(ComputeBackend* backend, v1::ShardChunk* chunk) {
  const uint64_t length = lease_.shard_length;
  const uint64_t count = std::min(chunk_size_, length - pos_);
  buffer_.resize(count);
  const Plan& plan = *lease_.view.plan;
  if (absl::Status s = backend->ExtractShard(plan, lease_.shard, request_.rank(), pos_,
                                             absl::MakeSpan(buffer_));
      !s.ok()) {
    return s;
  }
  chunk->Clear();
  chunk->set_epoch(request_.epoch());
  chunk->set_rank(request_.rank());
  chunk->set_offset(pos_);
  chunk->set_shard_length(length);
  if (wide_) {
    chunk->mutable_indices64()->Add(buffer_.begin(), buffer_.end());
  } else {
    auto* out = chunk->mutable_indices32();
    out->Resize(static_cast<int>(count), 0);
    for (uint64_t k = 0; k < count; ++k) out->Set(k, static_cast<uint32_t>(buffer_[k]));
  }
  if (request_.with_is_weights()) {
    auto* is = chunk->mutable_is_weights();
    is->Resize(static_cast<int>(count), 1.0f);
    if (!lease_.view.unit_is_weights) {
      // 1 / w of each index, where the backend holds the weights.
      if (absl::Status s = backend->ImportanceWeights(*lease_.view.weights, buffer_,
                                                      absl::MakeSpan(is->mutable_data(), count));
          !s.ok()) {
        return s;
      }
    }
  }
  if (request_.with_irreducible_losses()) {
    // The lease's irreducible losses, checked present in Start; the indices are < N.
    const std::vector<float>& irreducible = *lease_.irreducible;
    auto* out = chunk->mutable_irreducible_losses();
    out->Resize(static_cast<int>(count), 0.0f);
    for (uint64_t k = 0; k < count; ++k) out->Set(k, irreducible[buffer_[k]]);
  }
  pos_ += count;
  last_count_ = count;
  started_ = true;
  chunk->set_last(pos_ == length);
  return absl::OkStatus();
}

absl::Status ShardChunks::Written() {
  streamed_->Increment(static_cast<double>(last_count_));
  absl::Status closed =
      job_->RecordStreamed(request_.epoch(), request_.deal(), request_.rank(), pos_);
  if (absl::IsNotFound(closed) && pos_ < lease_.shard_length) return closed;
  return absl::OkStatus();
}

}  // namespace samplerd
