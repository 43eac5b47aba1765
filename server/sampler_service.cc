#include "server/sampler_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/status_util.h"

namespace samplerd {
namespace {

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Reads a chunked upload (weights or labels) into one vector of N values. Chunks must name the
// same job and arrive in order (offset == values received so far).
template <typename Chunk, typename T, typename Values>
absl::StatusOr<std::vector<T>> ReadUpload(grpc::ServerReaderInterface<Chunk>* reader,
                                          JobRegistry* registry, std::shared_ptr<Job>* job,
                                          const char* field, Values values_of) {
  Chunk chunk;
  std::vector<T> values;
  std::string name;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      name = chunk.job();
      absl::StatusOr<std::shared_ptr<Job>> found = registry->Get(name);
      if (!found.ok()) return found.status();
      *job = *std::move(found);
      first = false;
    } else if (chunk.job() != name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job = \"", chunk.job(), "\" differs from the stream's first chunk \"", name, "\""));
    }
    if (chunk.offset() != values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset = ", chunk.offset(), ": chunks must be contiguous; expected ", values.size()));
    }
    const auto& v = values_of(chunk);
    const uint64_t n = (*job)->config().plan.num_samples;
    if (values.size() + v.size() > n) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", values.size() + v.size(), " values for num_samples ", n));
    }
    values.insert(values.end(), v.begin(), v.end());
  }
  if (first) return absl::InvalidArgumentError(absl::StrCat(field, ": empty upload stream"));
  return values;
}

}  // namespace

SamplerService::CallScope::CallScope(SamplerService* service) : service_(service) {
  absl::MutexLock lock(&service_->calls_mu_);
  ++service_->calls_in_flight_;
}

SamplerService::CallScope::~CallScope() {
  absl::MutexLock lock(&service_->calls_mu_);
  --service_->calls_in_flight_;
}

int64_t SamplerService::CallsInFlight() const {
  absl::MutexLock lock(&calls_mu_);
  return calls_in_flight_;
}

bool SamplerService::AwaitNoCalls(absl::Time deadline) const {
  absl::MutexLock lock(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return calls_in_flight_ == 0; };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

SamplerService::SamplerService(JobRegistry* registry, ComputeBackend* backend,
                               int max_message_bytes)
    : registry_(registry), backend_(backend), max_message_bytes_(max_message_bytes) {}

grpc::Status SamplerService::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest* request, v1::Job* response) {
  CallScope call(this);
  absl::StatusOr<std::shared_ptr<Job>> job =
      registry_->Create(request->name(), request->spec(), DeadlineOf(*context));
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  CallScope call(this);
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request->name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  CallScope call(this);
  for (const auto& job : registry_->List()) *response->add_jobs() = job->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                                       v1::DeleteJobResponse*) {
  CallScope call(this);
  return ToGrpcStatus(registry_->Delete(request->name()));
}

grpc::Status SamplerService::UploadWeights(grpc::ServerContext*,
                                           grpc::ServerReader<v1::UploadWeightsChunk>* reader,
                                           v1::UploadSummary* response) {
  CallScope call(this);
  std::shared_ptr<Job> job;
  absl::StatusOr<std::vector<float>> weights = ReadUpload<v1::UploadWeightsChunk, float>(
      reader, registry_, &job, "weights",
      [](const v1::UploadWeightsChunk& c) -> const auto& { return c.weights(); });
  if (!weights.ok()) return ToGrpcStatus(weights.status());
  const uint64_t received = weights->size();
  if (absl::Status s = job->UploadWeights(*std::move(weights)); !s.ok()) return ToGrpcStatus(s);
  response->set_received(received);
  return grpc::Status::OK;
}

grpc::Status SamplerService::UploadLabels(grpc::ServerContext*,
                                          grpc::ServerReader<v1::UploadLabelsChunk>* reader,
                                          v1::UploadSummary* response) {
  CallScope call(this);
  std::shared_ptr<Job> job;
  absl::StatusOr<std::vector<uint32_t>> labels = ReadUpload<v1::UploadLabelsChunk, uint32_t>(
      reader, registry_, &job, "labels",
      [](const v1::UploadLabelsChunk& c) -> const auto& { return c.labels(); });
  if (!labels.ok()) return ToGrpcStatus(labels.status());
  if (absl::Status s = job->UploadLabels(*labels); !s.ok()) return ToGrpcStatus(s);
  response->set_received(labels->size());
  return grpc::Status::OK;
}

grpc::Status SamplerService::StreamShard(grpc::ServerContext* context,
                                         const v1::StreamShardRequest* request,
                                         grpc::ServerWriter<v1::ShardChunk>* writer) {
  CallScope call(this);
  return StreamShardImpl(
      *request, DeadlineOf(*context), [context] { return context->IsCancelled(); }, writer);
}

