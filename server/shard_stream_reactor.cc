#include "server/shard_stream_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/retry_signal.h"
#include "proto/status_util.h"
#include "server/raw_request.h"

namespace samplerd {

ShardStreamReactor* ShardStreamReactor::Start(const Shared& shared,
                                              grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* raw) {
  shared.calls->Begin(kStreamShard);
  std::shared_ptr<ShardStreamReactor> reactor(new ShardStreamReactor(shared, context));
  reactor->self_ = reactor;
  absl::Status s = reactor->Prepare(*raw);
  if (!s.ok()) {
    reactor->End(ToGrpcStatus(s));
  } else {
    // The first look at the job (which can extract a chunk) is made on the WorkPool.
    shared.calls->Schedule(kStreamShard, [reactor] { reactor->Acquire(); });
  }
  return reactor.get();
}

ShardStreamReactor::ShardStreamReactor(const Shared& shared, grpc::CallbackServerContext* context)
    : shared_(shared), context_(context), deadline_(DeadlineOf(*context)) {}

void ShardStreamReactor::OnCancel() {
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

void ShardStreamReactor::OnWriteDone(bool ok) {
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
  shared_.calls->Schedule(kStreamShard, [reactor = self_] { reactor->WriteNext(); });
}

void ShardStreamReactor::OnDone() {
  if (writing_) shared_.calls->ShardStreamDone(context_);
  ServiceCalls* const calls = shared_.calls;
  std::shared_ptr<ShardStreamReactor> last = std::move(self_);
  last.reset();  // `this` may be gone from here on.
  calls->End(kStreamShard);
}

absl::Status ShardStreamReactor::Prepare(const grpc::ByteBuffer& raw) {
  absl::StatusOr<Caller> caller = shared_.gate->CallerOf(*context_);
  if (!caller.ok()) return caller.status();
  if (absl::Status s = ParseRequest(raw, &request_); !s.ok()) return s;
  if (absl::Status s = shared_.gate->Check(kStreamShard, *caller, request_); !s.ok()) return s;
  if (absl::Status s = CheckStreamShardRequest(request_); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<Job>> job = shared_.registry->Get(request_.job());
  if (!job.ok()) return job.status();
  job_ = *std::move(job);
  return absl::OkStatus();
}

void ShardStreamReactor::Acquire() {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (wait_id_ != 0) StopWaitingLocked();  // The callback ran: this is its work.
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, WentAway()));
      return;
    }
  }
  absl::StatusOr<ShardLease> lease =
      job_->AcquireShard(request_.epoch(), request_.deal(), request_.rank(),
                         request_.world_size(), ShardCaller{request_.incarnation(),
                                                            request_.observe()});
  // Not served yet: wait for it until the call's deadline (which ends it with that status).
  if (absl::IsDeadlineExceeded(lease.status()) && absl::Now() < deadline_) {
    Wait();
    return;
  }
  if (!lease.ok()) {
    End(ToGrpcStatus(lease.status()));
    return;
  }
  absl::StatusOr<std::unique_ptr<ShardChunks>> chunks =
      ShardChunks::Start(request_, job_, *std::move(lease), shared_.max_message_bytes,
                         shared_.budget, shared_.metrics);
  if (!chunks.ok()) {
    // The stream buffer budget's "retry later" carries its machine-readable signal.
    AddRetryAfterTrailer(chunks.status(), context_);
    End(ToGrpcStatus(chunks.status()));
    return;
  }
  chunks_ = *std::move(chunks);
  writing_ = true;
  shared_.calls->ShardStreamWriting(context_);
  WriteNext();
}

void ShardStreamReactor::Wait() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, WentAway()));
    return;
  }
  // The callback runs on the job's watcher thread (or here, if settled meanwhile): it only
  // hands the work, and its reference, to the WorkPool (EpochWaiters::Add).
  wait_id_ = job_->OnEpochSettled(
      request_.epoch(), deadline_, [calls = shared_.calls, reactor = self_]() mutable {
        calls->Schedule(kStreamShard, [reactor = std::move(reactor)] { reactor->Acquire(); });
      });
  if (wait_id_ != 0) shared_.calls->StartWaiting(kStreamShard);
}

void ShardStreamReactor::WriteNext() {
  if (absl::Status s = chunks_->Next(shared_.backend, &chunk_); !s.ok()) {
    End(ToGrpcStatus(s));
    return;
  }
  if (context_->IsCancelled()) {
    End(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
    return;
  }
  wire_.Clear();
  if (grpc::Status s = SerializeResponse(chunk_, &wire_); !s.ok()) {
    End(s);
    return;
  }
  StartWrite(&wire_);
}

std::string ShardStreamReactor::WentAway() const {
  return absl::StrCat("the caller went away while waiting for epoch ", request_.epoch(),
                      " of job '", request_.job(), "'");
}

void ShardStreamReactor::StopWaitingLocked() {
  wait_id_ = 0;
  shared_.calls->StopWaiting(kStreamShard);
}

void ShardStreamReactor::End(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  FinishLocked(status);
}

void ShardStreamReactor::FinishLocked(const grpc::Status& status) {
  if (finished_) return;
  finished_ = true;
  // The stream budget goes back before the client learns the stream ended. (Only the thread
  // that owns chunks_ now, or a call that never had one, ends the call.)
  chunks_.reset();
  Finish(status);
}

}  // namespace samplerd
