#include "server/auth/authorizer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace samplerd {
namespace {

// The server-wide RPCs: not about one job, so only an admin token may make them.
constexpr absl::string_view kAdminOnlyMethods[] = {"ListJobs", "DeleteJob"};

constexpr absl::string_view kHowToAuthenticate =
    "send the metadata \"authorization: Bearer <token>\" with a token of --auth_tokens_file "
    "(see docs/SECURITY.md)";

std::string GrantedJobs(const TokenGrant& grant) {
  std::vector<std::string> jobs(grant.jobs.begin(), grant.jobs.end());
  std::sort(jobs.begin(), jobs.end());
  return absl::StrJoin(jobs, ", ");
}

// The tokens file, named as its flag, with the loader's error (which names the path and line);
// CheckTokenFileMode's rule first: whoever may write the file may grant themselves admin at the
// next SIGHUP.
absl::StatusOr<std::shared_ptr<const TokenTable>> LoadTable(const std::string& path) {
  if (absl::Status s = CheckTokenFileMode("auth_tokens_file", path); !s.ok()) return s;
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  if (!table.ok()) {
    return absl::Status(table.status().code(), absl::StrCat("auth_tokens_file = \"", path,
                                                            "\": ", table.status().message()));
  }
  if (table->size() == 0) {
    // No call would pass: surely not what was meant (to stop all calls, stop the server).
    return absl::InvalidArgumentError(
        absl::StrCat("auth_tokens_file = \"", path, "\": holds no token"));
  }
  return std::make_shared<const TokenTable>(*std::move(table));
}

}  // namespace

absl::Status Caller::MayUseJob(absl::string_view job) const {
  if (grant_ == nullptr || grant_->admin || grant_->jobs.contains(job)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("job = \"", job, "\": the bearer token does not grant this job (it grants ",
                   GrantedJobs(*grant_), ")"));
}

absl::Status Caller::MayCallServerWide(absl::string_view method) const {
  if (grant_ == nullptr || grant_->admin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, " needs an admin token; this bearer token grants the jobs ", GrantedJobs(*grant_)));
}

MethodAccess MethodAccess::Of(const google::protobuf::MethodDescriptor& method) {
  if (std::find(std::begin(kAdminOnlyMethods), std::end(kAdminOnlyMethods), method.name()) !=
      std::end(kAdminOnlyMethods)) {
    return MethodAccess(method.name(), nullptr);
  }
  const google::protobuf::Descriptor* request = method.input_type();
  const google::protobuf::FieldDescriptor* field = request->FindFieldByName("job");
  if (field == nullptr) field = request->FindFieldByName("name");
  CHECK(field != nullptr && field->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
        !field->is_repeated())
      << method.full_name() << ": its request names no job (a string field `job` or `name`); "
      << "if it is a server-wide call, add it to kAdminOnlyMethods in server/auth/authorizer.cc";
  return MethodAccess(method.name(), field);
}

absl::Status MethodAccess::Check(const Caller& caller,
                                 const google::protobuf::Message& request) const {
  if (job_field_ == nullptr) return caller.MayCallServerWide(method_);
  return caller.MayUseJob(request.GetReflection()->GetString(request, job_field_));
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const std::string& path) {
  absl::StatusOr<std::shared_ptr<const TokenTable>> table = LoadTable(path);
  if (!table.ok()) return table.status();
  return std::unique_ptr<Authorizer>(new Authorizer(path, *std::move(table)));
}

absl::Status Authorizer::Reload() {
  absl::StatusOr<std::shared_ptr<const TokenTable>> table = LoadTable(path_);
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&mu_);
  table_ = *std::move(table);
  return absl::OkStatus();
}

size_t Authorizer::size() const {
  absl::MutexLock lock(&mu_);
  return table_->size();
}

absl::StatusOr<Caller> Authorizer::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  // gRPC lower-cases metadata keys, so "authorization" finds "Authorization" too.
  auto [begin, end] = metadata.equal_range("authorization");
  if (begin == end) {
    return absl::UnauthenticatedError(absl::StrCat("no bearer token: ", kHowToAuthenticate));
  }
  if (std::next(begin) != end) {
    return absl::UnauthenticatedError("more than one authorization header: send one");
  }
  const absl::string_view value(begin->second.data(), begin->second.size());
  // RFC 6750: the scheme is case-insensitive, one space before the token.
  constexpr absl::string_view kScheme = "bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the authorization header is not a bearer token: ", kHowToAuthenticate));
  }
  const absl::string_view token = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  std::shared_ptr<const TokenTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  std::shared_ptr<const TokenGrant> grant = table->Find(token);
  if (grant == nullptr) {
    return absl::UnauthenticatedError(
        "the bearer token is not one of --auth_tokens_file (revoked, mistyped, or meant for "
        "another server)");
  }
  return Caller(std::move(grant));
}

}  // namespace samplerd
