// The machine-readable retry signal of a refusal that frees itself (proto StreamShard: a shard
// stream refused by the server's stream buffer budget while other streams hold it): trailing
// metadata `samplerd-retry-after-ms` = the delay, in milliseconds, after which the same request
// may fit. The clients decide to retry by it, not by the message's words. Shared by the server
// (which attaches it) and the C++ client (which reads it): it lives beside the API, as
// status_util.h. The Python client reads the same key (samplerd/_client_shards.py).
//
// A RESOURCE_EXHAUSTED that gRPC's transport makes itself (its memory quota resetting a stream:
// RST_STREAM ENHANCE_YOUR_CALM) runs no samplerd code and carries no such trailer; the clients
// keep recognising that one by its message ("RST_STREAM").
#ifndef SAMPLERD_PROTO_RETRY_SIGNAL_H_
#define SAMPLERD_PROTO_RETRY_SIGNAL_H_

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/string_ref.h"

namespace samplerd {

// The trailing metadata key (lower case, as gRPC requires).
inline constexpr char kRetryAfterMsKey[] = "samplerd-retry-after-ms";

// `status` (not OK) marked as retryable after `after`: an absl::Status payload, which core code
// sets without knowing of gRPC and the RPC adapter turns into the trailer. `after` is the
// server's own constant, within [0, 2^31) ms (outside, it is taken to the nearest bound).
absl::Status WithRetryAfter(absl::Status status, absl::Duration after);
// The delay `status` was marked with (WithRetryAfter); nullopt if unmarked.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

// Server side: adds the trailer to `context` when `status` is marked. Call before Finish.
void AddRetryAfterTrailer(const absl::Status& status, grpc::ServerContextBase* context);

// Client side: the delay a call's trailing metadata carries; nullopt when the trailer is absent
// or not a whole number of milliseconds in [0, 2^31).
std::optional<absl::Duration> RetryAfterFromTrailers(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers);

}  // namespace samplerd

#endif  // SAMPLERD_PROTO_RETRY_SIGNAL_H_
