#include "server/method_gate.h"

#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "proto/samplerd.pb.h"

namespace samplerd {
namespace {

// The methods' names, in SamplerMethod order (checked against the .proto).
constexpr const char* kMethodNames[kMethodCount] = {"CreateJob",     "GetJob",
                                                    "ListJobs",      "DeleteJob",
                                                    "RewindJob",     "ResizeJob",
                                                    "UploadWeights", "UploadLabels",
                                                    "StreamShard",   "ReportLosses",
                                                    "EndEpoch",      "GetJobStatus",
                                                    "ClaimRank",     "UploadIrreducibleLosses",
                                                    "SetGroupWeights"};

const google::protobuf::ServiceDescriptor& SamplerDescriptor() {
  const google::protobuf::ServiceDescriptor* service =
      v1::Job::descriptor()->file()->FindServiceByName("Sampler");
  CHECK(service != nullptr);
  return *service;
}

}  // namespace

const char* SamplerMethodName(SamplerMethod method) { return kMethodNames[method]; }

MethodGate::MethodGate(const Authorizer* authorizer) : authorizer_(authorizer) {
  // Every method of the .proto is served, in the order of SamplerMethod.
  const google::protobuf::ServiceDescriptor& service = SamplerDescriptor();
  CHECK_EQ(service.method_count(), kMethodCount);
  for (int m = 0; m < kMethodCount; ++m) {
    CHECK_EQ(service.method(m)->name(), kMethodNames[m]);
    access_[m].emplace(MethodAccess::Of(*service.method(m)));
  }
}

absl::StatusOr<Caller> MethodGate::CallerOf(const grpc::ServerContextBase& context) const {
  if (authorizer_ == nullptr) return Caller::Unrestricted();
  return authorizer_->Authenticate(context.client_metadata());
}

absl::Status MethodGate::Check(SamplerMethod method, const Caller& caller,
                               const google::protobuf::Message& request) const {
  return access_[method]->Check(caller, request);
}

}  // namespace samplerd
