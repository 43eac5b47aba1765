#include "server/sampler_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/impl/codegen/proto_utils.h"  // SerializationTraits of the responses.
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "proto/status_util.h"
#include "server/raw_request.h"

namespace samplerd {
namespace {

using RpcType = grpc::internal::RpcMethod::RpcType;

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// The .proto's description of the method at `path` ("/samplerd.v1.Sampler/Name"). A path, kind
// or message type that does not match the .proto is a programmer error: CHECK-fails at start-up.
const google::protobuf::MethodDescriptor& MethodAt(absl::string_view path, RpcType type,
                                                   const google::protobuf::Descriptor* request,
                                                   const google::protobuf::Descriptor* response) {
  const google::protobuf::ServiceDescriptor* service =
      v1::Job::descriptor()->file()->FindServiceByName("Sampler");
  CHECK(service != nullptr);
  const std::string prefix = absl::StrCat("/", service->full_name(), "/");
  CHECK(absl::StartsWith(path, prefix)) << path;
  const google::protobuf::MethodDescriptor* method =
      service->FindMethodByName(std::string(path.substr(prefix.size())));
  CHECK(method != nullptr) << path << " is not in proto/samplerd.proto";
  CHECK_EQ(method->client_streaming(), type == RpcType::CLIENT_STREAMING) << path;
  CHECK_EQ(method->server_streaming(), type == RpcType::SERVER_STREAMING) << path;
  CHECK(method->input_type() == request) << path;
  CHECK(method->output_type() == response) << path;
  return *method;
}

// Reads a chunked upload (weights or labels) into one vector of N values. Chunks must name the
// same job and arrive in order (offset == values received so far).
template <typename Chunk, typename T, typename Values>
absl::StatusOr<std::vector<T>> ReadUpload(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                          JobRegistry* registry, const Caller& caller,
                                          std::shared_ptr<Job>* job, const char* field,
                                          Values values_of) {
  RequestStreamReader stream(reader);
  Chunk chunk;
  std::vector<T> values;
  std::string name;
  while (stream.Next(&chunk)) {
    if (stream.parsed() == 1) {
      name = chunk.job();
      if (absl::Status s = caller.MayUseJob(name); !s.ok()) return s;
      absl::StatusOr<std::shared_ptr<Job>> found = registry->Get(name);
      if (!found.ok()) return found.status();
      *job = *std::move(found);
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
  if (!stream.status().ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(stream.status().message(), "; nothing of the upload was applied"));
  }
  if (stream.parsed() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty upload stream"));
  }
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

void SamplerService::ShardStreamScope::Writing() {
  absl::MutexLock lock(&service_->calls_mu_);
  service_->shard_streams_.insert(context_);
  registered_ = true;
  if (service_->shard_streams_ended_) context_->TryCancel();
}

SamplerService::ShardStreamScope::~ShardStreamScope() {
  if (!registered_) return;
  absl::MutexLock lock(&service_->calls_mu_);
  service_->shard_streams_.erase(context_);
}

void SamplerService::EndShardStreams() {
  absl::MutexLock lock(&calls_mu_);
  shard_streams_ended_ = true;
  // Under calls_mu_: a context stays registered, so alive, until its handler has returned.
  for (grpc::ServerContext* context : shard_streams_) context->TryCancel();
}

bool SamplerService::AwaitNoCalls(absl::Time deadline) const {
  absl::MutexLock lock(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return calls_in_flight_ == 0; };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

template <typename Request, typename Response>
void SamplerService::AddUnary(const char* path,
                              grpc::Status (SamplerService::*handler)(grpc::ServerContext*,
                                                                      const Request&, Response*)) {
  const MethodAccess access = MethodAccess::Of(
      MethodAt(path, RpcType::NORMAL_RPC, Request::descriptor(), Response::descriptor()));
  AddMethod(new grpc::internal::RpcServiceMethod(
      path, RpcType::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<SamplerService, grpc::ByteBuffer, Response>(
          [handler, access](SamplerService* service, grpc::ServerContext* context,
                            const grpc::ByteBuffer* raw, Response* response) {
            CallScope call(service);
            absl::StatusOr<Caller> caller = service->CallerOf(*context);
            if (!caller.ok()) return ToGrpcStatus(caller.status());
            Request request;
            if (absl::Status s = ParseRequest(*raw, &request); !s.ok()) return ToGrpcStatus(s);
            if (absl::Status s = access.Check(*caller, request); !s.ok()) return ToGrpcStatus(s);
            return (service->*handler)(context, request, response);
          },
          this)));
}

template <typename Response>
void SamplerService::AddClientStream(
    const char* path,
    grpc::Status (SamplerService::*impl)(grpc::ServerReaderInterface<grpc::ByteBuffer>*, Response*,
                                         const Caller&)) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      path, RpcType::CLIENT_STREAMING,
      new grpc::internal::ClientStreamingHandler<SamplerService, grpc::ByteBuffer, Response>(
          [impl](SamplerService* service, grpc::ServerContext* context,
                 grpc::ServerReader<grpc::ByteBuffer>* reader, Response* response) {
            CallScope call(service);
            // The job of each message is checked by the Impl as it reads it.
            absl::StatusOr<Caller> caller = service->CallerOf(*context);
            if (!caller.ok()) return ToGrpcStatus(caller.status());
            return (service->*impl)(reader, response, *caller);
          },
          this)));
}

SamplerService::SamplerService(JobRegistry* registry, ComputeBackend* backend,
                               int max_message_bytes, uint64_t max_stream_buffer_bytes,
                               const Authorizer* authorizer, metrics::Registry* metrics)
    : registry_(registry),
      backend_(backend),
      max_message_bytes_(max_message_bytes),
      authorizer_(authorizer),
      stream_budget_(max_stream_buffer_bytes),
      metrics_(metrics) {
  AddUnary("/samplerd.v1.Sampler/CreateJob", &SamplerService::CreateJob);
  AddUnary("/samplerd.v1.Sampler/GetJob", &SamplerService::GetJob);
  AddUnary("/samplerd.v1.Sampler/ListJobs", &SamplerService::ListJobs);
  AddUnary("/samplerd.v1.Sampler/DeleteJob", &SamplerService::DeleteJob);
  AddUnary("/samplerd.v1.Sampler/RewindJob", &SamplerService::RewindJob);
  AddUnary("/samplerd.v1.Sampler/ResizeJob", &SamplerService::ResizeJob);
  MethodAt("/samplerd.v1.Sampler/UploadWeights", RpcType::CLIENT_STREAMING,
           v1::UploadWeightsChunk::descriptor(), v1::UploadSummary::descriptor());
  AddClientStream("/samplerd.v1.Sampler/UploadWeights", &SamplerService::UploadWeightsImpl);
  MethodAt("/samplerd.v1.Sampler/UploadLabels", RpcType::CLIENT_STREAMING,
           v1::UploadLabelsChunk::descriptor(), v1::UploadSummary::descriptor());
  AddClientStream("/samplerd.v1.Sampler/UploadLabels", &SamplerService::UploadLabelsImpl);
  const MethodAccess stream_shard_access = MethodAccess::Of(
      MethodAt("/samplerd.v1.Sampler/StreamShard", RpcType::SERVER_STREAMING,
               v1::StreamShardRequest::descriptor(), v1::ShardChunk::descriptor()));
  AddMethod(new grpc::internal::RpcServiceMethod(
      "/samplerd.v1.Sampler/StreamShard", RpcType::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<SamplerService, grpc::ByteBuffer, v1::ShardChunk>(
          [stream_shard_access](SamplerService* service, grpc::ServerContext* context,
                                const grpc::ByteBuffer* raw,
                                grpc::ServerWriter<v1::ShardChunk>* writer) {
            CallScope call(service);
            ShardStreamScope stream(service, context);
            absl::StatusOr<Caller> caller = service->CallerOf(*context);
            if (!caller.ok()) return ToGrpcStatus(caller.status());
            v1::StreamShardRequest request;
            if (absl::Status s = ParseRequest(*raw, &request); !s.ok()) return ToGrpcStatus(s);
            if (absl::Status s = stream_shard_access.Check(*caller, request); !s.ok()) {
              return ToGrpcStatus(s);
            }
            return service->StreamShardImpl(
                request, DeadlineOf(*context), [context] { return context->IsCancelled(); }, writer,
                [&stream] { stream.Writing(); });
          },
          this)));
  MethodAt("/samplerd.v1.Sampler/ReportLosses", RpcType::CLIENT_STREAMING,
           v1::LossBatch::descriptor(), v1::LossReportSummary::descriptor());
  AddClientStream("/samplerd.v1.Sampler/ReportLosses", &SamplerService::ReportLossesImpl);
  AddUnary("/samplerd.v1.Sampler/EndEpoch", &SamplerService::EndEpoch);
  AddUnary("/samplerd.v1.Sampler/GetJobStatus", &SamplerService::GetJobStatus);
  // Every method of the .proto is served (MethodAt checked each one registered above).
  CHECK_EQ(v1::Job::descriptor()->file()->FindServiceByName("Sampler")->method_count(), 12);
}

absl::StatusOr<Caller> SamplerService::CallerOf(const grpc::ServerContext& context) const {
  if (authorizer_ == nullptr) return Caller::Unrestricted();
  return authorizer_->Authenticate(context.client_metadata());
}

grpc::Status SamplerService::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest& request, v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job =
      registry_->Create(request.name(), request.spec(), DeadlineOf(*context), request.resume());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::GetJob(grpc::ServerContext*, const v1::GetJobRequest& request,
                                    v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (!request.has_rank()) {
    if (request.has_epoch()) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("epoch = ", request.epoch(),
                                                  " without a rank: it selects the epoch of "
                                                  "the rank's shard length")));
    }
    *response = (*job)->Describe();
    return grpc::Status::OK;
  }
  absl::StatusOr<v1::Job> described = (*job)->DescribeForRank(
      request.rank(),
      request.has_epoch() ? std::optional<uint64_t>(request.epoch()) : std::nullopt);
  if (!described.ok()) return ToGrpcStatus(described.status());
  *response = *std::move(described);
  return grpc::Status::OK;
}

