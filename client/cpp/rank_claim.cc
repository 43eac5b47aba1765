#include "client/cpp/rank_claim.h"

#include <map>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_callback.h"
#include "proto/samplerd.grpc.pb.h"

namespace samplerd {
namespace {

// The claims this process released, by (job, rank): a later claim of the same rank in this
// process names it as replaced (ClaimRankRequest.replaces), so that it is accepted even if the
// server has not yet processed the cancellation of the released call (a trainer that destroys
// its loop and makes a new one).
class ReleasedClaims {
 public:
  static ReleasedClaims& Get() {
    static ReleasedClaims* released = new ReleasedClaims;  // Never destroyed.
    return *released;
  }
  void Record(const std::string& job, uint32_t rank, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    by_rank_[{job, rank}] = incarnation;
  }
  uint64_t Of(const std::string& job, uint32_t rank) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = by_rank_.find({job, rank});
    return it == by_rank_.end() ? 0 : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, uint32_t>, uint64_t> by_rank_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// One ClaimRank call, held open with gRPC's callback API: a read for the RankClaim, then a read
// left pending that completes only when the call ends (the server sends nothing more). Shared by
// the RankClaim and by itself until OnDone, so that whichever lets go last frees it.
class RankClaim::Call final : public grpc::ClientReadReactor<v1::RankClaim> {
 public:
  // Starts the call (no deadline: it is held for the claim's life).
  static std::shared_ptr<Call> Start(v1::Sampler::Stub* stub, const v1::ClaimRankRequest& request,
                                     const std::string& token) {
    std::shared_ptr<Call> call(new Call(request));
    call->self_ = call;
    if (!token.empty()) call->context_.AddMetadata("authorization", "Bearer " + token);
    stub->async()->ClaimRank(&call->context_, &call->request_, call.get());
    call->StartRead(&call->claim_);
    call->StartCall();
    return call;
  }

  // Cancels the call (a no-op once it ended) and waits until gRPC is done with it.
  void CancelAndWait() ABSL_LOCKS_EXCLUDED(mu_) {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  // The RankClaim's incarnation once it arrived, or the call's status if it ended before.
  absl::StatusOr<uint64_t> AwaitClaim() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return claimed_ || done_; };
    mu_.Await(absl::Condition(&answered));
    if (claimed_) return incarnation_;
    return status_;
  }

  // The call ended (after its claim, or without one): the claim is no longer held.
  bool ended() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  // The call's status (grpc's), for Retry; OK while it runs.
  grpc::Status status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return grpc_status_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The call ended: OnDone follows.
    {
      absl::MutexLock lock(&mu_);
      if (!claimed_) {
        claimed_ = true;
        incarnation_ = claim_.incarnation();
      }
    }
    StartRead(&claim_);  // Completes when the call ends.
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      grpc_status_ = status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                "the ClaimRank call ended without its RankClaim")
                                 : status;
      status_ = FromGrpc(grpc_status_);
      done_ = true;
    }
    std::shared_ptr<Call> last = std::move(self_);  // `this` may be gone after this statement.
  }

 private:
  explicit Call(const v1::ClaimRankRequest& request) : request_(request) {}

  static absl::Status FromGrpc(const grpc::Status& s) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }

  grpc::ClientContext context_;
  const v1::ClaimRankRequest request_;
  v1::RankClaim claim_;
  mutable absl::Mutex mu_;
  bool claimed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status grpc_status_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Call> self_;  // Until OnDone.
};

absl::StatusOr<std::unique_ptr<RankClaim>> RankClaim::Create(std::shared_ptr<SamplerClient> client,
                                                             const std::string& job, uint32_t rank,
                                                             uint32_t world_size, bool peer) {
  if (client == nullptr) return absl::InvalidArgumentError("client = null");
  if (job.empty()) return absl::InvalidArgumentError("job = \"\": a job name is needed");
  if (rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " is outside [0, world_size = ", world_size, ")"));
  }
  v1::ClaimRankRequest request;
  request.set_job(job);
  request.set_rank(rank);
  request.set_world_size(world_size);
  request.set_peer(peer);
  auto claim = absl::WrapUnique(new RankClaim(std::move(client), std::move(request)));
  absl::StatusOr<uint64_t> claimed = claim->Incarnation();
  if (!claimed.ok()) return claimed.status();
  return claim;
}

RankClaim::RankClaim(std::shared_ptr<SamplerClient> client, v1::ClaimRankRequest request)
    : client_(std::move(client)),
      request_(std::move(request)),
      incarnation_(ReleasedClaims::Get().Of(request_.job(), request_.rank())) {}

RankClaim::~RankClaim() {
  absl::MutexLock lock(&mu_);
  // Before the client (its stub and channel) may go.
  if (call_ != nullptr) {
    call_->CancelAndWait();
    ReleasedClaims::Get().Record(request_.job(), request_.rank(), incarnation_);
  }
}

absl::StatusOr<uint64_t> RankClaim::Incarnation() {
  absl::MutexLock lock(&mu_);
  if (call_ == nullptr || call_->ended()) {
    if (absl::Status s = ClaimLocked(); !s.ok()) return s;
  }
  return incarnation_;
}

void RankClaim::Renew(uint64_t stale) {
  absl::MutexLock lock(&mu_);
  if (incarnation_ == stale && call_ != nullptr) {
    call_->CancelAndWait();
    call_.reset();
  }
}

absl::Status RankClaim::ClaimLocked() {
  if (call_ != nullptr) {
    call_->CancelAndWait();
    call_.reset();
  }
  v1::ClaimRankRequest request = request_;
  // The previous claim, which the server may not have seen end yet (a lost connection).
  request.set_replaces(incarnation_);
  std::shared_ptr<Call> call;
  absl::Status s = client_->Retry([&](uint64_t) {
    if (call != nullptr) call->CancelAndWait();
    call = Call::Start(client_->stub(), request, client_->options().token);
    absl::StatusOr<uint64_t> claimed = call->AwaitClaim();
    if (claimed.ok()) {
      incarnation_ = *claimed;
      return grpc::Status::OK;
    }
    return call->status();
  });
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("claiming rank ", request_.rank(), " of job \"",
                                               request_.job(), "\": ", s.message()));
  }
  call_ = std::move(call);
  return absl::OkStatus();
}

}  // namespace samplerd
