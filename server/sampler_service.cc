#include "server/sampler_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "proto/status_util.h"
#include "server/raw_request.h"

namespace samplerd {
namespace {

// The methods' names, in SamplerService::Method order (checked against the .proto).
constexpr const char* kMethodNames[SamplerService::kMethodCount] = {
    "CreateJob", "GetJob",        "ListJobs",     "DeleteJob",   "RewindJob",
    "ResizeJob", "UploadWeights", "UploadLabels", "StreamShard", "ReportLosses",
    "EndEpoch",  "GetJobStatus",  "ClaimRank",    "UploadIrreducibleLosses"};

const google::protobuf::ServiceDescriptor& SamplerDescriptor() {
  const google::protobuf::ServiceDescriptor* service =
      v1::Job::descriptor()->file()->FindServiceByName("Sampler");
  CHECK(service != nullptr);
  return *service;
}

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// A response, serialized for a raw method.
template <typename Message>
grpc::Status Serialize(const Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
}

// ---- Client streams, one message at a time. Each Stream type processes one call: Add takes a
// raw message (a status: the call ends with it), End the end of the stream. They run on the
// caller's thread (the *Impl cores) or on the WorkPool (the reactors), one message at a time.

// A chunked upload (weights or labels) into one vector of N values, applied at its end. Chunks
// must name the same job and arrive in order (offset == values received so far).
template <typename Chunk, typename T>
class UploadStream {
 public:
  using Response = v1::UploadSummary;
  using ValuesOf = const google::protobuf::RepeatedField<T>& (*)(const Chunk&);
  // Applies the values to the job (Job::UploadWeights, UploadLabels or UploadIrreducibleLosses).
  using Apply = absl::Status (*)(Job& job, std::vector<T> values);

  UploadStream(JobRegistry* registry, Caller caller, const char* field, ValuesOf values_of,
               Apply apply, Response* response)
      : registry_(registry),
        caller_(std::move(caller)),
        field_(field),
        values_of_(values_of),
        apply_(apply),
        response_(response) {}

  std::optional<grpc::Status> Add(const grpc::ByteBuffer& raw) {
    if (!parser_.Parse(raw, &chunk_)) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat(parser_.status().message(), "; nothing of the upload was applied")));
    }
    if (absl::Status s = Check(); !s.ok()) return ToGrpcStatus(s);
    const auto& v = values_of_(chunk_);
    values_.insert(values_.end(), v.begin(), v.end());
    return std::nullopt;
  }

  grpc::Status End() {
    if (parser_.parsed() == 0) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat(field_, ": empty upload stream")));
    }
    const uint64_t received = values_.size();
    if (absl::Status s = apply_(*job_, std::move(values_)); !s.ok()) return ToGrpcStatus(s);
    response_->set_received(received);
    return grpc::Status::OK;
  }

 private:
  absl::Status Check() {
    if (parser_.parsed() == 1) {
      name_ = chunk_.job();
      if (absl::Status s = caller_.MayUseJob(name_); !s.ok()) return s;
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(name_);
      if (!found.ok()) return found.status();
      job_ = *std::move(found);
    } else if (chunk_.job() != name_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job = \"", chunk_.job(), "\" differs from the stream's first chunk \"", name_, "\""));
    }
    if (chunk_.offset() != values_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset = ", chunk_.offset(), ": chunks must be contiguous; expected ", values_.size()));
    }
    const uint64_t n = job_->config().plan.num_samples;
    const uint64_t after = values_.size() + values_of_(chunk_).size();
    if (after > n) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_, ": ", after, " values for num_samples ", n));
    }
    return absl::OkStatus();
  }

  JobRegistry* const registry_;
  const Caller caller_;
  const char* const field_;
  const ValuesOf values_of_;
  const Apply apply_;
  Response* const response_;
  RequestStreamParser parser_;
  Chunk chunk_;
  std::string name_;
  std::shared_ptr<Job> job_;
  std::vector<T> values_;
};

using WeightsUpload = UploadStream<v1::UploadWeightsChunk, float>;
using LabelsUpload = UploadStream<v1::UploadLabelsChunk, uint32_t>;
using IrreducibleLossesUpload = UploadStream<v1::UploadIrreducibleLossesChunk, float>;

WeightsUpload MakeWeightsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response) {
  return WeightsUpload(
      registry, std::move(caller), "weights",
      [](const v1::UploadWeightsChunk& c) -> const auto& { return c.weights(); },
      [](Job& job, std::vector<float> values) { return job.UploadWeights(std::move(values)); },
      response);
}

LabelsUpload MakeLabelsUpload(JobRegistry* registry, Caller caller, v1::UploadSummary* response) {
  return LabelsUpload(
      registry, std::move(caller), "labels",
      [](const v1::UploadLabelsChunk& c) -> const auto& { return c.labels(); },
      [](Job& job, std::vector<uint32_t> values) { return job.UploadLabels(values); }, response);
}