grpc::Status SamplerService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest&,
                                      v1::ListJobsResponse* response) {
  for (const auto& job : registry_->List()) *response->add_jobs() = job->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest& request,
                                       v1::DeleteJobResponse*) {
  absl::Status deleted = registry_->Delete(request.name());
  if (!absl::IsNotFound(deleted)) metrics_.ForgetJob(request.name());
  return ToGrpcStatus(deleted);
}

grpc::Status SamplerService::RewindJob(grpc::ServerContext*, const v1::RewindJobRequest& request,
                                       v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = (*job)->Rewind(request.epoch()); !s.ok()) return ToGrpcStatus(s);
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::ResizeJob(grpc::ServerContext*, const v1::ResizeJobRequest& request,
                                       v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::Job> resized = (*job)->Resize(request.epoch(), request.world_size());
  if (!resized.ok()) return ToGrpcStatus(resized.status());
  *response = *std::move(resized);
  return grpc::Status::OK;
}

grpc::Status SamplerService::UploadWeightsImpl(
    grpc::ServerReaderInterface<grpc::ByteBuffer>* reader, v1::UploadSummary* response,
    const Caller& caller) {
  std::shared_ptr<Job> job;
  absl::StatusOr<std::vector<float>> weights = ReadUpload<v1::UploadWeightsChunk, float>(
      reader, registry_, caller, &job, "weights",
      [](const v1::UploadWeightsChunk& c) -> const auto& { return c.weights(); });
  if (!weights.ok()) return ToGrpcStatus(weights.status());
  const uint64_t received = weights->size();
  if (absl::Status s = job->UploadWeights(*std::move(weights)); !s.ok()) return ToGrpcStatus(s);
  response->set_received(received);
  return grpc::Status::OK;
}

