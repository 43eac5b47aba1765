// MethodGate: the methods of samplerd.v1.Sampler and who may call each. Every call of the
// adapter (server/sampler_service.h and its reactors) passes it before anything else happens:
// the caller's bearer token (server/auth/authorizer.h; none needed on a server without tokens),
// then the method's access rule on the parsed request (MethodAccess, the .proto's rule).
//
// Thread-safe: immutable after construction (the Authorizer is thread-safe on its own).
#ifndef SAMPLERD_SERVER_METHOD_GATE_H_
#define SAMPLERD_SERVER_METHOD_GATE_H_

#include <array>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "server/auth/authorizer.h"

namespace samplerd {

// The methods of samplerd.v1.Sampler, in the .proto's order (index = method index; the
// MethodGate's constructor checks it against the .proto).
enum SamplerMethod : int {
  kCreateJob,
  kGetJob,
  kListJobs,
  kDeleteJob,
  kRewindJob,
  kResizeJob,
  kUploadWeights,
  kUploadLabels,
  kStreamShard,
  kReportLosses,
  kEndEpoch,
  kGetJobStatus,
  kClaimRank,
  kUploadIrreducibleLosses,
  kSetGroupWeights,
  kMethodCount
};

// The method's name in the .proto ("StreamShard").
const char* SamplerMethodName(SamplerMethod method);

class MethodGate {
 public:
  // `authorizer`, if not null, must outlive the gate: every call then needs a bearer token that
  // grants it; null: no token checks. CHECK-fails if the .proto's methods are not SamplerMethod.
  explicit MethodGate(const Authorizer* authorizer);

  // Who the call is from: UNAUTHENTICATED without a valid bearer token when the server has
  // tokens; an unrestricted Caller when it has none.
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase& context) const;

  // OK if `caller` may call `method` with `request` (of its request type): PERMISSION_DENIED
  // naming the method and the job otherwise (MethodAccess::Check).
  absl::Status Check(SamplerMethod method, const Caller& caller,
                     const google::protobuf::Message& request) const;

 private:
  const Authorizer* const authorizer_;  // Null: no token checks.
  std::array<std::optional<MethodAccess>, kMethodCount> access_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METHOD_GATE_H_