IrreducibleLossesUpload MakeIrreducibleLossesUpload(JobRegistry* registry, Caller caller,
                                                    v1::UploadSummary* response) {
  return IrreducibleLossesUpload(
      registry, std::move(caller), "irreducible_losses",
      [](const v1::UploadIrreducibleLossesChunk& c) -> const auto& { return c.losses(); },
      [](Job& job, std::vector<float> values) {
        return job.UploadIrreducibleLosses(std::move(values));
      },
      response);
}

// A ReportLosses call: each batch applied as it arrives. The summary acknowledges the batches:
// they are made durable first (one sync per job and call, not per batch). So is what an error
// keeps: the batches before it were applied.
class LossStream {
 public:
  using Response = v1::LossReportSummary;

  LossStream(JobRegistry* registry, ServiceMetrics* metrics, Caller caller, Response* response)
      : registry_(registry), metrics_(metrics), caller_(std::move(caller)), response_(response) {}

  std::optional<grpc::Status> Add(const grpc::ByteBuffer& raw) {
    if (!parser_.Parse(raw, &batch_)) {
      if (absl::Status synced = Sync(); !synced.ok()) return ToGrpcStatus(synced);
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          parser_.status().message(), "; batches before it applied: ", parser_.parsed(),
          "; nothing after it was read")));
    }
    if (!job_ || job_->name() != batch_.job()) {
      if (absl::Status s = Sync(); !s.ok()) return ToGrpcStatus(s);
      if (absl::Status s = caller_.MayUseJob(batch_.job()); !s.ok()) return Failed(s);
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Get(batch_.job());
      if (!found.ok()) return ToGrpcStatus(found.status());
      job_ = *std::move(found);
    }
    LossBatchView view;
    view.epoch = batch_.epoch();
    view.rank = batch_.rank();
    view.seq = batch_.seq();
    view.deal = batch_.deal();
    view.indices = absl::MakeConstSpan(batch_.indices().data(), batch_.indices_size());
    view.losses = absl::MakeConstSpan(batch_.losses().data(), batch_.losses_size());
    view.positions = absl::MakeConstSpan(batch_.positions().data(), batch_.positions_size());
    view.consecutive = batch_.has_first_position();
    view.first_position = batch_.first_position();
    const v1::LossReportSummary before = *response_;
    absl::Status s = job_->claims().Check(batch_.rank(), batch_.incarnation());
    if (s.ok()) s = job_->ReportLosses(view, response_);
    if (!s.ok()) {
      if (absl::Status synced = Sync(); !synced.ok()) return ToGrpcStatus(synced);
      return Failed(s);
    }
    metrics_->CountLosses(batch_.job(), before, *response_);
    response_->set_batches(response_->batches() + 1);
    return std::nullopt;
  }

  grpc::Status End() { return ToGrpcStatus(Sync()); }

 private:
  absl::Status Sync() { return job_ ? job_->Sync() : absl::OkStatus(); }
  // `s`, naming the batch that failed.
  grpc::Status Failed(const absl::Status& s) const {
    return ToGrpcStatus(absl::Status(
        s.code(), absl::StrCat("batch seq = ", batch_.seq(), " of rank ", batch_.rank(), ": ",
                               s.message(), " (earlier batches of this stream were applied)")));
  }

  JobRegistry* const registry_;
  ServiceMetrics* const metrics_;
  const Caller caller_;
  Response* const response_;
  RequestStreamParser parser_;
  v1::LossBatch batch_;
  std::shared_ptr<Job> job_;
};

// Runs a client stream's Stream over a synchronous reader (the *Impl cores).
template <typename Stream>
grpc::Status ReadAll(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader, Stream& stream) {
  grpc::ByteBuffer raw;
  while (reader->Read(&raw)) {
    std::optional<grpc::Status> ended = stream.Add(raw);
    raw.Clear();
    if (ended.has_value()) return *ended;
  }
  return stream.End();
}

// ---- StreamShard's steps, shared by StreamShardImpl and the reactor.

// What StreamShard checks before it looks the job up.
absl::Status CheckStreamShardRequest(const v1::StreamShardRequest& request) {
  const uint32_t max_chunk = v1::MAX_SHARD_CHUNK_SIZE;
  if (request.max_chunk_size() > max_chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_chunk_size = ", request.max_chunk_size(), ": must be <= ", max_chunk));
  }
  return absl::OkStatus();
}

// Whether the caller may read the shard: an observer always; a reader by its rank's claim.
absl::Status CheckShardClaim(Job& job, const v1::StreamShardRequest& request) {
  if (request.observe()) return absl::OkStatus();
  return job.claims().Check(request.rank(), request.incarnation());
}

