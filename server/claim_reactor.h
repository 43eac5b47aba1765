// ClaimReactor: the callback reactor of ClaimRank. The claim is taken on gRPC's thread (it only
// takes locks; Job::ClaimRank, the rule is rank_claims.h's), its one RankClaim written, and then
// the call stays open with nothing pending: it costs this object, no thread. It ends, releasing
// the claim, when gRPC cancels it (the client cancelled, its connection closed or its keepalive
// failed: OnCancel), or when the job is closed (deleted: NOT_FOUND; shutting down: UNAVAILABLE),
// through the callback RankClaims holds.
//
// Owned by itself (self_) until OnDone, and by that callback while the claim is held.
#ifndef SAMPLERD_SERVER_CLAIM_REACTOR_H_
#define SAMPLERD_SERVER_CLAIM_REACTOR_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/method_gate.h"
#include "server/service_calls.h"

namespace samplerd {

class ClaimReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Starts a ClaimRank call of `raw` (its request). `calls`, `gate` and `registry` must outlive
  // the call.
  static ClaimReactor* Start(ServiceCalls* calls, const MethodGate* gate, JobRegistry* registry,
                             grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  explicit ClaimReactor(ServiceCalls* calls) : calls_(calls) {}

  // Parses and checks the request, claims the rank and writes the RankClaim.
  absl::Status Claim(const MethodGate& gate, JobRegistry& registry,
                     const grpc::CallbackServerContext& context, const grpc::ByteBuffer& raw);
  void Release() ABSL_LOCKS_EXCLUDED(mu_);
  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  ServiceCalls* const calls_;
  grpc::ByteBuffer wire_;  // The RankClaim.
  absl::Mutex mu_;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  uint32_t rank_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no claim held.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ClaimReactor> self_;  // Until OnDone.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CLAIM_REACTOR_H_
