#include "server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "server/auth/server_credentials.h"
#include "server/auth/token_metadata_processor.h"
#include "server/auth/token_table.h"
#include "server/call_audit.h"
#include "server/job_memory.h"
#include "server/log_fields.h"
#include "server/metrics/process_metrics.h"
#include "server/metrics/rpc_interceptor.h"
#include "server/version.h"

namespace samplerd {
namespace {

// host:port, with an IPv6 literal in brackets ("[::1]:50051").
std::string JoinHostPort(const std::string& host, int port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return bare_ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// Whether `host` only listens on this machine (where plaintext tokens stay on the machine):
// "localhost", or an address literal of 127.0.0.0/8 or ::1. A name is not looked at (one that
// merely starts with "127." may resolve anywhere).
bool IsLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  const std::string bare = host.size() > 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  in6_addr v6;
  return inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// The full name of the Sampler service ("samplerd.v1.Sampler"), from the .proto.
const std::string& SamplerServiceName() {
  static const std::string* const name =
      new std::string(v1::Job::descriptor()->file()->FindServiceByName("Sampler")->full_name());
  return *name;
}

// The backend of --backend: "cpu"; "cuda", which must start (FAILED_PRECONDITION naming what is
// missing otherwise); or "auto": CUDA when a usable GPU is present, else the CPU, saying why.
// Chosen once at startup: a job never moves between backends.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(const Options& options) {
  if (options.backend == "cpu") return NewCpuBackend(options.planner_threads);
  if (options.backend != "cuda" && options.backend != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend = \"", options.backend, "\": expected auto, cpu or cuda"));
  }
  if (options.cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device = ", options.cuda_device, ": must be >= 0"));
  }
  CudaBackendOptions cuda;
  cuda.device = options.cuda_device;
  absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu = NewCudaBackend(cuda);
  if (gpu.ok() || options.backend == "cuda") {
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("backend = \"cuda\": ", gpu.status().message(),
                                       "; use --backend=cpu, or --backend=auto to fall back to the "
                                       "CPU when no GPU is usable"));
    }
    return gpu;
  }
  LOG(INFO) << "event=backend_selected backend=cpu reason="
            << LogValue(absl::StrCat("--backend=auto and no usable GPU: ", gpu.status().message()));
  return NewCpuBackend(options.planner_threads);
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
  if (options.planner_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner_threads = ", options.planner_threads, ": must be >= 0"));
  }
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grace_period = ", absl::FormatDuration(options.grace_period), ": must be >= 0"));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port = ", options.metrics_port,
                     ": must be -1 (no metrics), 0 (a free port) or 1..65535"));
  }
  if (absl::Status s = ValidateTransportOptions(options.transport); !s.ok()) return s;
  // (An empty metrics_host is HttpExporter::Start's error.)
  if (options.metrics_port >= 0 && !options.metrics_host.empty() &&
      !IsLoopback(options.metrics_host) && options.metrics_token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_host = \"", options.metrics_host,
        "\" is not loopback and no metrics_token_file is set: the metrics name every job, so "
        "anyone who can reach the port would read them; set --metrics_token_file (see "
        "docs/OPERATIONS.md) or --metrics_host=127.0.0.1"));
  }
  absl::StatusOr<MemoryBudget> memory =
      MakeMemoryBudget(options.max_memory_bytes, options.max_stream_buffer_bytes,
                       options.max_transport_buffer_bytes);
  if (!memory.ok()) return memory.status();
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend = MakeBackend(options);
  if (!backend.ok()) return backend.status();

  CertificateValidity certificate;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(
      {options.plaintext, options.tls_cert, options.tls_key, options.tls_client_ca}, &certificate);
  if (!credentials.ok()) return credentials.status();
  metrics::HttpExporter::Authorize metrics_authorize;
  if (!options.metrics_token_file.empty()) {
    if (absl::Status s = CheckTokenFileMode("metrics_token_file", options.metrics_token_file);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<TokenTable> token = TokenTable::LoadSingle(options.metrics_token_file);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat("metrics_token_file: ", token.status().message()));
    }
    metrics_authorize = [table = std::make_shared<const TokenTable>(*std::move(token))](
                            absl::string_view presented) {
      return table->Find(presented) != nullptr;
    };
  }
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

  std::unique_ptr<Server> server(
      new Server(options, *memory, *std::move(backend), std::move(authorizer)));
  // Exported whatever the transport (0 without TLS or tokens), so that dashboards can show it.
  std::shared_ptr<metrics::Counter> refused_at_headers =
      server->metrics_
          ->AddCounter("samplerd_rpcs_refused_at_headers_total",
                       "Calls of samplerd.v1.Sampler refused UNAUTHENTICATED from their headers, "
                       "before their request was read (TLS ports only); not in "
                       "samplerd_rpcs_total.")
          ->WithLabels({});
  if (server->authorizer_ != nullptr && !options.plaintext) {
    // The token is checked from the headers, before the request is read (gRPC runs processors
    // on TLS ports only; the handlers check it again, with the job).
    (*credentials)
        ->SetAuthMetadataProcessor(std::make_shared<TokenMetadataProcessor>(
            server->authorizer_.get(), SamplerServiceName(), std::move(refused_at_headers)));
  }
  metrics::Process();  // Its families are exported from the start, at 0.
  server->AddStateGauges();
  if (!options.plaintext) {
    server->metrics_
        ->AddGauge("samplerd_tls_certificate_expiry_timestamp_seconds",
                   "When the server certificate (--tls_cert) expires, in Unix seconds.")
        ->WithLabels({})
        ->Set(static_cast<double>(absl::ToUnixSeconds(certificate.not_after)));
  }
  // Metrics are served before recovery, which can take minutes for a large job: an operator
  // sees the process up (and its job count grow) meanwhile.
  if (options.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<metrics::HttpExporter>> exporter = metrics::HttpExporter::Start(
        options.metrics_host, options.metrics_port,
        {server->metrics_.get(), &metrics::Registry::Default()}, std::move(metrics_authorize));
    if (!exporter.ok()) return exporter.status();
    server->metrics_exporter_ = *std::move(exporter);
  }
  // The persisted jobs are back before the port opens: no client sees a partial state.
  if (absl::Status s = server->registry_->Recover(); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Every call is counted, timed and (if it fails in a way an operator must see) logged by one
  // interceptor, not by each handler.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<metrics::RpcMetricsInterceptorFactory>(
      server->metrics_.get(), std::set<std::string>{SamplerServiceName(), "grpc.health.v1.Health",
                                                    "grpc.reflection.v1alpha.ServerReflection"}));
  // Refused calls and management calls, with the peer and the job (docs/OPERATIONS.md).
  interceptors.push_back(std::make_unique<CallAuditInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.AddListeningPort(JoinHostPort(options.host, options.port), *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  // No SO_REUSEPORT (gRPC's default on Linux): a second samplerd on the same port must fail to
  // start, not silently share the port and split the ranks between two servers' state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ApplyTransportOptions(options.transport, &builder);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Only the synchronous services (health, reflection) hold a thread per call, from this quota;
  // samplerd.v1.Sampler is served with the callback API and runs its blocking work on its own
  // bounded pool (SamplerService, WorkPool). Its memory bounds the requests being received and
  // decoded (server/memory_budget.h).
  grpc::ResourceQuota quota("samplerd");
  quota.SetMaxThreads(options.max_server_threads);
  quota.Resize(server->memory_.transport_buffers);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", JoinHostPort(options.host, options.port)));
  }
  // The default health service knows "" only; probes that name the service (Kubernetes'
  // grpc probe with `service:`, grpc_health_probe -service) must get an answer too.
  server->server_->GetHealthCheckService()->SetServingStatus(SamplerServiceName(), true);
  server->saturation_ = std::make_unique<SaturationMonitor>(
      [service = server->service_.get()] { return service->HandlerLoad(); },
      options.max_server_threads,
      [health = server->server_->GetHealthCheckService()](bool serving) {
        health->SetServingStatus(serving);
      },
      server->metrics_.get(), SaturationMonitor::Limits{});
  LOG(INFO) << "event=serving address=" << LogValue(server->address()) << " transport="
            << (options.plaintext               ? "plaintext"
                : options.tls_client_ca.empty() ? "tls"
                                                : "mutual_tls")
            << " bearer_tokens="
            << (server->authorizer_ != nullptr ? server->authorizer_->size() : 0)
            << " backend=" << server->backend_->name()
            << " memory_budget_bytes=" << server->memory_.total
            << " stream_buffer_bytes=" << server->memory_.stream_buffers
            << " request_buffer_bytes=" << server->memory_.transport_buffers
            << " jobs_memory_bytes=" << server->memory_.jobs()
            << " metrics=" << LogValue(server->metrics_url()) << " version=" << kVersion;
  return server;
}