// The chunks of one StreamShard call, once its shard is acquired: at least one (an empty shard
// still says `last`). Not thread-safe: one call's, used by one thread at a time.
class ShardChunks {
 public:
  // Checks the start offset, sizes the chunks to fit `max_message_bytes`, and reserves the bytes
  // of the largest from `budget` (RESOURCE_EXHAUSTED if they do not fit) until destroyed.
  static absl::StatusOr<std::unique_ptr<ShardChunks>> Start(const v1::StreamShardRequest& request,
                                                            std::shared_ptr<Job> job,
                                                            ShardLease lease, int max_message_bytes,
                                                            StreamBudget* budget,
                                                            ServiceMetrics* metrics) {
    const uint64_t length = lease.shard_length;
    if (request.start_offset() > length) {
      return absl::InvalidArgumentError(absl::StrCat("start_offset = ", request.start_offset(),
                                                     " is past the shard length ", length,
                                                     " of rank ", request.rank()));
    }
    const bool wide = !Plan::Narrow(lease.view.plan->num_samples);
    // Fit a chunk in one message: 4 or 8 bytes per index, 4 more with importance weights, plus
    // a few bytes of header fields.
    const uint64_t bytes_per_index = (wide ? 8 : 4) + (request.with_is_weights() ? 4 : 0);
    const uint64_t fits = std::max<int64_t>(max_message_bytes - 128, 0) / bytes_per_index;
    const uint64_t requested = request.max_chunk_size() == 0
                                   ? static_cast<uint64_t>(v1::DEFAULT_SHARD_CHUNK_SIZE)
                                   : request.max_chunk_size();
    const uint64_t chunk_size = std::max<uint64_t>(1, std::min<uint64_t>(requested, fits));
    // Held until the call ends: what its largest chunk costs while a slow reader holds it.
    absl::StatusOr<StreamBudget::Reservation> reserved = budget->Reserve(SamplerService::ChunkBytes(
        std::max<uint64_t>(1, std::min(chunk_size, length - request.start_offset())), wide,
        request.with_is_weights()));
    if (!reserved.ok()) return reserved.status();
    return std::unique_ptr<ShardChunks>(new ShardChunks(request, std::move(job), std::move(lease),
                                                        wide, chunk_size, *std::move(reserved),
                                                        metrics->IndicesStreamed(request.job())));
  }

  // Fills `chunk` with the next chunk.
  absl::Status Next(ComputeBackend* backend, v1::ShardChunk* chunk) {
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
    pos_ += count;
    last_count_ = count;
    started_ = true;
    chunk->set_last(pos_ == length);
    return absl::OkStatus();
  }

  // The chunk Next filled was written: counts it and records the progress. NOT_FOUND if the job
  // was deleted meanwhile with positions left (the proto promises it); shutting down
  // (UNAVAILABLE), an in-flight stream may finish within the grace period, the server cancels
  // it after.
  absl::Status Written() {
    streamed_->Increment(static_cast<double>(last_count_));
    absl::Status closed =
        job_->RecordStreamed(request_.epoch(), request_.deal(), request_.rank(), pos_);
    if (absl::IsNotFound(closed) && pos_ < lease_.shard_length) return closed;
    return absl::OkStatus();
  }

  bool done() const { return started_ && pos_ == lease_.shard_length; }

 private:
  ShardChunks(const v1::StreamShardRequest& request, std::shared_ptr<Job> job, ShardLease lease,
              bool wide, uint64_t chunk_size, StreamBudget::Reservation reserved,
              std::shared_ptr<metrics::Counter> streamed)
      : request_(request),
        job_(std::move(job)),
        lease_(std::move(lease)),
        wide_(wide),
        chunk_size_(chunk_size),
        reserved_(std::move(reserved)),
        streamed_(std::move(streamed)),
        pos_(request.start_offset()) {}

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

}  // namespace

