// TokenMetadataProcessor: the bearer-token check of samplerd.v1.Sampler's calls, run by gRPC on a
// call's metadata before any of its request is read (grpc::AuthMetadataProcessor, TLS ports).
//
// Why: gRPC 1.51 reads a request whole before the call reaches a handler, whatever
// --max_message_bytes says, so a call without a valid token that the handler refuses
// (SamplerService, server/auth/authorizer.h) has already cost the server its request: up to
// what the peer announced, bounded only by --max_transport_buffer_bytes (server/memory_budget.h).
// Refused here, the call ends UNAUTHENTICATED from its headers: the server never asks for its
// message, so the peer can push no more than HTTP/2 flow control lets it before the stream is
// reset (the stream's initial window, 64 KiB), and that is dropped as it arrives.
//
// Only authentication is done here (is there one valid token?): which job a token may use is
// in the request, which the handler checks as before. Calls of other services (health checking,
// reflection) pass without a token, as in the handlers. A refused call reaches no interceptor:
// it is logged and counted here (WARNING event=call_refused stage=metadata, method, client,
// message, never the token; samplerd_rpcs_refused_at_headers_total).
//
// gRPC runs processors on secure ports only: with --plaintext the handlers' check (after the
// request is read) is the only one.
//
// Thread-safe; never blocks (a table lookup): IsBlocking() is false, so gRPC runs it inline.
#ifndef SAMPLERD_SERVER_AUTH_TOKEN_METADATA_PROCESSOR_H_
#define SAMPLERD_SERVER_AUTH_TOKEN_METADATA_PROCESSOR_H_

#include <memory>
#include <string>

#include "grpcpp/security/auth_metadata_processor.h"
#include "server/auth/authorizer.h"
#include "server/metrics/registry.h"

namespace samplerd {

class TokenMetadataProcessor final : public grpc::AuthMetadataProcessor {
 public:
  // `authorizer` must outlive the processor (and so the gRPC server holding it); its reloads are
  // seen by the next call. `service` is the full name of the service whose calls need a token
  // ("samplerd.v1.Sampler"). `refused` (may be null) counts the calls refused.
  TokenMetadataProcessor(const Authorizer* authorizer, std::string service,
                         std::shared_ptr<metrics::Counter> refused = nullptr);

  bool IsBlocking() const override { return false; }

  // OK for a call of another service or with a valid token; UNAUTHENTICATED (the authorizer's
  // message) otherwise. Consumes nothing: the handler reads the token again for its job check.
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const Authorizer* const authorizer_;
  const std::string prefix_;  // "/samplerd.v1.Sampler/".
  const std::shared_ptr<metrics::Counter> refused_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_AUTH_TOKEN_METADATA_PROCESSOR_H_
