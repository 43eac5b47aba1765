// CallAuditInterceptorFactory: a gRPC server interceptor that writes the log lines an operator
// audits by (docs/OPERATIONS.md), in one place for every handler:
//
//   event=call_refused  WARNING, every call of any service ending UNAUTHENTICATED or
//                       PERMISSION_DENIED: method, code, peer, client, job, message.
//   event=audit         INFO, every management call of samplerd.v1.Sampler (CreateJob,
//                       DeleteJob, RewindJob, ResizeJob, SetGroupWeights), whatever its
//                       outcome: method, job,
//                       code, peer, client, ms, and the message when it failed.
//
// `peer` is gRPC's peer address ("ipv4:10.0.0.7:51234"); `client` the identity of the client's
// TLS certificate under mutual TLS (its subject alternative names or common name), else "-".
// `job` is the job the request names, read from the call's first message (the request's
// `job` or `name` field, the field the authorizer checks, its last occurrence as protobuf's
// parser takes it), or "-" when the call was refused
// before a message arrived (a client stream refused for its token). Messages are the status
// messages the client got: they never contain a token (server/auth/authorizer.h).
//
// The requests of samplerd.v1.Sampler must reach the interceptor as grpc::ByteBuffer (the
// service registers raw methods, server/sampler_service.h): that is how the job is read without
// parsing the whole request. Other services' messages are not looked at.
//
// Thread-safe; one interceptor per call, whose hooks may run at once for different batches of a
// stream (what they share is guarded).
#ifndef SAMPLERD_SERVER_CALL_AUDIT_H_
#define SAMPLERD_SERVER_CALL_AUDIT_H_

#include <map>
#include <string>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_interceptor.h"

namespace samplerd {

class CallAuditInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // Reads the job field of every method of samplerd.v1.Sampler from the .proto.
  CallAuditInterceptorFactory();

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  // The string field `field_number` of the serialized message `raw` (its last occurrence, the
  // one protobuf's parser keeps; at most 256 bytes of it), or "" if it has none or does not
  // parse.
  static std::string StringField(const grpc::ByteBuffer& raw, int field_number);

 private:
  class Interceptor;
  struct MethodRule {
    int job_field = 0;     // Field number of the request's job name; 0: none (ListJobs).
    bool audited = false;  // A management call: one audit line each.
  };

  // By full path, "/samplerd.v1.Sampler/CreateJob".
  std::map<std::string, MethodRule> sampler_methods_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CALL_AUDIT_H_
