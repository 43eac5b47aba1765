// ShardStreamReactor: the callback reactor of StreamShard. States: waiting for the epoch (a
// callback registered with the job, Job::OnEpochSettled: no thread), then writing its chunks
// (ShardChunks; one write pending at a time: memory stays at one chunk, as gRPC's flow control
// paces it), then finished. Each chunk is made on the WorkPool.
//
// The request is parsed and checked on gRPC's thread (the token and the method's access rule:
// MethodGate; max_chunk_size; the job exists); the shard is acquired on the WorkPool
// (Job::AcquireShard, which checks the rank's claim). A call that waits past its deadline ends
// with DEADLINE_EXCEEDED naming what the epoch waits for; a caller that goes away while waiting
// withdraws its callback (CANCELLED). A call writing its shard is registered with ServiceCalls
// (EndShardStreams cancels it).
//
// Owned by itself (self_) until OnDone, and by the work and the job's callback it hands out, so
// that whichever runs last frees it.
#ifndef SAMPLERD_SERVER_SHARD_STREAM_REACTOR_H_
#define SAMPLERD_SERVER_SHARD_STREAM_REACTOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/method_gate.h"
#include "server/service_calls.h"
#include "server/service_metrics.h"
#include "server/shard_chunks.h"
#include "server/stream_budget.h"

namespace samplerd {

class ShardStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // What the calls share, owned by the service (which outlives them).
  struct Shared {
    ServiceCalls* calls;
    const MethodGate* gate;
    JobRegistry* registry;
    ComputeBackend* backend;
    int max_message_bytes;  // The server's send limit: chunks are cut to fit it.
    StreamBudget* budget;   // Bounds the chunk bytes all open calls hold together.
    ServiceMetrics* metrics;
  };

  // Starts a StreamShard call of `request` (raw).
  static ShardStreamReactor* Start(const Shared& shared, grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* raw);

  void OnCancel() override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  ShardStreamReactor(const Shared& shared, grpc::CallbackServerContext* context);

  // Parses and checks the request, finds the job.
  absl::Status Prepare(const grpc::ByteBuffer& raw);
  // On the WorkPool: the shard if its epoch is settled (then the first chunk), else a callback
  // registered with the job to come back here.
  void Acquire();
  // Registers the callback that brings the call back to Acquire when its epoch settles.
  void Wait();
  // On the WorkPool: makes the next chunk and writes it.
  void WriteNext();

  std::string WentAway() const;
  void StopWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Shared shared_;
  grpc::CallbackServerContext* const context_;
  const absl::Time deadline_;
  v1::StreamShardRequest request_;
  std::shared_ptr<Job> job_;
  // Writing: used by one thread at a time (the WorkPool's making a chunk, or gRPC's in
  // OnWriteDone), each handing over to the next.
  std::unique_ptr<ShardChunks> chunks_;
  bool writing_ = false;  // Registered with ServiceCalls::ShardStreamWriting.
  v1::ShardChunk chunk_;
  grpc::ByteBuffer wire_;  // The chunk being written.
  absl::Mutex mu_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;  // Of the job's OnEpochSettled; 0: not waiting.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ShardStreamReactor> self_;  // Until OnDone.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SHARD_STREAM_REACTOR_H_