// ---- Client-stream reactor: reads one message at a time (a pending read holds no thread), and
// hands each to its Stream on the WorkPool.
template <typename Stream>
class SamplerService::ClientStreamReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `make(caller, &response)` builds the call's Stream once its caller is known.
  template <typename Make>
  static ClientStreamReactor* Start(SamplerService* service, Method method,
                                    grpc::CallbackServerContext* context,
                                    grpc::ByteBuffer* raw_response, Make make) {
    service->BeginCall(method);
    auto* reactor = new ClientStreamReactor(service, method, raw_response);
    // The job of each message is checked by the Stream as it reads it.
    absl::StatusOr<Caller> caller = service->CallerOf(*context);
    if (!caller.ok()) {
      reactor->Finish(ToGrpcStatus(caller.status()));
      return reactor;
    }
    reactor->stream_.emplace(make(*std::move(caller), &reactor->response_));
    reactor->StartRead(&reactor->raw_);
    return reactor;
  }

  void OnReadDone(bool ok) override {
    // `this` lives until OnDone, which comes after Finish: the work below calls Finish last.
    if (ok) {
      service_->Schedule(method_, [this] {
        std::optional<grpc::Status> ended = stream_->Add(raw_);
        raw_.Clear();
        if (ended.has_value()) {
          Finish(*ended);
        } else {
          StartRead(&raw_);
        }
      });
    } else {
      service_->Schedule(method_, [this] {
        grpc::Status status = stream_->End();
        if (status.ok()) status = Serialize(response_, raw_response_);
        Finish(status);
      });
    }
  }

  void OnDone() override {
    SamplerService* const service = service_;
    const Method method = method_;
    delete this;
    service->EndCall(method);
  }

 private:
  ClientStreamReactor(SamplerService* service, Method method, grpc::ByteBuffer* raw_response)
      : service_(service), method_(method), raw_response_(raw_response) {}

  SamplerService* const service_;
  const Method method_;
  grpc::ByteBuffer* const raw_response_;
  typename Stream::Response response_;
  std::optional<Stream> stream_;
  grpc::ByteBuffer raw_;
};

// ---- StreamShard's reactor. States: waiting for the epoch (a callback registered with the job,
// no thread), then writing its chunks (one write pending at a time: memory stays at one chunk,
// as gRPC's flow control paces it), then finished. Each chunk is made on the WorkPool.
//
// Owned by itself (self_) until OnDone, and by the work and the job's callback it hands out, so
// that whichever runs last frees it.
class SamplerService::ShardStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  static ShardStreamReactor* Start(SamplerService* service, grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* raw) {
    service->BeginCall(kStreamShard);
    std::shared_ptr<ShardStreamReactor> reactor(new ShardStreamReactor(service, context));
    reactor->self_ = reactor;
    absl::Status s = reactor->Prepare(*raw);
    if (!s.ok()) {
      reactor->End(ToGrpcStatus(s));
    } else {
      // The first look at the job (which can extract a chunk) is made on the WorkPool.
      service->Schedule(kStreamShard, [reactor] { reactor->Acquire(); });
    }
    return reactor.get();
  }

  void OnCancel() override {
    std::shared_ptr<ShardStreamReactor> keep = self_;
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // Waiting: withdraw the callback (if it already ran, Acquire sees cancelled_). Writing: the
    // pending write fails, or the next chunk sees the cancellation.
    if (wait_id_ != 0 && job_->CancelWait(wait_id_)) {
      StopWaitingLocked();
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, WentAway()));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed by the client"));
      return;
    }
    if (absl::Status s = chunks_->Written(); !s.ok()) {
      End(ToGrpcStatus(s));
      return;
    }
    if (chunks_->done()) {
      End(grpc::Status::OK);
      return;
    }
    service_->Schedule(kStreamShard, [reactor = self_] { reactor->WriteNext(); });
  }

  void OnDone() override {
    if (writing_) service_->ShardStreamDone(context_);
    SamplerService* const service = service_;
    std::shared_ptr<ShardStreamReactor> last = std::move(self_);
    last.reset();  // `this` may be gone from here on.
    service->EndCall(kStreamShard);
  }

 private:
  ShardStreamReactor(SamplerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), deadline_(DeadlineOf(*context)) {}

  // Parses and checks the request, finds the job.
  absl::Status Prepare(const grpc::ByteBuffer& raw) {
    absl::StatusOr<Caller> caller = service_->CallerOf(*context_);
    if (!caller.ok()) return caller.status();
    if (absl::Status s = ParseRequest(raw, &request_); !s.ok()) return s;
    if (absl::Status s = service_->access_[kStreamShard]->Check(*caller, request_); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckStreamShardRequest(request_); !s.ok()) return s;
    absl::StatusOr<std::shared_ptr<Job>> job = service_->registry_->Get(request_.job());
    if (!job.ok()) return job.status();
    job_ = *std::move(job);
    return CheckShardClaim(*job_, request_);
  }

  // On the WorkPool: the shard if its epoch is settled (then the first chunk), else a callback
  // registered with the job to come back here.
  void Acquire() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (wait_id_ != 0) StopWaitingLocked();  // The callback ran: this is its work.
      if (cancelled_) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, WentAway()));
        return;
      }
    }
    // Never waits here: a deadline of now.
    const absl::Time now = absl::Now();
    absl::StatusOr<ShardLease> lease =
        job_->AcquireShard(request_.epoch(), request_.deal(), request_.rank(),
                           request_.world_size(), std::min(now, deadline_));
    if (absl::IsDeadlineExceeded(lease.status()) && now < deadline_) {
      Wait();
      return;
    }
    if (!lease.ok()) {
      End(ToGrpcStatus(lease.status()));
      return;
    }
    absl::StatusOr<std::unique_ptr<ShardChunks>> chunks =
        ShardChunks::Start(request_, job_, *std::move(lease), service_->max_message_bytes_,
                           &service_->stream_budget_, &service_->metrics_);
    if (!chunks.ok()) {
      End(ToGrpcStatus(chunks.status()));
      return;
    }
    chunks_ = *std::move(chunks);
    writing_ = true;
    service_->ShardStreamWriting(context_);
    WriteNext();
  }

  // Registers the callback that brings the call back to Acquire when its epoch settles.
  void Wait() {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, WentAway()));
      return;
    }
    // The callback runs on the job's watcher thread (or here, if settled meanwhile): it only
    // hands the work, and its reference, to the WorkPool (EpochWaiters::Add).
    wait_id_ = job_->OnEpochSettled(
        request_.epoch(), deadline_, [service = service_, reactor = self_]() mutable {
          service->Schedule(kStreamShard, [reactor = std::move(reactor)] { reactor->Acquire(); });
        });
    if (wait_id_ != 0) ++service_->waiting_[kStreamShard];
  }

  // On the WorkPool: makes the next chunk and writes it.
  void WriteNext() {
    if (absl::Status s = chunks_->Next(service_->backend_, &chunk_); !s.ok()) {
      End(ToGrpcStatus(s));
      return;
    }
    if (context_->IsCancelled()) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
      return;
    }
    wire_.Clear();
    if (grpc::Status s = Serialize(chunk_, &wire_); !s.ok()) {
      End(s);
      return;
    }
    StartWrite(&wire_);
  }

  std::string WentAway() const {
    return absl::StrCat("the caller went away while waiting for epoch ", request_.epoch(),
                        " of job '", request_.job(), "'");
  }

  void StopWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    wait_id_ = 0;
    --service_->waiting_[kStreamShard];
  }

  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    // The stream budget goes back before the client learns the stream ended. (Only the thread
    // that owns chunks_ now, or a call that never had one, ends the call.)
    chunks_.reset();
    Finish(status);
  }

  SamplerService* const service_;
  grpc::CallbackServerContext* const context_;
  const absl::Time deadline_;
  v1::StreamShardRequest request_;
  std::shared_ptr<Job> job_;
  // Writing: used by one thread at a time (the WorkPool's making a chunk, or gRPC's in
  // OnWriteDone), each handing over to the next.
  std::unique_ptr<ShardChunks> chunks_;
  bool writing_ = false;  // Registered with ShardStreamWriting.
  v1::ShardChunk chunk_;
  grpc::ByteBuffer wire_;  // The chunk being written.
  absl::Mutex mu_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;  // Of the job's OnEpochSettled; 0: not waiting.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ShardStreamReactor> self_;  // Until OnDone.
};

