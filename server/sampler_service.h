// SamplerService: the gRPC adapter of samplerd.v1.Sampler (see proto/samplerd.proto for every
// RPC's contract). It checks the shape of each request, looks the job up in the JobRegistry,
// calls the core and converts the status. Its only state is the count of calls in its handlers,
// which Server::Shutdown waits on.
//
// Thread-safe: gRPC runs the handlers concurrently, and CallsInFlight / AwaitNoCalls may be
// called from any thread.
//
// Streaming handlers are split into *Impl methods taking the grpc::Server{Reader,Writer}Interface
// so that tests can drive them without a network.
#ifndef SAMPLERD_SERVER_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVER_SAMPLER_SERVICE_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/job_registry.h"

namespace samplerd {

class SamplerService final : public v1::Sampler::Service {
 public:
  // Default and largest number of indices per ShardChunk.
  static constexpr uint32_t kDefaultChunk = 1 << 16;
  static constexpr uint32_t kMaxChunk = 1 << 20;

  // `registry` and `backend` must outlive the service. `max_message_bytes` is the server's send
  // limit: shard chunks are made small enough to fit it whatever max_chunk_size asks for.
  SamplerService(JobRegistry* registry, ComputeBackend* backend, int max_message_bytes = 64 << 20);

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status UploadWeights(grpc::ServerContext* context,
                             grpc::ServerReader<v1::UploadWeightsChunk>* reader,
                             v1::UploadSummary* response) override;
  grpc::Status UploadLabels(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadLabelsChunk>* reader,
                            v1::UploadSummary* response) override;
  grpc::Status StreamShard(grpc::ServerContext* context, const v1::StreamShardRequest* request,
                           grpc::ServerWriter<v1::ShardChunk>* writer) override;
  grpc::Status ReportLosses(grpc::ServerContext* context, grpc::ServerReader<v1::LossBatch>* reader,
                            v1::LossReportSummary* response) override;
  grpc::Status EndEpoch(grpc::ServerContext* context, const v1::EndEpochRequest* request,
                        v1::EndEpochResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context, const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;

  // Network-free cores of the streaming handlers. `deadline` bounds waiting for a plan;
  // `cancelled` is polled while waiting and between chunks. A stream whose job is deleted ends
  // with NOT_FOUND at the next chunk; on shutdown (UNAVAILABLE) a stream already writing is let
  // finish within the grace period.
  grpc::Status StreamShardImpl(const v1::StreamShardRequest& request, absl::Time deadline,
                               const std::function<bool()>& cancelled,
                               grpc::ServerWriterInterface<v1::ShardChunk>* writer);
  grpc::Status ReportLossesImpl(grpc::ServerReaderInterface<v1::LossBatch>* reader,
                                v1::LossReportSummary* response);

  // Calls running in this service's handlers now.
  int64_t CallsInFlight() const ABSL_LOCKS_EXCLUDED(calls_mu_);
  // Waits until no call runs in the handlers or `deadline` passes; true if none runs. Used by a
  // graceful shutdown: gRPC's own Shutdown(deadline) also waits for idle client connections to
  // close, so it would always take the whole grace period while trainers stay connected.
  bool AwaitNoCalls(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(calls_mu_);

 private:
  // Counts a handler invocation for its lifetime.
  class CallScope {
   public:
    explicit CallScope(SamplerService* service);
    ~CallScope();

   private:
    SamplerService* const service_;
  };

  JobRegistry* const registry_;
  ComputeBackend* const backend_;
  const int max_message_bytes_;
  mutable absl::Mutex calls_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SAMPLER_SERVICE_H_
