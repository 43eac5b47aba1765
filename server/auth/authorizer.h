// Per-call access control of samplerd.v1.Sampler with the bearer tokens of --auth_tokens_file
// (docs/SECURITY.md has the user-facing rules).
//
//   Authorizer  holds the current TokenTable, re-read by Reload (SIGHUP), and turns a call's
//               `authorization: Bearer <token>` metadata into a Caller (UNAUTHENTICATED without a
//               valid token).
//   Caller      what the call's token grants; answers "may it use job X / make server-wide
//               call Y" with PERMISSION_DENIED naming the job or the call, never the token.
//   MethodAccess the rule of one RPC, derived from its request type: ListJobs and DeleteJob
//               need an admin token; every other RPC names its job in the request's `job` or
//               `name` field and needs a token for that job (so CreateJob with a job token
//               creates that job only: a trainer can create its own job, not others').
//
// Why checks in the handlers and not (only) a grpc::AuthMetadataProcessor: the job a call needs
// is in its request, which only the handler has parsed (client streams even name it per
// message), and a processor is not run on plaintext ports (--plaintext with tokens stays usable
// on loopback). On TLS ports TokenMetadataProcessor (token_metadata_processor.h) authenticates
// from the headers as well, so that a call without a valid token is refused before its request
// is read.
//
// Health checking and reflection are other services: they need no token.
//
// Thread-safe: Reload may run concurrently with Authenticate; a Caller keeps the grant it was
// made with even if a reload removes its token (the call in flight finishes, the next is refused).
#ifndef SAMPLERD_SERVER_AUTH_AUTHORIZER_H_
#define SAMPLERD_SERVER_AUTH_AUTHORIZER_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/string_ref.h"
#include "server/auth/token_table.h"

namespace samplerd {

class Caller {
 public:
  // The caller of a server without --auth_tokens_file: may do everything.
  static Caller Unrestricted() { return Caller(nullptr); }
  explicit Caller(std::shared_ptr<const TokenGrant> grant) : grant_(std::move(grant)) {}

  // OK if the token is an admin token or grants `job`; PERMISSION_DENIED naming the job and the
  // jobs the token does grant otherwise.
  absl::Status MayUseJob(absl::string_view job) const;
  // OK for an admin token; PERMISSION_DENIED naming `method` otherwise.
  absl::Status MayCallServerWide(absl::string_view method) const;

 private:
  std::shared_ptr<const TokenGrant> grant_;  // Null: unrestricted.
};

class MethodAccess {
 public:
  // The rule of `method` of samplerd.v1.Sampler: admin for ListJobs and DeleteJob; otherwise the
  // job named by the request's string field `job` or `name`. CHECK-fails for any other method
  // whose request has neither: a new server-wide RPC must be added to the admin list here.
  static MethodAccess Of(const google::protobuf::MethodDescriptor& method);

  // OK if `caller` may make this call with `request` (of the method's request type).
  absl::Status Check(const Caller& caller, const google::protobuf::Message& request) const;

 private:
  MethodAccess(std::string method, const google::protobuf::FieldDescriptor* job_field)
      : method_(std::move(method)), job_field_(job_field) {}

  std::string method_;
  const google::protobuf::FieldDescriptor* job_field_;  // Null: admin only.
};

class Authorizer {
 public:
  // Loads the tokens file at `path` (see TokenTable for the format). An error names the flag
  // (auth_tokens_file), the path and the bad line; PERMISSION_DENIED if its group or every
  // user may write it. Logs a warning if every user may read it.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const std::string& path);

  // Re-reads the file. On an error the table in use stays as it was (and the error, naming the
  // line, is returned for the caller to log); on success new calls see the new table at once.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // The Caller of a call with `metadata` (grpc::ServerContext::client_metadata()).
  // UNAUTHENTICATED if it carries no `authorization: Bearer <token>` header, more than one, or a
  // token that is not in the table; the message never contains the token.
  absl::StatusOr<Caller> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tokens in the table now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Authorizer(std::string path, std::shared_ptr<const TokenTable> table)
      : path_(std::move(path)), table_(std::move(table)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_AUTH_AUTHORIZER_H_