// ---- ClaimRank's reactor. The claim is taken on gRPC's thread (it only takes locks), its one
// RankClaim written, and then the call stays open with nothing pending: it costs this object,
// no thread. It ends, releasing the claim, when gRPC cancels it (the client cancelled, its
// connection closed or its keepalive failed: OnCancel), or when the job is closed (deleted:
// NOT_FOUND; shutting down: UNAVAILABLE), through the callback RankClaims holds.
//
// Owned by itself (self_) until OnDone, and by that callback while the claim is held.
class SamplerService::ClaimReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  static ClaimReactor* Start(SamplerService* service, grpc::CallbackServerContext* context,
                             const grpc::ByteBuffer* raw) {
    service->BeginCall(kClaimRank);
    std::shared_ptr<ClaimReactor> reactor(new ClaimReactor(service));
    reactor->self_ = reactor;
    if (absl::Status s = reactor->Claim(*context, *raw); !s.ok()) reactor->End(ToGrpcStatus(s));
    return reactor.get();
  }

  void OnWriteDone(bool ok) override {
    // Written: hold the call open. Not written: the client went away already.
    if (!ok) End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
  }

  void OnCancel() override {
    End(grpc::Status(grpc::StatusCode::CANCELLED, "the claim's call was cancelled"));
  }

  void OnDone() override {
    Release();  // Whatever ended the call.
    SamplerService* const service = service_;
    std::shared_ptr<ClaimReactor> last = std::move(self_);
    last.reset();  // `this` may be gone from here on.
    service->EndCall(kClaimRank);
  }

 private:
  explicit ClaimReactor(SamplerService* service) : service_(service) {}

  // Parses and checks the request, claims the rank and writes the RankClaim.
  absl::Status Claim(const grpc::CallbackServerContext& context, const grpc::ByteBuffer& raw) {
    absl::StatusOr<Caller> caller = service_->CallerOf(context);
    if (!caller.ok()) return caller.status();
    v1::ClaimRankRequest request;
    if (absl::Status s = ParseRequest(raw, &request); !s.ok()) return s;
    if (absl::Status s = service_->access_[kClaimRank]->Check(*caller, request); !s.ok()) {
      return s;
    }
    const uint32_t max_world = v1::MAX_WORLD_SIZE;
    if (request.world_size() < 1 || request.world_size() > max_world) {
      return absl::InvalidArgumentError(
          absl::StrCat("world_size = ", request.world_size(), ": must be in [1, ", max_world, "]"));
    }
    absl::StatusOr<std::shared_ptr<Job>> job = service_->registry_->Get(request.job());
    if (!job.ok()) return job.status();
    // Under mu_ until the RankClaim is written: a job closed meanwhile runs the callback, whose
    // End then waits here, and finishes the call after the write was started.
    absl::MutexLock lock(&mu_);
    absl::StatusOr<uint64_t> incarnation = (*job)->ClaimRank(
        request.rank(), request.world_size(), request.peer(),
        [reactor = self_](const absl::Status& reason) { reactor->End(ToGrpcStatus(reason)); },
        request.replaces());
    if (!incarnation.ok()) return incarnation.status();
    job_ = *std::move(job);
    rank_ = request.rank();
    incarnation_ = *incarnation;
    v1::RankClaim claim;
    claim.set_incarnation(*incarnation);
    claim.set_rank(request.rank());
    claim.set_peer(request.peer());
    if (grpc::Status s = Serialize(claim, &wire_); !s.ok()) return FromGrpcStatus(s);
    StartWrite(&wire_);
    return absl::OkStatus();
  }

  void Release() ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Job> job;
    uint32_t rank = 0;
    uint64_t incarnation = 0;
    {
      absl::MutexLock lock(&mu_);
      job = std::move(job_);
      rank = rank_;
      incarnation = std::exchange(incarnation_, 0);
    }
    if (job != nullptr && incarnation != 0) job->claims().Release(rank, incarnation);
  }

  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    Release();  // At once: the rank is free before the client learns the call ended.
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  SamplerService* const service_;
  grpc::ByteBuffer wire_;  // The RankClaim.
  absl::Mutex mu_;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  uint32_t rank_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no claim held.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ClaimReactor> self_;  // Until OnDone.
};

