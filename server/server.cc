#include "server/server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/auth/server_credentials.h"
#include "server/job_memory.h"

namespace samplerd {
namespace {

// host:port, with an IPv6 literal in brackets ("[::1]:50051").
std::string JoinHostPort(const std::string& host, int port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return bare_ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// Whether `host` only listens on this machine (where plaintext tokens stay on the machine).
bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || absl::StartsWith(host, "127.");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const Options& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port = ", options.port, ": must be 0..65535"));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host = \"\": must not be empty");
  if (options.max_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_jobs = ", options.max_jobs, ": must be >= 1"));
  }
  if (options.rewind_epochs < -1 || options.rewind_epochs > kMaxRewindEpochs) {
    return absl::InvalidArgumentError(absl::StrCat("rewind_epochs = ", options.rewind_epochs,
                                                   ": must be in [-1, ", kMaxRewindEpochs, "]"));
  }
  if (options.max_samples_per_job == 0) {
    return absl::InvalidArgumentError("max_samples_per_job = 0: must be >= 1");
  }
  if (options.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes = ", options.max_message_bytes, ": must be >= 4096"));
  }
  if (options.max_server_threads < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_server_threads = ", options.max_server_threads, ": must be >= 16"));
  }
  if (options.max_stream_buffer_bytes == 0) {
    return absl::InvalidArgumentError("max_stream_buffer_bytes = 0: must be >= 1");
  }
  if (options.planner_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner_threads = ", options.planner_threads, ": must be >= 0"));
  }
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grace_period = ", absl::FormatDuration(options.grace_period), ": must be >= 0"));
  }
  std::unique_ptr<ComputeBackend> backend;
  if (options.backend == "auto" || options.backend == "cpu") {
    backend = NewCpuBackend(options.planner_threads);
  } else if (options.backend == "cuda") {
    return absl::UnimplementedError(
        "backend = \"cuda\": samplerd was not built with CUDA; use --backend=auto or cpu");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("backend = \"", options.backend, "\": expected auto, cpu or cuda"));
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(
      {options.plaintext, options.tls_cert, options.tls_key, options.tls_client_ca});
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<Authorizer> authorizer;
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<Authorizer>> created =
        Authorizer::Create(options.auth_tokens_file);
    if (!created.ok()) return created.status();
    authorizer = *std::move(created);
    if (options.plaintext && !IsLoopback(options.host)) {
      LOG(WARNING) << "bearer tokens over plaintext on host " << options.host
                   << ": anyone on the network path can read them; use --tls_cert/--tls_key";
    }
  }

  std::unique_ptr<Server> server(new Server(options, std::move(backend), std::move(authorizer)));
  // The persisted jobs are back before the port opens: no client sees a partial state.
  if (absl::Status s = server->registry_->Recover(); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(JoinHostPort(options.host, options.port), *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  // No SO_REUSEPORT (gRPC's default on Linux): a second samplerd on the same port must fail to
  // start, not silently share the port and split the ranks between two servers' state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
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
        absl::StrCat("cannot listen on ", JoinHostPort(options.host, options.port)));
  }
  LOG(INFO) << "samplerd serving on " << server->address() << " ("
            << (options.plaintext               ? "plaintext"
                : options.tls_client_ca.empty() ? "TLS"
                                                : "mutual TLS")
            << (server->authorizer_ != nullptr
                    ? absl::StrCat(", ", server->authorizer_->size(), " bearer tokens")
                    : std::string(", no bearer tokens"))
            << ") with the " << server->backend_->name() << " backend and a memory budget of "
            << FormatBytes(options.max_memory_bytes != 0 ? options.max_memory_bytes
                                                         : DefaultMaxMemoryBytes());
  return server;
}

Server::Server(const Options& options, std::unique_ptr<ComputeBackend> backend,
               std::unique_ptr<Authorizer> authorizer)
    : options_(options),
      backend_(std::move(backend)),
      authorizer_(std::move(authorizer)),
      registry_(std::make_unique<JobRegistry>(
          JobRegistry::Limits{
              static_cast<size_t>(options.max_jobs),
              JobLimits{options.max_samples_per_job,
                        static_cast<uint32_t>(options.rewind_epochs >= 0 ? options.rewind_epochs
                                              : options.data_dir.empty() ? 0
                                                                         : kDefaultRewindEpochs)},
              options.max_memory_bytes != 0 ? options.max_memory_bytes : DefaultMaxMemoryBytes()},
          backend_.get(), options.data_dir)),
      service_(std::make_unique<SamplerService>(
          registry_.get(), backend_.get(), options.max_message_bytes,
          options.max_stream_buffer_bytes, authorizer_.get())) {}

Server::~Server() { Shutdown(); }

std::string Server::address() const { return JoinHostPort(options_.host, port_); }

void Server::Shutdown() {
  // Held throughout, so that a concurrent second call returns only once the first is done. No
  // handler takes shutdown_mu_, so waiting for the handlers under it cannot deadlock.
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + options_.grace_period;
  // Load balancers and readiness probes see the server leave first.
  if (auto* health = server_->GetHealthCheckService(); health != nullptr) {
    health->SetServingStatus(false);
  }
  // Wake waiting StreamShard calls (they end with UNAVAILABLE: retry elsewhere or later) and
  // refuse new work on the jobs (UNAVAILABLE); streams already writing continue.
  registry_->CloseAll();
  // Let in-flight calls finish within the grace period. gRPC's Shutdown(deadline) alone would
  // also wait for idle client connections to go away, i.e. always the whole grace period while
  // trainers stay connected; so wait for our own calls, then stop gRPC with a short deadline
  // (it cancels whatever is left, e.g. a stream whose client stopped reading).
  const bool drained = service_->AwaitNoCalls(deadline);
  if (!drained) LOG(WARNING) << "grace period over: cancelling the calls still running";
  server_->Shutdown(absl::ToChronoTime(
      drained ? std::min(deadline, absl::Now() + absl::Milliseconds(100)) : absl::Now()));
}

absl::Status Server::ReloadAuthTokens() {
  if (authorizer_ == nullptr) {
    return absl::FailedPreconditionError("no --auth_tokens_file to reload");
  }
  return authorizer_->Reload();
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace samplerd
