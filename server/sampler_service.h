// SamplerService: the gRPC adapter of samplerd.v1.Sampler (see proto/samplerd.proto for every
// RPC's contract). It parses each request, checks its shape, looks the job up in the JobRegistry,
// calls the core and converts the status. Its state: the count of calls in its handlers, which
// Server::Shutdown waits on, and the budget of the bytes that open StreamShard calls buffer.
//
// Requests arrive as raw bytes: the service registers the ten methods of samplerd.v1.Sampler
// itself (names and kinds checked against the .proto's descriptor at construction) with
// grpc::ByteBuffer requests, and parses them with server/raw_request.h, so that a request that
// does not parse is INVALID_ARGUMENT with a message (see raw_request.h for what gRPC's generated
// handlers do instead). Responses are the generated messages.
//
// Thread-safe: gRPC runs the handlers concurrently, and CallsInFlight / AwaitNoCalls /
// EndShardStreams may be called from any thread.
//
// Streaming handlers are split into *Impl methods taking the grpc::Server{Reader,Writer}Interface
// so that tests can drive them without a network.
#ifndef SAMPLERD_SERVER_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVER_SAMPLER_SERVICE_H_

#include <cstdint>
#include <functional>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.pb.h"
#include "server/auth/authorizer.h"
#include "server/job_registry.h"
#include "server/metrics/registry.h"
#include "server/service_metrics.h"
#include "server/stream_budget.h"

namespace samplerd {

class SamplerService final : public grpc::Service {
 public:
  // `registry` and `backend` must outlive the service. `max_message_bytes` is the server's send
  // limit: shard chunks are made small enough to fit it whatever max_chunk_size asks for.
  // `max_stream_buffer_bytes` bounds the chunk bytes all open StreamShard calls hold together
  // (see StreamBudget and StreamShardImpl). `authorizer`, if not null, must outlive the service:
  // every call then needs a bearer token that grants it (server/auth/authorizer.h), checked
  // before anything else happens; null: no token checks. The per-job counters (ServiceMetrics)
  // go to `metrics` (which must outlive the service); with nullptr they are kept but not
  // exported.
  SamplerService(JobRegistry* registry, ComputeBackend* backend, int max_message_bytes = 64 << 20,
                 uint64_t max_stream_buffer_bytes = kDefaultMaxStreamBufferBytes,
                 const Authorizer* authorizer = nullptr, metrics::Registry* metrics = nullptr);