// ---- The service.

SamplerService::SamplerService(JobRegistry* registry, ComputeBackend* backend,
                               int max_message_bytes, uint64_t max_stream_buffer_bytes,
                               const Authorizer* authorizer, metrics::Registry* metrics,
                               int max_handler_threads)
    : registry_(registry),
      backend_(backend),
      max_message_bytes_(max_message_bytes),
      authorizer_(authorizer),
      stream_budget_(max_stream_buffer_bytes),
      metrics_(metrics),
      pool_(max_handler_threads) {
  // Every method of the .proto is served, in the order of Method.
  const google::protobuf::ServiceDescriptor& service = SamplerDescriptor();
  CHECK_EQ(service.method_count(), kMethodCount);
  for (int m = 0; m < kMethodCount; ++m) {
    CHECK_EQ(service.method(m)->name(), kMethodNames[m]);
    access_[m].emplace(MethodAccess::Of(*service.method(m)));
  }
  if (metrics == nullptr) return;
  metrics->AddGaugeCallback(
      "samplerd_calls_waiting",
      "Of the calls held, those waiting without a thread: StreamShard for its epoch's plan, and "
      "any call queued for a handler thread; by method.",
      {"method"}, [this] {
        std::vector<metrics::GaugeSample> samples;
        for (int m = 0; m < kMethodCount; ++m) {
          samples.push_back({{kMethodNames[m]}, static_cast<double>(waiting_[m].load())});
        }
        return samples;
      });
  metrics->AddGaugeCallback(
      "samplerd_rank_claims",
      "Rank claims held now (open ClaimRank calls: one per trainer process that claimed its "
      "rank, peers each), by job.",
      {"job_name"}, [this] {
        std::vector<metrics::GaugeSample> samples;
        for (const auto& job : registry_->List()) {
          samples.push_back({{job->name()}, static_cast<double>(job->claims().open())});
        }
        return samples;
      });
  auto load = [this](double (*value)(const WorkPool::Load&)) {
    return [this, value] { return std::vector<metrics::GaugeSample>{{{}, value(pool_.load())}}; };
  };
  metrics->AddGaugeCallback(
      "samplerd_handler_threads",
      "Threads started to run calls' blocking work (at most --max_server_threads).", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.threads); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_threads_busy", "Handler threads running a call's work now.", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.busy); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_queue_length", "Calls' work waiting for a handler thread.", {},
      load([](const WorkPool::Load& l) { return static_cast<double>(l.queued); }));
  metrics->AddGaugeCallback(
      "samplerd_handler_queue_oldest_seconds",
      "How long the oldest work waiting for a handler thread has waited, in seconds.", {},
      load([](const WorkPool::Load& l) { return absl::ToDoubleSeconds(l.oldest_queued); }));
  metrics
      ->AddGauge("samplerd_handler_threads_limit",
                 "Most threads that run calls' blocking work (--max_server_threads).")
      ->WithLabels({})
      ->Set(static_cast<double>(max_handler_threads));
}