grpc::Status SamplerService::UploadLabelsImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                              v1::UploadSummary* response, const Caller& caller) {
  std::shared_ptr<Job> job;
  absl::StatusOr<std::vector<uint32_t>> labels = ReadUpload<v1::UploadLabelsChunk, uint32_t>(
      reader, registry_, caller, &job, "labels",
      [](const v1::UploadLabelsChunk& c) -> const auto& { return c.labels(); });
  if (!labels.ok()) return ToGrpcStatus(labels.status());
  if (absl::Status s = job->UploadLabels(*labels); !s.ok()) return ToGrpcStatus(s);
  response->set_received(labels->size());
  return grpc::Status::OK;
}

uint64_t SamplerService::ChunkBytes(uint64_t indices, bool wide_indices, bool with_is_weights) {
  const uint64_t wire = (wide_indices ? 8 : 4) + (with_is_weights ? 4 : 0);
  return indices * (sizeof(uint64_t) + 2 * wire);
}

grpc::Status SamplerService::StreamShardImpl(const v1::StreamShardRequest& request,
                                             absl::Time deadline,
                                             const std::function<bool()>& cancelled,
                                             grpc::ServerWriterInterface<v1::ShardChunk>* writer,
                                             const std::function<void()>& writing) {
  const uint32_t max_chunk = v1::MAX_SHARD_CHUNK_SIZE;
  if (request.max_chunk_size() > max_chunk) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("max_chunk_size = ", request.max_chunk_size(), ": must be <= ", max_chunk)));
  }
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<ShardLease> lease = (*job)->AcquireShard(
      request.epoch(), request.deal(), request.rank(), request.world_size(), deadline, cancelled);
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
  const uint64_t requested = request.max_chunk_size() == 0
                                 ? static_cast<uint64_t>(v1::DEFAULT_SHARD_CHUNK_SIZE)
                                 : request.max_chunk_size();
  const uint64_t chunk_size = std::max<uint64_t>(1, std::min<uint64_t>(requested, fits));
  // Held until the call ends: what its largest chunk costs while a slow reader holds it.
  absl::StatusOr<StreamBudget::Reservation> buffer_bytes = stream_budget_.Reserve(
      ChunkBytes(std::max<uint64_t>(1, std::min(chunk_size, length - request.start_offset())), wide,
                 request.with_is_weights()));
  if (!buffer_bytes.ok()) return ToGrpcStatus(buffer_bytes.status());
  const std::shared_ptr<metrics::Counter> streamed = metrics_.IndicesStreamed(request.job());
  std::vector<uint64_t> buffer;
  v1::ShardChunk chunk;
  uint64_t pos = request.start_offset();
  if (writing) writing();
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
        // 1 / w of each index, where the backend holds the weights.
        s = backend_->ImportanceWeights(*lease->view.weights, buffer,
                                        absl::MakeSpan(is->mutable_data(), count));
        if (!s.ok()) return ToGrpcStatus(s);
      }
    }
    pos += count;
    chunk.set_last(pos == length);
    if (cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    // A blocking Write: the sync API waits for flow control, so memory stays at one chunk.
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed by the client");
    }
    streamed->Increment(static_cast<double>(count));
    // Deleted meanwhile: stop (the proto promises NOT_FOUND). Shutting down (UNAVAILABLE): an
    // in-flight stream may finish within the grace period, the server cancels it after.
    if (absl::Status closed =
            (*job)->RecordStreamed(request.epoch(), request.deal(), request.rank(), pos);
        absl::IsNotFound(closed) && pos < length) {
      return ToGrpcStatus(closed);
    }
  } while (pos < length);
  return grpc::Status::OK;
}