  // The unary RPCs, given their parsed request.
  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest& request,
                         v1::Job* response);
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest& request,
                      v1::Job* response);
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest& request,
                        v1::ListJobsResponse* response);
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest& request,
                         v1::DeleteJobResponse* response);
  grpc::Status RewindJob(grpc::ServerContext* context, const v1::RewindJobRequest& request,
                         v1::Job* response);
  grpc::Status ResizeJob(grpc::ServerContext* context, const v1::ResizeJobRequest& request,
                         v1::Job* response);
  grpc::Status EndEpoch(grpc::ServerContext* context, const v1::EndEpochRequest& request,
                        v1::EndEpochResponse* response);
  grpc::Status GetJobStatus(grpc::ServerContext* context, const v1::GetJobStatusRequest& request,
                            v1::JobStatus* response);

  // Network-free cores of the streaming handlers. Client streams read raw messages and parse
  // them one by one: a message that does not parse ends the call with INVALID_ARGUMENT naming
  // its position (uploads apply nothing; ReportLosses keeps the batches before it, made
  // durable first). ReportLossesImpl counts the batches it processed in response->batches().
  // Each message's job must be one `caller` may use (PERMISSION_DENIED otherwise, with the same
  // effect as a message that does not parse); the default is a server without tokens.
  grpc::Status UploadWeightsImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                 v1::UploadSummary* response,
                                 const Caller& caller = Caller::Unrestricted());
  grpc::Status UploadLabelsImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                v1::UploadSummary* response,
                                const Caller& caller = Caller::Unrestricted());
  grpc::Status ReportLossesImpl(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader,
                                v1::LossReportSummary* response,
                                const Caller& caller = Caller::Unrestricted());
  // `deadline` bounds waiting for a plan; `cancelled` is polled while waiting and between
  // chunks; `writing` (may be null) is called once the shard is acquired, before the first
  // chunk is written (the gRPC handler then lets EndShardStreams cancel the call: a stream
  // still waiting ends with the shutdown's UNAVAILABLE instead). A stream whose job is deleted
  // ends with NOT_FOUND at the next chunk. Before it
  // writes, a call reserves the bytes of its largest chunk from the stream budget (ChunkBytes)
  // until it ends; RESOURCE_EXHAUSTED if they do not fit.
  grpc::Status StreamShardImpl(const v1::StreamShardRequest& request, absl::Time deadline,
                               const std::function<bool()>& cancelled,
                               grpc::ServerWriterInterface<v1::ShardChunk>* writer,
                               const std::function<void()>& writing = nullptr);

  // Bytes a StreamShard call holds while one chunk of `indices` indices is in flight: the
  // extracted indices (8 bytes each), the ShardChunk message, and gRPC's serialized copy of it
  // until the reader takes it.
  static uint64_t ChunkBytes(uint64_t indices, bool wide_indices, bool with_is_weights);

  // Calls running in this service's handlers now.
  int64_t CallsInFlight() const ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Waits until no call runs in the handlers or `deadline` passes; true if none runs. Used by a
  // graceful shutdown: gRPC's own Shutdown(deadline) also waits for idle client connections to
  // close, so it would always take the whole grace period while trainers stay connected.
  bool AwaitNoCalls(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Cancels every StreamShard call writing its shard now, and each one that starts writing
  // later, at once (a graceful shutdown; the calls still waiting for a plan are woken with
  // UNAVAILABLE by JobRegistry::CloseAll). Unlike the other calls, a shard stream need not be let
  // finish: every client reopens it at its next position, on the restarted server. Letting it
  // finish held the shutdown for as long as a trainer took to consume its shard (the whole grace
  // period), while that trainer's loss reports were refused and their retries ran out.
  void EndShardStreams() ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Bytes reserved by open StreamShard calls now.
  uint64_t StreamBufferBytesInUse() const { return stream_budget_.in_use(); }

 private:
  // Counts a handler invocation for its lifetime.
  class CallScope {
   public:
    explicit CallScope(SamplerService* service);
    ~CallScope();

   private:
    SamplerService* const service_;
  };

  // A StreamShard call's context, registered from Writing() until the handler returns, for
  // EndShardStreams to cancel. Not thread-safe: the handler's thread uses it.
  class ShardStreamScope {
   public:
    ShardStreamScope(SamplerService* service, grpc::ServerContext* context)
        : service_(service), context_(context) {}
    ~ShardStreamScope();
    // The call writes its shard from now on (cancelled at once if EndShardStreams ran).
    void Writing();

   private:
    SamplerService* const service_;
    grpc::ServerContext* const context_;
    bool registered_ = false;
  };

  // Register one method of samplerd.v1.Sampler (`path`, e.g. "/samplerd.v1.Sampler/GetJob",
  // a string literal: gRPC keeps the pointer) with a raw request.
  template <typename Request, typename Response>
  void AddUnary(const char* path,
                grpc::Status (SamplerService::*handler)(grpc::ServerContext*, const Request&,
                                                        Response*));
  template <typename Response>
  void AddClientStream(const char* path, grpc::Status (SamplerService::*impl)(
                                             grpc::ServerReaderInterface<grpc::ByteBuffer>*,
                                             Response*, const Caller&));

  // Who the call is from: UNAUTHENTICATED without a valid bearer token when the server has
  // tokens; an unrestricted Caller when it has none.
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContext& context) const;

  JobRegistry* const registry_;
  ComputeBackend* const backend_;
  const int max_message_bytes_;
  const Authorizer* const authorizer_;  // Null: no token checks.
  StreamBudget stream_budget_;
  ServiceMetrics metrics_;
  mutable absl::Mutex calls_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
  // The contexts of the StreamShard calls writing their shards (live while registered).
  std::set<grpc::ServerContext*> shard_streams_ ABSL_GUARDED_BY(calls_mu_);
  // Set by EndShardStreams: a StreamShard call that starts later is cancelled at once.
  bool shard_streams_ended_ ABSL_GUARDED_BY(calls_mu_) = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SAMPLER_SERVICE_H_
