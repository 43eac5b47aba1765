#include "server/metrics/rpc_interceptor.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "server/log_fields.h"

namespace samplerd {
namespace metrics {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/pkg.Service/Method" -> {"pkg.Service", "Method"}; {"other", "other"} for a service not in
// `services` or a malformed path.
std::pair<std::string, std::string> Labels(const char* path,
                                           const std::set<std::string>& services) {
  const absl::string_view p = path == nullptr ? "" : path;
  const size_t slash = p.rfind('/');
  if (p.size() > 1 && p[0] == '/' && slash != 0 && slash + 1 < p.size()) {
    std::string service(p.substr(1, slash - 1));
    if (services.count(service) > 0) return {std::move(service), std::string(p.substr(slash + 1))};
  }
  return {"other", "other"};
}

// The codes an operator must act on: a server fault, lost or corrupt state, exhausted limits.
bool NeedsAttention(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::DATA_LOSS ||
         code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

std::string CodeName(grpc::StatusCode code) {
  // Same numbering as absl::StatusCode; its names are the canonical ones ("NOT_FOUND").
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

// One per call, created by gRPC when the call arrives and destroyed with it.
class RpcMetricsInterceptorFactory::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(const RpcMetricsInterceptorFactory* factory, const char* path)
      : factory_(factory), path_(path == nullptr ? "" : path), start_(absl::Now()) {
    auto [service, method] = Labels(path, factory->services_);
    labels_ = {std::move(service), std::move(method)};
    in_flight_ = factory->in_flight_->WithLabels(labels_);
    in_flight_->Add(1);
  }

  ~Interceptor() override {
    // A call that ended without sending a status (its client went away first) is CANCELLED.
    if (!finished_) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no status was sent"));
    in_flight_->Add(-1);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Finish(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Finish(const grpc::Status& status) {
    finished_ = true;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    const std::string code = CodeName(status.error_code());
    factory_->calls_->WithLabels({labels_[0], labels_[1], code})->Increment();
    factory_->durations_->WithLabels(labels_)->Observe(seconds);
    if (NeedsAttention(status.error_code())) {
      // A full budget is the operator's to raise (WARNING); a fault or lost state is an ERROR.
      const google::LogSeverity severity =
          status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? google::GLOG_WARNING
                                                                      : google::GLOG_ERROR;
      google::LogMessage(__FILE__, __LINE__, severity).stream()
          << "event=rpc_error method=" << LogValue(path_) << " code=" << code
          << " ms=" << seconds * 1e3 << " message=" << LogValue(status.error_message());
    } else {
      VLOG(1) << "event=rpc method=" << LogValue(path_) << " code=" << code
              << " ms=" << seconds * 1e3;
    }
  }

  const RpcMetricsInterceptorFactory* const factory_;
  const std::string path_;
  const absl::Time start_;
  std::vector<std::string> labels_;
  std::shared_ptr<Gauge> in_flight_;
  bool finished_ = false;  // gRPC runs one call's hooks one at a time.
};

RpcMetricsInterceptorFactory::RpcMetricsInterceptorFactory(Registry* registry,
                                                           std::set<std::string> services)
    : services_(std::move(services)),
      calls_(registry->AddCounter("samplerd_rpcs_total",
                                  "RPCs finished, by gRPC service, method and status code.",
                                  {"service", "method", "code"})),
      durations_(registry->AddHistogram(
          "samplerd_rpc_duration_seconds",
          "Time from an RPC's arrival to its status (a stream's whole life), in seconds.",
          {"service", "method"})),
      in_flight_(registry->AddGauge("samplerd_rpcs_in_flight",
                                    "RPCs running now (open shard streams included).",
                                    {"service", "method"})) {}

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new Interceptor(this, info->method());
}

}  // namespace metrics
}  // namespace samplerd