Server::Server(const Options& options, const MemoryBudget& memory,
               std::unique_ptr<ComputeBackend> backend, std::unique_ptr<Authorizer> authorizer)
    : options_(options),
      memory_(memory),
      backend_(std::move(backend)),
      authorizer_(std::move(authorizer)),
      registry_(std::make_unique<JobRegistry>(
          JobRegistry::Limits{
              static_cast<size_t>(options.max_jobs),
              JobLimits{options.max_samples_per_job,
                        static_cast<uint32_t>(options.rewind_epochs >= 0 ? options.rewind_epochs
                                              : options.data_dir.empty() ? 0
                                                                         : kDefaultRewindEpochs)},
              memory.total, memory.serving_reserve()},
          backend_.get(), options.data_dir)),
      metrics_(std::make_unique<metrics::Registry>()),
      service_(std::make_unique<SamplerService>(
          registry_.get(), backend_.get(), options.max_message_bytes, memory.stream_buffers,
          authorizer_.get(), metrics_.get(), options.max_server_threads)) {}

Server::~Server() { Shutdown(); }

std::string Server::address() const { return JoinHostPort(options_.host, port_); }

std::string Server::metrics_url() const {
  return metrics_exporter_ != nullptr ? metrics_exporter_->url() : "";
}

void Server::AddStateGauges() {
  metrics_
      ->AddGauge("samplerd_build_info", "The samplerd build: its version and backend.",
                 {"version", "backend"})
      ->WithLabels({kVersion, std::string(backend_->name())})
      ->Set(1);
  JobRegistry* const jobs = registry_.get();
  metrics_->AddGaugeCallback("samplerd_jobs", "Jobs on this server.", {}, [jobs] {
    return std::vector<metrics::GaugeSample>{{{}, static_cast<double>(jobs->List().size())}};
  });
  // One sample per job, from its consistent status (one lock acquisition of the job).
  using JobValue = std::function<double(const Job&, const v1::JobStatus&)>;
  auto per_job = [jobs](JobValue value) {
    return [jobs, value = std::move(value)] {
      std::vector<metrics::GaugeSample> samples;
      for (const std::shared_ptr<Job>& job : jobs->List()) {
        samples.push_back({{job->name()}, value(*job, job->Status())});
      }
      return samples;
    };
  };
  metrics_->AddGaugeCallback("samplerd_job_epoch",
                             "The job's current epoch (being served, or planned).", {"job_name"},
                             per_job([](const Job&, const v1::JobStatus& s) {
                               return static_cast<double>(s.job().current_epoch());
                             }));
  metrics_->AddGaugeCallback(
      "samplerd_job_plan_ready", "1 while the job's current epoch is served, else 0.", {"job_name"},
      per_job([](const Job&, const v1::JobStatus& s) { return s.job().plan_ready() ? 1.0 : 0.0; }));
  metrics_->AddGaugeCallback("samplerd_job_ranks_ended",
                             "Ranks that ended the job's current epoch (EndEpoch).", {"job_name"},
                             per_job([](const Job&, const v1::JobStatus& s) {
                               return static_cast<double>(std::count_if(
                                   s.ranks().begin(), s.ranks().end(),
                                   [](const v1::RankProgress& r) { return r.ended(); }));
                             }));
  metrics_->AddGaugeCallback("samplerd_job_world_size", "The job's world size (ranks per epoch).",
                             {"job_name"}, per_job([](const Job& job, const v1::JobStatus&) {
                               return static_cast<double>(job.config().shard.world_size);
                             }));
  // A mixture job's group weights in force: its MAX_STATUS_GROUPS heaviest groups only, so
  // the series stay bounded whatever K (a group leaving the top 16 leaves the scrape).
  metrics_->AddGaugeCallback(
      "samplerd_mixture_group_weight",
      "A mixture job's group weight in force at its current epoch (its 16 heaviest groups).",
      {"job_name", "group"}, [jobs] {
        std::vector<metrics::GaugeSample> samples;
        for (const std::shared_ptr<Job>& job : jobs->List()) {
          if (job->config().mixture == nullptr) continue;
          const v1::JobStatus status = job->Status();
          for (const v1::GroupStatus& g : status.mixture().top_groups()) {
            samples.push_back({{job->name(), std::to_string(g.group())}, g.weight()});
          }
        }
        return samples;
      });
  const ComputeBackend* const backend = backend_.get();
  const bool persisted = !options_.data_dir.empty();
  metrics_->AddGaugeCallback(
      "samplerd_job_memory_estimate_bytes",
      "The job's estimated memory (what it counts against --max_memory_bytes).", {"job_name"},
      per_job([backend, persisted](const Job& job, const v1::JobStatus&) {
        return static_cast<double>(EstimateJobMemory(job.config(), *backend, persisted).total());
      }));
  metrics_
      ->AddGauge("samplerd_memory_budget_bytes",
                 "The server's memory budget (--max_memory_bytes): the serving reserve, then "
                 "the jobs.")
      ->WithLabels({})
      ->Set(static_cast<double>(memory_.total));
  metrics::Family<metrics::Gauge>* reserve = metrics_->AddGauge(
      "samplerd_memory_reserve_bytes",
      "Memory taken from --max_memory_bytes at start-up, by use: stream_buffers "
      "(--max_stream_buffer_bytes), transport_buffers (--max_transport_buffer_bytes); the jobs are "
      "budgeted against the rest.",
      {"use"});
  reserve->WithLabels({"stream_buffers"})->Set(static_cast<double>(memory_.stream_buffers));
  reserve->WithLabels({"transport_buffers"})->Set(static_cast<double>(memory_.transport_buffers));
  const SamplerService* const service = service_.get();
  metrics_->AddGaugeCallback("samplerd_stream_buffer_bytes",
                             "Bytes reserved by open StreamShard calls now.", {}, [service] {
                               return std::vector<metrics::GaugeSample>{
                                   {{}, static_cast<double>(service->StreamBufferBytesInUse())}};
                             });
  metrics_
      ->AddGauge("samplerd_stream_buffer_limit_bytes",
                 "Most bytes open StreamShard calls may reserve (--max_stream_buffer_bytes).")
      ->WithLabels({})
      ->Set(static_cast<double>(memory_.stream_buffers));
}