SamplerService::~SamplerService() = default;

void SamplerService::BeginCall(Method) {
  absl::MutexLock lock(&calls_mu_);
  ++calls_in_flight_;
}

void SamplerService::EndCall(Method) {
  absl::MutexLock lock(&calls_mu_);
  --calls_in_flight_;
}

void SamplerService::Schedule(Method method, std::function<void()> work) {
  ++waiting_[method];
  pool_.Schedule([this, method, work = std::move(work)] {
    --waiting_[method];
    work();
  });
}

int64_t SamplerService::CallsInFlight() const {
  absl::MutexLock lock(&calls_mu_);
  return calls_in_flight_;
}

void SamplerService::ShardStreamWriting(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&calls_mu_);
  shard_streams_.insert(context);
  if (shard_streams_ended_) context->TryCancel();
}

void SamplerService::ShardStreamDone(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&calls_mu_);
  shard_streams_.erase(context);
}

void SamplerService::EndShardStreams() {
  absl::MutexLock lock(&calls_mu_);
  shard_streams_ended_ = true;
  // Under calls_mu_: a context stays registered, so alive, until its call is done.
  for (grpc::ServerContextBase* context : shard_streams_) context->TryCancel();
}

bool SamplerService::AwaitNoCalls(absl::Time deadline) const {
  absl::MutexLock lock(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return calls_in_flight_ == 0; };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

absl::StatusOr<Caller> SamplerService::CallerOf(const grpc::ServerContextBase& context) const {
  if (authorizer_ == nullptr) return Caller::Unrestricted();
  return authorizer_->Authenticate(context.client_metadata());
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* SamplerService::Unary(
    Method method, grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* raw_response, bool blocking,
    grpc::Status (SamplerService::*handler)(absl::Time, const Request&, Response*)) {
  BeginCall(method);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [this, method, reactor](const grpc::Status& status) {
    reactor->Finish(status);
    EndCall(method);
  };
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) {
    finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  auto request = std::make_shared<Request>();
  if (absl::Status s = ParseRequest(*raw, request.get()); !s.ok()) {
    finish(ToGrpcStatus(s));
    return reactor;
  }
  if (absl::Status s = access_[method]->Check(*caller, *request); !s.ok()) {
    finish(ToGrpcStatus(s));
    return reactor;
  }
  auto run = [this, handler, request, raw_response, finish, deadline = DeadlineOf(*context)] {
    Response response;
    grpc::Status status = (this->*handler)(deadline, *request, &response);
    if (status.ok()) status = Serialize(response, raw_response);
    finish(status);
  };
  if (blocking) {
    Schedule(method, std::move(run));
  } else {
    run();
  }
  return reactor;
}

// Planning, disk syncs and job teardown block: on the WorkPool. Reads of a job's state take its
// lock briefly: on gRPC's thread.
grpc::ServerUnaryReactor* SamplerService::CreateJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kCreateJob, context, request, response, true, &SamplerService::DoCreateJob);
}
grpc::ServerUnaryReactor* SamplerService::GetJob(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Unary(kGetJob, context, request, response, false, &SamplerService::DoGetJob);
}
grpc::ServerUnaryReactor* SamplerService::ListJobs(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Unary(kListJobs, context, request, response, false, &SamplerService::DoListJobs);
}
grpc::ServerUnaryReactor* SamplerService::DeleteJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kDeleteJob, context, request, response, true, &SamplerService::DoDeleteJob);
}
grpc::ServerUnaryReactor* SamplerService::RewindJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kRewindJob, context, request, response, true, &SamplerService::DoRewindJob);
}
grpc::ServerUnaryReactor* SamplerService::ResizeJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary(kResizeJob, context, request, response, true, &SamplerService::DoResizeJob);
}
grpc::ServerUnaryReactor* SamplerService::EndEpoch(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Unary(kEndEpoch, context, request, response, true, &SamplerService::DoEndEpoch);
}
grpc::ServerUnaryReactor* SamplerService::GetJobStatus(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return Unary(kGetJobStatus, context, request, response, false, &SamplerService::DoGetJobStatus);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadWeights(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<WeightsUpload>::Start(
      this, kUploadWeights, context, response, [this](Caller caller, v1::UploadSummary* summary) {
        return MakeWeightsUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadLabels(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<LabelsUpload>::Start(
      this, kUploadLabels, context, response, [this](Caller caller, v1::UploadSummary* summary) {
        return MakeLabelsUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::UploadIrreducibleLosses(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<IrreducibleLossesUpload>::Start(
      this, kUploadIrreducibleLosses, context, response,
      [this](Caller caller, v1::UploadSummary* summary) {
        return MakeIrreducibleLossesUpload(registry_, std::move(caller), summary);
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* SamplerService::ReportLosses(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ClientStreamReactor<LossStream>::Start(
      this, kReportLosses, context, response,
      [this](Caller caller, v1::LossReportSummary* summary) {
        return LossStream(registry_, &metrics_, std::move(caller), summary);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SamplerService::StreamShard(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ShardStreamReactor::Start(this, context, request);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SamplerService::ClaimRank(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ClaimReactor::Start(this, context, request);
}

// ---- The network-free cores.

grpc::Status SamplerService::UploadWeightsImpl(
    grpc::ServerReaderInterface<grpc::ByteBuffer>* reader, v1::UploadSummary* response,
    const Caller& caller) {
  WeightsUpload stream = MakeWeightsUpload(registry_, caller, response);
  return ReadAll(reader, stream);
}

grpc::Status SamplerService::UploadLabelsImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                              v1::UploadSummary* response, const Caller& caller) {
  LabelsUpload stream = MakeLabelsUpload(registry_, caller, response);
  return ReadAll(reader, stream);
}

grpc::Status SamplerService::ReportLossesImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                              v1::LossReportSummary* response,
                                              const Caller& caller) {
  LossStream stream(registry_, &metrics_, caller, response);
  return ReadAll(reader, stream);
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
  if (absl::Status s = CheckStreamShardRequest(request); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = CheckShardClaim(**job, request); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<ShardLease> lease = (*job)->AcquireShard(
      request.epoch(), request.deal(), request.rank(), request.world_size(), deadline, cancelled);
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  absl::StatusOr<std::unique_ptr<ShardChunks>> chunks = ShardChunks::Start(
      request, *job, *std::move(lease), max_message_bytes_, &stream_budget_, &metrics_);
  if (!chunks.ok()) return ToGrpcStatus(chunks.status());
  if (writing) writing();
  v1::ShardChunk chunk;
  do {
    if (absl::Status s = (*chunks)->Next(backend_, &chunk); !s.ok()) return ToGrpcStatus(s);
    if (cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    // A blocking Write: it waits for flow control, so memory stays at one chunk.
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed by the client");
    }
    if (absl::Status s = (*chunks)->Written(); !s.ok()) return ToGrpcStatus(s);
  } while (!(*chunks)->done());
  return grpc::Status::OK;
}

// ---- The unary methods.

grpc::Status SamplerService::DoCreateJob(absl::Time deadline, const v1::CreateJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job =
      registry_->Create(request.name(), request.spec(), deadline, request.resume());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoGetJob(absl::Time, const v1::GetJobRequest& request,
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

grpc::Status SamplerService::DoListJobs(absl::Time, const v1::ListJobsRequest&,
                                        v1::ListJobsResponse* response) {
  for (const auto& job : registry_->List()) *response->add_jobs() = job->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoDeleteJob(absl::Time, const v1::DeleteJobRequest& request,
                                         v1::DeleteJobResponse*) {
  absl::Status deleted = registry_->Delete(request.name());
  if (!absl::IsNotFound(deleted)) metrics_.ForgetJob(request.name());
  return ToGrpcStatus(deleted);
}

grpc::Status SamplerService::DoRewindJob(absl::Time, const v1::RewindJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = (*job)->Rewind(request.epoch()); !s.ok()) return ToGrpcStatus(s);
  *response = (*job)->Describe();
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoResizeJob(absl::Time, const v1::ResizeJobRequest& request,
                                         v1::Job* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<v1::Job> resized = (*job)->Resize(request.epoch(), request.world_size());
  if (!resized.ok()) return ToGrpcStatus(resized.status());
  *response = *std::move(resized);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoEndEpoch(absl::Time, const v1::EndEpochRequest& request,
                                        v1::EndEpochResponse* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = (*job)->claims().Check(request.rank(), request.incarnation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::EndEpochResponse> r =
      (*job)->EndEpoch(request.epoch(), request.deal(), request.rank());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status SamplerService::DoGetJobStatus(absl::Time, const v1::GetJobStatusRequest& request,
                                            v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Get(request.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = (*job)->Status();
  return grpc::Status::OK;
}

}  // namespace samplerd
