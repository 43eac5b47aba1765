// The one place where absl::Status and grpc::Status are converted (both directions), with the
// message capped so that a huge client value cannot make a huge error. Shared by the server's
// service adapter and the C++ client: it lives beside the API, not in //server.
#ifndef SAMPLERD_PROTO_STATUS_UTIL_H_
#define SAMPLERD_PROTO_STATUS_UTIL_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace samplerd {

// Longest error message sent to a client (as TF Serving does). A longer one is cut at a UTF-8
// character boundary and ends in "...".
inline constexpr size_t kMaxErrorMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace samplerd

#endif  // SAMPLERD_PROTO_STATUS_UTIL_H_