void Server::Shutdown() {
  // Held throughout, so that a concurrent second call returns only once the first is done. No
  // handler takes shutdown_mu_, so waiting for the handlers under it cannot deadlock.
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  saturation_.reset();  // The health status is the shutdown's from here on.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.grace_period;
  LOG(INFO) << "event=shutdown_started grace_period_ms="
            << absl::ToInt64Milliseconds(options_.grace_period)
            << " calls_in_flight=" << service_->CallsInFlight();
  // Load balancers and readiness probes see the server leave first (every service: "" and
  // samplerd.v1.Sampler).
  if (auto* health = server_->GetHealthCheckService(); health != nullptr) {
    health->SetServingStatus(false);
  }
  // Wake waiting StreamShard calls (they end with UNAVAILABLE: retry elsewhere or later) and
  // refuse new work on the jobs (UNAVAILABLE).
  registry_->CloseAll();
  // End the shard streams still writing (CANCELLED): the clients reopen them at their next
  // position on the restarted server. Let finish, a stream paced by its trainer held the
  // shutdown for the whole grace period while the same trainer's loss reports were refused.
  service_->EndShardStreams();
  // Let in-flight calls finish within the grace period. gRPC's Shutdown(deadline) alone would
  // also wait for idle client connections to go away, i.e. always the whole grace period while
  // trainers stay connected; so wait for our own calls, then stop gRPC with a short deadline
  // (it cancels whatever is left, e.g. a stream whose client stopped reading).
  const bool drained = service_->AwaitNoCalls(deadline);
  if (!drained) LOG(WARNING) << "grace period over: cancelling the calls still running";
  server_->Shutdown(absl::ToChronoTime(
      drained ? std::min(deadline, absl::Now() + absl::Milliseconds(100)) : absl::Now()));
  LOG(INFO) << "event=shutdown_done ms=" << absl::ToInt64Milliseconds(absl::Now() - start)
            << " drained=" << (drained ? "true" : "false");
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
