// Server: samplerd's gRPC server (the Sampler service, health checking and reflection) with its
// job registry and compute backend, and its metrics (counted by a gRPC interceptor, served over
// HTTP when asked for). main.cc fills Options from flags and calls Create.
//
// Thread-safe. Shutdown() may be called from any thread, once or more.
#ifndef SAMPLERD_SERVER_SERVER_H_
#define SAMPLERD_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/compute_backend.h"
#include "server/auth/authorizer.h"
#include "server/job_registry.h"
#include "server/memory_budget.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/registry.h"
#include "server/sampler_service.h"
#include "server/saturation_monitor.h"
#include "server/stream_budget.h"
#include "server/transport_options.h"

namespace samplerd {

inline constexpr int kMaxRewindEpochs = 1000;
inline constexpr int kDefaultRewindEpochs = 3;

// Server settings; every field has a usable default (main.cc's flags mirror them). Server::Create
// rejects out-of-range values with INVALID_ARGUMENT naming the field.
struct Options {
  // Address to listen on; "0.0.0.0" for every interface.
  std::string host = "127.0.0.1";
  // 0..65535; 0 picks a free port (read it back with Server::port()).
  int port = 50051;
  // Persistence directory: every job's snapshots and write-ahead log, under <data_dir>/jobs/.
  // Jobs found there are restored by Create (which fails, naming the file, on a corrupt one).
  // Empty: jobs live in memory only.
  std::string data_dir;
  // "cpu"; "cuda" (Create fails with FAILED_PRECONDITION naming what is missing when no GPU is
  // usable: no driver, a driver too old, no device, too little free memory); or "auto": cuda
  // when a usable GPU is present, else cpu (logged as event=backend_selected with the reason).
  std::string backend = "auto";
  // The CUDA device of the cuda backend, >= 0.
  int cuda_device = 0;
  // CPU backend worker threads, >= 0; 0 = all cores.
  int planner_threads = 0;
  // Most jobs at once, >= 1 (CreateJob beyond it: RESOURCE_EXHAUSTED).
  int max_jobs = 64;
  // Largest num_samples of a job, >= 1 (beyond it: RESOURCE_EXHAUSTED).
  uint64_t max_samples_per_job = uint64_t{1} << 32;
  // Epoch starts each job keeps for RewindJob, the current one's included, -1 to
  // kMaxRewindEpochs (0: no rewind; -1: kDefaultRewindEpochs with a data_dir, where they are
  // snapshot files on disk, 0 without). In memory they cost each job up to 12 bytes per sample
  // per start (counted in its memory estimate) and a copy of its loss statistics at every epoch
  // boundary.
  int rewind_epochs = -1;
  // Memory budget of the server, in bytes (server/memory_budget.h): the serving reserve
  // (max_stream_buffer_bytes + max_transport_buffer_bytes) is taken from it at start-up, and a
  // CreateJob whose estimate (server/job_memory.h) does not fit in what the other jobs leave of
  // the rest gets RESOURCE_EXHAUSTED before anything is allocated. 0: 80% of the memory of this
  // machine or container (DefaultMaxMemoryBytes). Create fails with INVALID_ARGUMENT naming the
  // three when the reserve leaves the jobs nothing.
  uint64_t max_memory_bytes = 0;
  // Largest gRPC message in either direction, >= 4096 bytes. Shard chunks are cut to fit it.
  int max_message_bytes = 64 << 20;
  // Most threads that run calls' blocking work (planning, disk syncs), >= 16. Calls waiting
  // for a plan or for their client hold none (SamplerService): thousands of ranks need no more.
  int max_server_threads = kDefaultMaxHandlerThreads;
  // Most bytes all open StreamShard calls together may hold for their chunks, >= 1. A call
  // holds about 16 bytes per index of its chunk (24 with importance weights, 8 more per index
  // with N > 2^32): ~1 MiB at the default chunk size, ~16-32 MiB at the largest. A call whose
  // chunk does not fit beside the others' gets RESOURCE_EXHAUSTED. See StreamBudget. 0: a
  // quarter of max_memory_bytes, at most kDefaultMaxStreamBufferBytes (1 GiB).
  uint64_t max_stream_buffer_bytes = 0;
  // Most bytes gRPC's transports may hold: the connections' read buffers and the requests being
  // received and decoded (gRPC's resource quota: server/memory_budget.h); beyond it gRPC closes
  // idle connections and resets streams (RESOURCE_EXHAUSTED). 0: a quarter of
  // max_memory_bytes, at most kDefaultMaxTransportBufferBytes (1 GiB).
  uint64_t max_transport_buffer_bytes = 0;
  // On Shutdown, how long in-flight calls may take to finish before they are cancelled (>= 0).
  absl::Duration grace_period = absl::Seconds(10);
  // Keepalive, the clients' pings accepted, idle connections, handshakes, compression
  // (server/transport_options.h; validated by ValidateTransportOptions).
  TransportOptions transport;