grpc::Status SamplerService::StreamShardImpl(const v1::StreamShardRequest& request,
                                             absl::Time deadline,
                                             const std::function<bool()>& cancelled,
                                             grpc::ServerWriterInterface<v1::ShardChunk>* writer) {
  if (request.max_chunk_size() > kMaxChunk) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("max_chunk_size = ", request.max_chunk_size(), ": must be <= ", kMaxChunk)));
  }
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<ShardLease> lease = (*job)->AcquireShard(
      request.epoch(), request.rank(), request.world_size(), deadline, cancelled);
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  const uint64_t length = lease->shard_length;
  if (request.start_offset() > length) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("start_offset = ", request.start_offset(), " is past the shard length ",
                     length, " of rank ", request.rank())));
  }
  const Plan& plan = *lease->view.plan;
  const bool wide = !Plan::Narrow(plan.num_samples);
  // Fit a chunk in one message: 4 or 8 bytes per index, 4 more with importance weights, plus a
  // few bytes of header fields.
  const uint64_t bytes_per_index = (wide ? 8 : 4) + (request.with_is_weights() ? 4 : 0);
  const uint64_t fits = std::max<int64_t>(max_message_bytes_ - 128, 0) / bytes_per_index;
  const uint64_t chunk_size = std::max<uint64_t>(
      1, std::min<uint64_t>(
             request.max_chunk_size() == 0 ? kDefaultChunk : request.max_chunk_size(), fits));
  const std::vector<float>& weights = *lease->view.weights;
  std::vector<uint64_t> buffer;
  v1::ShardChunk chunk;
  uint64_t pos = request.start_offset();
  do {  // At least one chunk, so that an empty shard still says `last`.
    const uint64_t count = std::min(chunk_size, length - pos);
    buffer.resize(count);
    absl::Status s =
        backend_->ExtractShard(plan, lease->shard, request.rank(), pos, absl::MakeSpan(buffer));
    if (!s.ok()) return ToGrpcStatus(s);
    chunk.Clear();
    chunk.set_epoch(request.epoch());
    chunk.set_rank(request.rank());
    chunk.set_offset(pos);
    chunk.set_shard_length(length);
    if (wide) {
      chunk.mutable_indices64()->Add(buffer.begin(), buffer.end());
    } else {
      auto* out = chunk.mutable_indices32();
      out->Resize(static_cast<int>(count), 0);
      for (uint64_t k = 0; k < count; ++k) out->Set(k, static_cast<uint32_t>(buffer[k]));
    }
    if (request.with_is_weights()) {
      auto* is = chunk.mutable_is_weights();
      is->Resize(static_cast<int>(count), 1.0f);
      if (!lease->view.unit_is_weights) {
        for (uint64_t k = 0; k < count; ++k) is->Set(k, 1.0f / weights[buffer[k]]);
      }
    }
    pos += count;
    chunk.set_last(pos == length);
    if (cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    // A blocking Write: the sync API waits for flow control, so memory stays at one chunk.
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed by the client");
    }
    // Deleted meanwhile: stop (the proto promises NOT_FOUND). Shutting down (UNAVAILABLE): an
    // in-flight stream may finish within the grace period, the server cancels it after.
    if (absl::Status closed = (*job)->RecordStreamed(request.epoch(), request.rank(), pos);
        absl::IsNotFound(closed) && pos < length) {
      return ToGrpcStatus(closed);
    }
  } while (pos < length);
  return grpc::Status::OK;
}

grpc::Status SamplerService::ReportLosses(grpc::ServerContext*,
                                          grpc::ServerReader<v1::LossBatch>* reader,
                                          v1::LossReportSummary* response) {
  CallScope call(this);
  return ReportLossesImpl(reader, response);
}

grpc::Status SamplerService::ReportLossesImpl(grpc::ServerReaderInterface<v1::LossBatch>* reader,
                                              v1::LossReportSummary* response) {
  v1::LossBatch batch;
  std::shared_ptr<Job> job;
  // The summary acknowledges the batches: they are made durable first (one sync per job and
  // call, not per batch).
  auto sync = [&job]() { return job ? job->Sync() : absl::OkStatus(); };
  while (reader->Read(&batch)) {
    if (!job || job->name() != batch.job()) {
      if (absl::Status s = sync(); !s.ok()) return ToGrpcStatus(s);
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(batch.job());
      if (!found.ok()) return ToGrpcStatus(found.status());
      job = *std::move(found);
    }
    LossBatchView view;
    view.epoch = batch.epoch();
    view.rank = batch.rank();
    view.seq = batch.seq();
    view.indices = absl::MakeConstSpan(batch.indices().data(), batch.indices_size());
    view.losses = absl::MakeConstSpan(batch.losses().data(), batch.losses_size());
    if (absl::Status s = job->ReportLosses(view, response); !s.ok()) {
      if (absl::Status synced = sync(); !synced.ok()) return ToGrpcStatus(synced);
      return ToGrpcStatus(absl::Status(
          s.code(), absl::StrCat("batch seq = ", batch.seq(), " of rank ", batch.rank(), ": ",
                                 s.message(), " (earlier batches of this stream were applied)")));
    }
  }
  return ToGrpcStatus(sync());
}

grpc::Status SamplerService::EndEpoch(grpc::ServerContext*, const v1::EndEpochRequest* request,
                                      v1::EndEpochResponse* response) {
  CallScope call(this);
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::EndEpochResponse> r = (*job)->EndEpoch(request->epoch(), request->rank());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status SamplerService::GetJobStatus(grpc::ServerContext*,
                                          const v1::GetJobStatusRequest* request,
                                          v1::JobStatus* response) {
  CallScope call(this);
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request->name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Status();
  return grpc::Status::OK;
}

}  // namespace samplerd
