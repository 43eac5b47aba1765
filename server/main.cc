// samplerd: flags only. Fills Options, starts the server, prints the bound address, and shuts
// down gracefully on SIGTERM/SIGINT (exit 0).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/logging_setup.h"
#include "server/server.h"
#include "server/stream_budget.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for all interfaces).");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port (printed at startup).");
ABSL_FLAG(std::string, data_dir, "",
          "Directory for persistent state (created if absent): jobs survive a crash or restart "
          "and are restored at start-up. Empty: jobs live in memory only.");
ABSL_FLAG(std::string, backend, "auto",
          "Compute backend: auto (the CPU backend in this build), cpu, or cuda (not built yet: "
          "exits with an error).");
ABSL_FLAG(int, planner_threads, 0, "CPU backend threads (0 = all cores).");
ABSL_FLAG(int, max_jobs, 64, "Most jobs at once.");
ABSL_FLAG(uint64_t, max_samples_per_job, uint64_t{1} << 32, "Largest num_samples of a job.");
ABSL_FLAG(uint64_t, max_memory_bytes, 0,
          "Memory budget of all jobs together, in bytes; a CreateJob whose estimate does not fit "
          "gets RESOURCE_EXHAUSTED (see proto/samplerd.proto JobSpec). 0 = 80% of the memory of "
          "this machine or container (cgroup limit).");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest gRPC message, both directions.");
ABSL_FLAG(int, max_server_threads, 1024, "Most concurrent calls (each rank stream holds one).");
ABSL_FLAG(uint64_t, max_stream_buffer_bytes, samplerd::kDefaultMaxStreamBufferBytes,
          "Most bytes all open StreamShard calls together may buffer (about 16 bytes per index "
          "of a chunk, 24 with importance weights); a stream beyond it gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, grace_period_ms, 10000, "On SIGTERM, time for in-flight calls to finish.");
ABSL_FLAG(int, log_level, 0, "Minimum log level to stderr: 0 INFO, 1 WARNING, 2 ERROR.");
ABSL_FLAG(int, metrics_port, -1,
          "Port of the Prometheus metrics endpoint (http://HOST:PORT/metrics, see "
          "docs/OPERATIONS.md): -1 none, 0 a free port (printed at startup).");
ABSL_FLAG(std::string, metrics_host, "",
          "Address the metrics endpoint listens on; empty: the same as --host.");

// glog's --v, as an Abseil flag (see server/logging_setup.h for why it is declared here).
ABSL_FLAG(int, v, 0,
          "Verbose logging: 1 adds a line per RPC (event=rpc method=... code=... ms=...). "
          "Events and errors are logged at every level.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sampler coordination service for distributed data-parallel training.\n"
      "Prints \"samplerd listening on HOST:PORT\" once serving; SIGTERM/SIGINT stop it "
      "gracefully.\n"
      "Usage: samplerd [--host=127.0.0.1] [--port=50051 | --port=0] [flags]");
  // --help lists this file's flags (Abseil would look for samplerd.cc by the binary's name).
  absl::FlagsUsageConfig usage;
  usage.contains_helpshort_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_help_flags = usage.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  samplerd::InitLogging(argv[0], absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_v));

  // Block the stop signals in every thread; this thread takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  samplerd::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.planner_threads = absl::GetFlag(FLAGS_planner_threads);
  options.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.max_samples_per_job = absl::GetFlag(FLAGS_max_samples_per_job);
  options.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_server_threads = absl::GetFlag(FLAGS_max_server_threads);
  options.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  options.grace_period = absl::Milliseconds(absl::GetFlag(FLAGS_grace_period_ms));
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);

  auto server = samplerd::Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "samplerd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Scripts and tests read the first line; the metrics line, if any, comes after it.
  std::printf("samplerd listening on %s\n", (*server)->address().c_str());
  if (!(*server)->metrics_url().empty()) {
    std::printf("samplerd metrics on %s\n", (*server)->metrics_url().c_str());
  }
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop_signals, &signal);
  samplerd::LogEvent(absl::StrCat("event=signal signal=", sigabbrev_np(signal)));
  (*server)->Shutdown();
  (*server)->Wait();
  return 0;
}
