#include "server/server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const Options& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port = ", options.port, ": must be 0..65535"));
  }
  if (options.max_jobs == 0) return absl::InvalidArgumentError("max_jobs = 0: must be >= 1");
  if (options.max_samples_per_job == 0) {
    return absl::InvalidArgumentError("max_samples_per_job = 0: must be >= 1");
  }
  std::unique_ptr<ComputeBackend> backend;
  if (options.backend == "auto" || options.backend == "cpu") {
    backend = NewCpuBackend(options.planner_threads);
  } else if (options.backend == "cuda") {
    return absl::UnimplementedError(
        "backend = \"cuda\": this samplerd is built without the CUDA backend; use auto or cpu");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("backend = \"", options.backend, "\": expected auto, cpu or cuda"));
  }

  std::unique_ptr<Server> server(new Server(options, std::move(backend)));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  grpc::ResourceQuota quota("samplerd");
  quota.SetMaxThreads(options.max_server_threads);
  builder.SetResourceQuota(quota);
  // Enough polling threads for hundreds of concurrent streams (each sync call holds a thread).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  LOG(INFO) << "samplerd serving on " << server->address() << " with the "
            << server->backend_->name() << " backend";
  return server;
}

Server::Server(const Options& options, std::unique_ptr<ComputeBackend> backend)
    : options_(options),
      backend_(std::move(backend)),
      registry_(std::make_unique<JobRegistry>(
          JobRegistry::Limits{options.max_jobs, JobLimits{options.max_samples_per_job}},
          backend_.get())),
      service_(std::make_unique<SamplerService>(registry_.get(), backend_.get())) {}

Server::~Server() { Shutdown(); }

std::string Server::address() const { return absl::StrCat(options_.host, ":", port_); }

void Server::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_ || server_ == nullptr) return;
    shut_down_ = true;
  }
  registry_->CloseAll();  // Waiting StreamShard calls end with UNAVAILABLE.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.grace_period));
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace samplerd
