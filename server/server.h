// Server: samplerd's gRPC server (the Sampler service, health checking and reflection) with its
// job registry and compute backend. main.cc fills Options from flags and calls Create.
//
// Thread-safe. Shutdown() may be called from any thread, once or more.
#ifndef SAMPLERD_SERVER_SERVER_H_
#define SAMPLERD_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/compute_backend.h"
#include "server/job_registry.h"
#include "server/sampler_service.h"

namespace samplerd {

struct Options {
  std::string host = "127.0.0.1";
  int port = 50051;  // 0: any free port (see Server::port()).
  // Persistence directory (snapshots + write-ahead log). Not used yet: state lives in memory.
  std::string data_dir;
  std::string backend = "auto";  // auto | cpu | cuda.
  int planner_threads = 0;       // CPU backend threads; 0 = all cores.
  size_t max_jobs = 64;
  uint64_t max_samples_per_job = uint64_t{1} << 32;
  int max_message_bytes = 64 << 20;
  int max_server_threads = 1024;  // Concurrent synchronous calls (e.g. rank streams).
  absl::Duration grace_period = absl::Seconds(10);
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

  // Stops accepting calls, wakes waiting streams with UNAVAILABLE, lets in-flight calls finish
  // within the grace period, then cancels the rest.
  void Shutdown();
  // Blocks until the server has shut down.
  void Wait();

 private:
  Server(const Options& options, std::unique_ptr<ComputeBackend> backend);

  const Options options_;
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<SamplerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SERVER_H_
