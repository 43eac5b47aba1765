// SamplerService: the gRPC adapter of samplerd.v1.Sampler (see proto/samplerd.proto for every
// RPC's contract). It parses each request, checks its shape, looks the job up in the JobRegistry,
// calls the core and converts the status. Its state: the calls it holds (counted per method;
// Server::Shutdown waits for them), the budget of the bytes that open StreamShard calls buffer,
// and the WorkPool that runs the calls' blocking work.
//
// All thirteen methods of samplerd.v1.Sampler are served with gRPC's callback API, through the
// generated service's raw methods (v1::Sampler::WithRawCallbackMethod_*): requests arrive as
// grpc::ByteBuffer and are parsed with server/raw_request.h, so that a request that does not
// parse is INVALID_ARGUMENT with a message (see raw_request.h for what gRPC's generated handlers
// do instead); responses are the generated messages, serialized here.
//
// Threads. No call holds a thread while it waits: a StreamShard waiting for its epoch's plan is
// a callback registered with the job (Job::OnEpochSettled), a client stream between two messages
// and a shard stream waiting for its reader's flow control are pending reads and writes. So the
// ranks waiting at an epoch boundary cost memory, not threads, and the EndEpoch calls that open
// the next epoch always run (a thread per waiting call ran out at ~1,000 ranks: issue 22); an
// open ClaimRank call (a rank's claim, held for a trainer's life) is a reactor with nothing
// pending, ended by its cancellation or by the job's close (RankClaims::Close). Work
// that blocks (planning an upload, a rewind or a resize, creating and deleting jobs, a loss batch
// applied, the disk syncs of EndEpoch and ReportLosses, extracting a shard's chunk) runs on the
// WorkPool (at most `max_handler_threads`); the cheap reads (GetJob, ListJobs, GetJobStatus) run
// on gRPC's callback thread.
//
// Thread-safe: gRPC runs the reactions concurrently, and CallsInFlight / AwaitNoCalls /
// EndShardStreams may be called from any thread.
//
// Its parts: who may call which method (method_gate.h), the calls held (service_calls.h), the
// unary methods (here), the client streams (client_streams.h, run by client_stream_reactor.h),
// StreamShard (shard_stream_reactor.h, its chunks in shard_chunks.h) and ClaimRank
// (claim_reactor.h). Tests drive them through a real gRPC server (server/testing/
// in_process_service.h, or Server on port 0).
#ifndef SAMPLERD_SERVER_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVER_SAMPLER_SERVICE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.grpc.pb.h"
#include "proto/samplerd.pb.h"
#include "server/auth/authorizer.h"
#include "server/job_registry.h"
#include "server/method_gate.h"
#include "server/metrics/registry.h"
#include "server/service_calls.h"
#include "server/service_metrics.h"
#include "server/stream_budget.h"
#include "server/work_pool.h"

namespace samplerd {

// The generated service with every method raw and served by callbacks.
using SamplerCallbackServiceBase = v1::Sampler::WithRawCallbackMethod_CreateJob<
    v1::Sampler::WithRawCallbackMethod_GetJob<v1::Sampler::WithRawCallbackMethod_ListJobs<
        v1::Sampler::WithRawCallbackMethod_DeleteJob<v1::Sampler::WithRawCallbackMethod_RewindJob<
            v1::Sampler::WithRawCallbackMethod_ResizeJob<
                v1::Sampler::WithRawCallbackMethod_UploadWeights<
                    v1::Sampler::WithRawCallbackMethod_UploadLabels<
                        v1::Sampler::WithRawCallbackMethod_StreamShard<
                            v1::Sampler::WithRawCallbackMethod_ReportLosses<
                                v1::Sampler::WithRawCallbackMethod_EndEpoch<
                                    v1::Sampler::WithRawCallbackMethod_GetJobStatus<
                                        v1::Sampler::WithRawCallbackMethod_ClaimRank<
                                            v1::Sampler::WithRawCallbackMethod_UploadIrreducibleLosses<
                                                v1::Sampler::WithRawCallbackMethod_SetGroupWeights<
                                                    v1::Sampler::Service>>>>>>>>>>>>>>>;

// Default of --max_server_threads / Options::max_server_threads: the WorkPool's threads.
inline constexpr int kDefaultMaxHandlerThreads = 1024;

class SamplerService final : public SamplerCallbackServiceBase {
 public:
  // `registry` and `backend` must outlive the service. `max_message_bytes` is the server's send
  // limit: shard chunks are made small enough to fit it whatever max_chunk_size asks for.
  // `max_stream_buffer_bytes` bounds the chunk bytes all open StreamShard calls hold together
  // (see StreamBudget and ShardChunks). `authorizer`, if not null, must outlive the service:
  // every call then needs a bearer token that grants it (server/auth/authorizer.h), checked
  // before anything else happens; null: no token checks. The per-job counters (ServiceMetrics),
  // the waiting calls per method and the WorkPool's load go to `metrics` (which must outlive the
  // service); with nullptr they are kept but not exported. `max_handler_threads` (>= 1) bounds the
  // WorkPool.
  SamplerService(JobRegistry* registry, ComputeBackend* backend, int max_message_bytes = 64 << 20,
                 uint64_t max_stream_buffer_bytes = kDefaultMaxStreamBufferBytes,
                 const Authorizer* authorizer = nullptr, metrics::Registry* metrics = nullptr,
                 int max_handler_threads = kDefaultMaxHandlerThreads);
  ~SamplerService() override;