grpc::Status SamplerService::ReportLossesImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                              v1::LossReportSummary* response,
                                              const Caller& caller) {
  RequestStreamReader stream(reader);
  v1::LossBatch batch;
  std::shared_ptr<Job> job;
  // The summary acknowledges the batches: they are made durable first (one sync per job and
  // call, not per batch). So is what an error keeps: the batches before it were applied.
  auto sync = [&job]() { return job ? job->Sync() : absl::OkStatus(); };
  while (stream.Next(&batch)) {
    if (!job || job->name() != batch.job()) {
      if (absl::Status s = sync(); !s.ok()) return ToGrpcStatus(s);
      if (absl::Status s = caller.MayUseJob(batch.job()); !s.ok()) {
        return ToGrpcStatus(absl::Status(
            s.code(), absl::StrCat("batch seq = ", batch.seq(), " of rank ", batch.rank(), ": ",
                                   s.message(), " (earlier batches of this stream were applied)")));
      }
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(batch.job());
      if (!found.ok()) return ToGrpcStatus(found.status());
      job = *std::move(found);
    }
    LossBatchView view;
    view.epoch = batch.epoch();
    view.rank = batch.rank();
    view.seq = batch.seq();
    view.deal = batch.deal();
    view.indices = absl::MakeConstSpan(batch.indices().data(), batch.indices_size());
    view.losses = absl::MakeConstSpan(batch.losses().data(), batch.losses_size());
    view.positions = absl::MakeConstSpan(batch.positions().data(), batch.positions_size());
    view.consecutive = batch.has_first_position();
    view.first_position = batch.first_position();
    const v1::LossReportSummary before = *response;
    if (absl::Status s = job->ReportLosses(view, response); !s.ok()) {
      if (absl::Status synced = sync(); !synced.ok()) return ToGrpcStatus(synced);
      return ToGrpcStatus(absl::Status(
          s.code(), absl::StrCat("batch seq = ", batch.seq(), " of rank ", batch.rank(), ": ",
                                 s.message(), " (earlier batches of this stream were applied)")));
    }
    metrics_.CountLosses(batch.job(), before, *response);
    response->set_batches(response->batches() + 1);
  }
  if (absl::Status synced = sync(); !synced.ok()) return ToGrpcStatus(synced);
  if (!stream.status().ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat(stream.status().message(), "; batches before it applied: ", stream.parsed(),
                     "; nothing after it was read")));
  }
  return grpc::Status::OK;
}

grpc::Status SamplerService::EndEpoch(grpc::ServerContext*, const v1::EndEpochRequest& request,
                                      v1::EndEpochResponse* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::EndEpochResponse> r =
      (*job)->EndEpoch(request.epoch(), request.deal(), request.rank());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status SamplerService::GetJobStatus(grpc::ServerContext*,
                                          const v1::GetJobStatusRequest& request,
                                          v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Status();
  return grpc::Status::OK;
}

}  // namespace samplerd
