// ServiceCalls: the calls a SamplerService holds, and the threads their blocking work runs on.
// Each call is counted from its arrival until its status is sent (Server::Shutdown waits for
// them: AwaitNoCalls); the calls waiting without a thread are counted per method (a StreamShard
// waiting for its epoch's plan, any call whose work is queued for the WorkPool); the shard
// streams writing now are registered, so that a graceful shutdown can end them (EndShardStreams).
//
// Thread-safe: the reactors call it from gRPC's threads and the WorkPool's.
#ifndef SAMPLERD_SERVER_SERVICE_CALLS_H_
#define SAMPLERD_SERVER_SERVICE_CALLS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/method_gate.h"
#include "server/work_pool.h"

namespace samplerd {

// The call's deadline (InfiniteFuture for a call without one).
absl::Time DeadlineOf(const grpc::ServerContextBase& context);

class ServiceCalls {
 public:
  // `max_handler_threads` (>= 1) bounds the WorkPool.
  explicit ServiceCalls(int max_handler_threads) : pool_(max_handler_threads) {}

  // A call of `method` arrived / its status was sent.
  void Begin(SamplerMethod method) ABSL_LOCKS_EXCLUDED(mu_);
  void End(SamplerMethod method) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls held now (from their arrival until their status is sent).
  int64_t InFlight() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no call is held or `deadline` passes; true if none is.
  bool AwaitNone(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `work` on the WorkPool, counting `method`'s call as waiting while it is queued.
  void Schedule(SamplerMethod method, std::function<void()> work);
  // A call of `method` starts / stops waiting without a thread (not queued: e.g. a StreamShard
  // waiting for its epoch's plan).
  void StartWaiting(SamplerMethod method) { ++waiting_[method]; }
  void StopWaiting(SamplerMethod method) { --waiting_[method]; }
  // Calls of `method` waiting now without a thread.
  int64_t Waiting(SamplerMethod method) const { return waiting_[method].load(); }
  // The WorkPool's threads and queue now.
  WorkPool::Load load() const { return pool_.load(); }

  // The shard streams writing now. Writing registers `context` (cancelled at once if
  // EndShardStreams ran); Done unregisters it, before its call is done.
  void ShardStreamWriting(grpc::ServerContextBase* context) ABSL_LOCKS_EXCLUDED(mu_);
  void ShardStreamDone(grpc::ServerContextBase* context) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels every shard stream writing now, and each one that starts writing later.
  void EndShardStreams() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::array<std::atomic<int64_t>, kMethodCount> waiting_{};
  mutable absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // The contexts of the StreamShard calls writing their shards (live while registered).
  std::set<grpc::ServerContextBase*> shard_streams_ ABSL_GUARDED_BY(mu_);
  // Set by EndShardStreams: a StreamShard call that starts later is cancelled at once.
  bool shard_streams_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Last: destroyed first, so that the work it still runs finds the rest.
  WorkPool pool_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SERVICE_CALLS_H_
