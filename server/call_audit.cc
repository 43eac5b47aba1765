#include "server/call_audit.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/samplerd.pb.h"
#include "server/log_fields.h"

namespace samplerd {
namespace {

using google::protobuf::internal::WireFormatLite;
using grpc::experimental::InterceptionHookPoints;

// The management calls: each leaves an audit line.
constexpr absl::string_view kAuditedMethods[] = {"CreateJob", "DeleteJob", "RewindJob", "ResizeJob",
                                                 "SetGroupWeights"};
constexpr size_t kMaxJobBytes = 256;  // Job names have at most 128 characters.

bool Refused(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::PERMISSION_DENIED;
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// The identity of the client's certificate (mutual TLS), or "-".
std::string ClientIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "-";
  std::vector<std::string> names;
  for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
    names.emplace_back(name.data(), name.size());
  }
  return names.empty() ? "-" : absl::StrJoin(names, ",");
}

}  // namespace

std::string CallAuditInterceptorFactory::StringField(const grpc::ByteBuffer& raw,
                                                     int field_number) {
  if (!raw.Valid()) return "";
  grpc::ByteBuffer copy(raw);  // Shares the slices; the reader needs a mutable buffer.
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok()) return "";
  google::protobuf::io::CodedInputStream input(&reader);
  // Every occurrence is read and the last one kept: protobuf's parser, and so the handler and
  // the authorizer, take the last occurrence of a singular field.
  std::string value;
  for (uint32_t tag; (tag = input.ReadTag()) != 0;) {
    if (WireFormatLite::GetTagFieldNumber(tag) == field_number &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length = 0;
      if (!input.ReadVarint32(&length)) return "";
      const uint32_t kept = std::min<uint32_t>(length, kMaxJobBytes);
      if (length - kept > static_cast<uint32_t>(std::numeric_limits<int>::max()) ||
          !input.ReadString(&value, static_cast<int>(kept)) ||
          !input.Skip(static_cast<int>(length - kept))) {
        return "";
      }
      continue;
    }
    if (!WireFormatLite::SkipField(&input, tag)) return "";
  }
  return input.ConsumedEntireMessage() ? value : "";
}

class CallAuditInterceptorFactory::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(grpc::experimental::ServerRpcInfo* info, const MethodRule* rule)
      : info_(info), rule_(rule), start_(absl::Now()) {}

  // gRPC runs the hooks of one batch at a time, but a stream's batches can be intercepted at
  // once on different threads (a read's POST_RECV_MESSAGE beside the call's end, or a status
  // sent while a read is pending): what two hooks share is atomic or guarded.
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (rule_ != nullptr && rule_->job_field != 0 &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        !first_message_seen_.exchange(true, std::memory_order_relaxed)) {
      const auto* raw = static_cast<const grpc::ByteBuffer*>(methods->GetRecvMessage());
      if (raw != nullptr) {
        std::string job = StringField(*raw, rule_->job_field);  // Outside the lock.
        absl::MutexLock lock(&mu_);
        job_ = std::move(job);
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Log(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Log(const grpc::Status& status) {
    const bool refused = Refused(status.error_code());
    const bool audited = rule_ != nullptr && rule_->audited;
    if (!refused && !audited) return;
    grpc::ServerContextBase* context = info_->server_context();
    std::string job;
    {
      absl::MutexLock lock(&mu_);
      job = job_.empty() ? "-" : job_;
    }
    const std::string who =
        absl::StrCat(" peer=", LogValue(context->peer()),
                     " client=", LogValue(ClientIdentity(*context)), " job=", LogValue(job));
    const std::string code = CodeName(status.error_code());
    if (refused) {
      LOG(WARNING) << "event=call_refused method=" << LogValue(info_->method()) << " code=" << code
                   << who << " message=" << LogValue(status.error_message());
    }
    if (audited) {
      LOG(INFO) << "event=audit method=" << LogValue(info_->method()) << " code=" << code << who
                << " ms=" << absl::ToInt64Milliseconds(absl::Now() - start_)
                << (status.ok() ? "" : absl::StrCat(" message=", LogValue(status.error_message())));
    }
  }

  grpc::experimental::ServerRpcInfo* const info_;
  const MethodRule* const rule_;  // Null: not a method of samplerd.v1.Sampler.
  const absl::Time start_;
  // Set by the first message's hook, which alone reads the job from it.
  std::atomic<bool> first_message_seen_{false};
  absl::Mutex mu_;
  std::string job_ ABSL_GUARDED_BY(mu_);  // "" until the first message's job is read.
};

CallAuditInterceptorFactory::CallAuditInterceptorFactory() {
  const google::protobuf::ServiceDescriptor* service =
      v1::Job::descriptor()->file()->FindServiceByName("Sampler");
  CHECK(service != nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = service->method(i);
    MethodRule rule;
    const google::protobuf::FieldDescriptor* job = method->input_type()->FindFieldByName("job");
    if (job == nullptr) job = method->input_type()->FindFieldByName("name");
    if (job != nullptr && job->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      rule.job_field = job->number();
    }
    rule.audited = std::find(std::begin(kAuditedMethods), std::end(kAuditedMethods),
                             method->name()) != std::end(kAuditedMethods);
    sampler_methods_[absl::StrCat("/", service->full_name(), "/", method->name())] = rule;
  }
}

grpc::experimental::Interceptor* CallAuditInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  auto it =
      info->method() == nullptr ? sampler_methods_.end() : sampler_methods_.find(info->method());
  return new Interceptor(info, it == sampler_methods_.end() ? nullptr : &it->second);
}

}  // namespace samplerd
