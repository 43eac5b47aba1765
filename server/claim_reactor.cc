#include "server/claim_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/samplerd.pb.h"
#include "proto/status_util.h"
#include "server/raw_request.h"

namespace samplerd {

ClaimReactor* ClaimReactor::Start(ServiceCalls* calls, const MethodGate* gate,
                                  JobRegistry* registry, grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* raw) {
  calls->Begin(kClaimRank);
  std::shared_ptr<ClaimReactor> reactor(new ClaimReactor(calls));
  reactor->self_ = reactor;
  if (absl::Status s = reactor->Claim(*gate, *registry, *context, *raw); !s.ok()) {
    reactor->End(ToGrpcStatus(s));
  }
  return reactor.get();
}

void ClaimReactor::OnWriteDone(bool ok) {
  // Written: hold the call open. Not written: the client went away already.
  if (!ok) End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
}

void ClaimReactor::OnCancel() {
  End(grpc::Status(grpc::StatusCode::CANCELLED, "the claim's call was cancelled"));
}

void ClaimReactor::OnDone() {
  Release();  // Whatever ended the call.
  ServiceCalls* const calls = calls_;
  std::shared_ptr<ClaimReactor> last = std::move(self_);
  last.reset();  // `this` may be gone from here on.
  calls->End(kClaimRank);
}

absl::Status ClaimReactor::Claim(const MethodGate& gate, JobRegistry& registry,
                                 const grpc::CallbackServerContext& context,
                                 const grpc::ByteBuffer& raw) {
  absl::StatusOr<Caller> caller = gate.CallerOf(context);
  if (!caller.ok()) return caller.status();
  v1::ClaimRankRequest request;
  if (absl::Status s = ParseRequest(raw, &request); !s.ok()) return s;
  if (absl::Status s = gate.Check(kClaimRank, *caller, request); !s.ok()) return s;
  const uint32_t max_world = v1::MAX_WORLD_SIZE;
  if (request.world_size() < 1 || request.world_size() > max_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", request.world_size(), ": must be in [1, ", max_world, "]"));
  }
  absl::StatusOr<std::shared_ptr<Job>> job = registry.Get(request.job());
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
  if (grpc::Status s = SerializeResponse(claim, &wire_); !s.ok()) return FromGrpcStatus(s);
  StartWrite(&wire_);
  return absl::OkStatus();
}

void ClaimReactor::Release() {
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

void ClaimReactor::End(const grpc::Status& status) {
  Release();  // At once: the rank is free before the client learns the call ended.
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  Finish(status);
}

}  // namespace samplerd