  // ---- The methods as gRPC calls them (see the class comment).
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RewindJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ResizeJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadWeights(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadLabels(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadIrreducibleLosses(
      grpc::CallbackServerContext* context, grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* StreamShard(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ReportLosses(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* EndEpoch(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJobStatus(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ClaimRank(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* SetGroupWeights(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

  // Calls this service holds now (from their arrival until their status is sent).
  int64_t CallsInFlight() const { return calls_.InFlight(); }
  // Waits until no call is held or `deadline` passes; true if none is. Used by a graceful
  // shutdown: gRPC's own Shutdown(deadline) also waits for idle client connections to close, so
  // it would always take the whole grace period while trainers stay connected.
  bool AwaitNoCalls(absl::Time deadline) const { return calls_.AwaitNone(deadline); }
  // Cancels every StreamShard call writing its shard now, and each one that starts writing
  // later, at once (a graceful shutdown; the calls still waiting for a plan are woken with
  // UNAVAILABLE by JobRegistry::CloseAll). Unlike the other calls, a shard stream need not be let
  // finish: every client reopens it at its next position, on the restarted server. Letting it
  // finish held the shutdown for as long as a trainer took to consume its shard (the whole grace
  // period), while that trainer's loss reports were refused and their retries ran out.
  void EndShardStreams() { calls_.EndShardStreams(); }
  // Bytes reserved by open StreamShard calls now (see ShardChunks).
  uint64_t StreamBufferBytesInUse() const { return stream_budget_.in_use(); }
  // The WorkPool's threads and queue now.
  WorkPool::Load HandlerLoad() const { return calls_.load(); }

  // Calls of `method` waiting now without a thread: StreamShard for its epoch's plan, and any
  // call whose work is queued for a WorkPool thread. (The calls held, waiting or not, are
  // samplerd_rpcs_in_flight, counted by the metrics interceptor.)
  int64_t CallsWaiting(SamplerMethod method) const { return calls_.Waiting(method); }

 private:
  // Serves a unary method: the request parsed and checked (token, access) on gRPC's thread, then
  // `handler` run there (`blocking` false) or on the WorkPool.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Unary(
      SamplerMethod method, grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
      grpc::ByteBuffer* raw_response, bool blocking,
      grpc::Status (SamplerService::*handler)(absl::Time deadline, const Request&, Response*));

  // The unary methods, given their parsed request and the call's deadline.
  grpc::Status DoCreateJob(absl::Time deadline, const v1::CreateJobRequest& request,
                           v1::Job* response);
  grpc::Status DoGetJob(absl::Time, const v1::GetJobRequest& request, v1::Job* response);
  grpc::Status DoListJobs(absl::Time, const v1::ListJobsRequest& request,
                          v1::ListJobsResponse* response);
  grpc::Status DoDeleteJob(absl::Time, const v1::DeleteJobRequest& request,
                           v1::DeleteJobResponse* response);
  grpc::Status DoRewindJob(absl::Time, const v1::RewindJobRequest& request, v1::Job* response);
  grpc::Status DoResizeJob(absl::Time, const v1::ResizeJobRequest& request, v1::Job* response);
  grpc::Status DoSetGroupWeights(absl::Time, const v1::SetGroupWeightsRequest& request,
                                 v1::Job* response);
  grpc::Status DoEndEpoch(absl::Time, const v1::EndEpochRequest& request,
                          v1::EndEpochResponse* response);
  grpc::Status DoGetJobStatus(absl::Time, const v1::GetJobStatusRequest& request,
                              v1::JobStatus* response);

  JobRegistry* const registry_;
  ComputeBackend* const backend_;
  const int max_message_bytes_;
  StreamBudget stream_budget_;
  ServiceMetrics metrics_;
  const MethodGate gate_;
  // Last: destroyed first (its WorkPool), so that the work it still runs finds the rest.
  ServiceCalls calls_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SAMPLER_SERVICE_H_