  // Transport security (server/auth/server_credentials.h, docs/SECURITY.md): TLS with the PEM
  // files tls_cert and tls_key, mutual TLS when tls_client_ca is set too, or `plaintext`, which
  // must be asked for: with neither, Create fails naming the flags. Tests on loopback set
  // plaintext (server/testing/test_server_options.h).
  bool plaintext = false;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Bearer tokens and what they grant (server/auth/token_table.h has the format). Empty: calls
  // need no token. Re-read by ReloadAuthTokens.
  std::string auth_tokens_file;
  // Prometheus metrics over HTTP at http://metrics_host:metrics_port/metrics
  // (docs/OPERATIONS.md): -1 serves none, 0 picks a free port (read it back with
  // Server::metrics_url()), else 1..65535. The metrics name every job (as ListJobs, which needs
  // an admin token), so they listen on loopback unless metrics_host says otherwise, and a
  // metrics_host that is not loopback needs metrics_token_file (Create fails naming both).
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  // File holding the one bearer token that /metrics then requires (Prometheus sends it with
  // `authorization: {credentials_file: ...}`); empty: none required. Read once, at start;
  // refused like the tokens file if its group or every user may write it (CheckTokenFileMode).
  std::string metrics_token_file;
};

class Server {
 public:
  // Builds the backend, binds host:port and starts serving. INVALID_ARGUMENT for bad options,
  // UNAVAILABLE if the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const Options& options);
  ~Server();

  // The bound port (the chosen one when Options::port was 0).
  int port() const { return port_; }
  std::string address() const;
  // "http://host:port/metrics" when metrics are served (Options::metrics_port >= 0), else "".
  std::string metrics_url() const;

  // Graceful stop: health checks turn NOT_SERVING (for "" and "samplerd.v1.Sampler"); waiting
  // StreamShard calls end with UNAVAILABLE and new work on jobs is refused with UNAVAILABLE;
  // StreamShard calls still writing are cancelled (clients reopen them at their next position);
  // the other calls in flight (e.g. a loss report) get up to the grace period to finish, the
  // rest is cancelled; then the server stops listening. Returns as soon as that is done (not after
  // the whole grace period when clients merely stay connected). Idempotent; blocks until done.
  void Shutdown() ABSL_LOCKS_EXCLUDED(shutdown_mu_);
  // Blocks until the server has shut down.
  void Wait();

  // Re-reads Options::auth_tokens_file (main.cc calls it on SIGHUP): calls after it see the new
  // tokens. On an error (naming the file and line) the tokens in use stay. FAILED_PRECONDITION
  // if the server has no tokens file.
  absl::Status ReloadAuthTokens();

 private:
  Server(const Options& options, const MemoryBudget& memory,
         std::unique_ptr<ComputeBackend> backend, std::unique_ptr<Authorizer> authorizer);
  // Gauges read at scrape time: jobs, their epoch, ranks ended and memory, the stream buffer,
  // the memory budget, the build.
  void AddStateGauges();

  const Options options_;
  const MemoryBudget memory_;  // From the options' three memory fields.
  std::unique_ptr<ComputeBackend> backend_;
  // Null without Options::auth_tokens_file. Before service_, which uses it.
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<JobRegistry> registry_;
  // This server's metrics (RPCs, per-job counters, state gauges); the process-wide ones are in
  // metrics::Registry::Default(). Outlives the gRPC server and the service, which update it.
  std::unique_ptr<metrics::Registry> metrics_;
  std::unique_ptr<SamplerService> service_;
  std::unique_ptr<grpc::Server> server_;
  // Health NOT_SERVING while saturated; stopped first by Shutdown (which then owns the status).
  std::unique_ptr<SaturationMonitor> saturation_;
  int port_ = 0;
  // Held for the whole of Shutdown(); taken by no call handler.
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  // Declared last: stops serving metrics before what they read is destroyed.
  std::unique_ptr<metrics::HttpExporter> metrics_exporter_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SERVER_H_
