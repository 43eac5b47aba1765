#include "server/auth/token_metadata_processor.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "server/log_fields.h"

namespace samplerd {

TokenMetadataProcessor::TokenMetadataProcessor(const Authorizer* authorizer, std::string service,
                                               std::shared_ptr<metrics::Counter> refused)
    : authorizer_(authorizer),
      prefix_(absl::StrCat("/", service, "/")),
      refused_(std::move(refused)) {}

grpc::Status TokenMetadataProcessor::Process(const InputMetadata& auth_metadata,
                                             grpc::AuthContext* context,
                                             OutputMetadata* /*consumed_auth_metadata*/,
                                             OutputMetadata* /*response_metadata*/) {
  auto path = auth_metadata.find(":path");
  const absl::string_view method =
      path == auth_metadata.end() ? absl::string_view()
                                  : absl::string_view(path->second.data(), path->second.size());
  // Without a path (gRPC always sends one) the call is checked like a Sampler call.
  if (path != auth_metadata.end() && !absl::StartsWith(method, prefix_)) return grpc::Status::OK;
  absl::StatusOr<Caller> caller = authorizer_->Authenticate(auth_metadata);
  if (caller.ok()) return grpc::Status::OK;
  std::string client = "-";
  if (context != nullptr && context->IsPeerAuthenticated()) {
    for (const grpc::string_ref& identity : context->GetPeerIdentity()) {
      client = std::string(identity.data(), identity.size());
    }
  }
  if (refused_ != nullptr) refused_->Increment();
  LOG(WARNING) << "event=call_refused stage=metadata method=" << LogValue(method)
               << " code=UNAUTHENTICATED client=" << LogValue(client)
               << " message=" << LogValue(caller.status().message());
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message()));
}

}  // namespace samplerd
