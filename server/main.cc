// samplerd: flags only. Fills Options, starts the server, prints the bound address, re-reads
// the tokens file on SIGHUP, and shuts down gracefully on SIGTERM/SIGINT (exit 0).
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
#include "absl/synchronization/mutex.h"
#include "server/log_fields.h"
#include "server/logging_setup.h"
#include "server/server.h"
#include "server/transport_options.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for all interfaces).");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port (printed at startup).");
ABSL_FLAG(std::string, data_dir, "",
          "Directory for persistent state (created if absent): jobs survive a crash or restart "
          "and are restored at start-up. Empty: jobs live in memory only.");
ABSL_FLAG(std::string, backend, "auto",
          "Compute backend: cpu; cuda (exits with an error naming what is missing when no GPU is "
          "usable); or auto: cuda when a usable GPU is present, else cpu (logged with the "
          "reason).");
ABSL_FLAG(int, cuda_device, 0, "The CUDA device of --backend=cuda/auto.");
ABSL_FLAG(int, planner_threads, 0, "CPU backend threads (0 = all cores).");
ABSL_FLAG(int, max_jobs, 64, "Most jobs at once.");
ABSL_FLAG(uint64_t, max_samples_per_job, uint64_t{1} << 32, "Largest num_samples of a job.");
ABSL_FLAG(int, rewind_epochs, -1,
          "Epoch starts each job keeps for RewindJob, the current one's included (0: none; -1: "
          "3 with --data_dir, where they are snapshot files, and 0 without, where each costs up "
          "to 12 bytes per sample, counted in the job's memory estimate, and a copy of the loss "
          "statistics at every epoch boundary).");
ABSL_FLAG(uint64_t, max_memory_bytes, 0,
          "Memory budget of the server, in bytes: --max_stream_buffer_bytes and "
          "--max_transport_buffer_bytes are taken from it at start-up (the server refuses to start "
          "if they leave nothing), and a CreateJob whose estimate does not fit in what the jobs "
          "leave of the rest gets RESOURCE_EXHAUSTED (see proto/samplerd.proto JobSpec). 0 = 80% "
          "of the memory of this machine or container (cgroup limit).");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest gRPC message, both directions.");
ABSL_FLAG(int, max_server_threads, samplerd::kDefaultMaxHandlerThreads,
          "Most threads running calls' blocking work (planning, disk syncs); a call waiting for "
          "a plan or for its client holds none.");
ABSL_FLAG(uint64_t, max_stream_buffer_bytes, 0,
          "Most bytes all open StreamShard calls together may buffer (about 16 bytes per index "
          "of a chunk, 24 with importance weights); a stream beyond it gets RESOURCE_EXHAUSTED. "
          "Taken from --max_memory_bytes. 0 = a quarter of --max_memory_bytes, at most 1 GiB.");
ABSL_FLAG(uint64_t, max_transport_buffer_bytes, 0,
          "Most bytes gRPC's transports may hold (its resource quota): the connections' read "
          "buffers (~13 KB each) and the requests being received and decoded (a request is "
          "read whole before it is checked); beyond it gRPC closes idle connections and resets "
          "streams (RESOURCE_EXHAUSTED). Taken from --max_memory_bytes. 0 = a quarter of "
          "--max_memory_bytes, at most 1 GiB.");
ABSL_FLAG(int, grace_period_ms, 10000, "On SIGTERM, time for in-flight calls to finish.");
ABSL_FLAG(int, keepalive_time_ms,
          absl::ToInt64Milliseconds(samplerd::TransportOptions().keepalive_time),
          "The server pings a connection after this long without activity (docs/OPERATIONS.md, "
          "\"Connections across real networks\").");
ABSL_FLAG(int, keepalive_timeout_ms,
          absl::ToInt64Milliseconds(samplerd::TransportOptions().keepalive_timeout),
          "A connection whose ping is not acknowledged within this is closed (its calls end).");
ABSL_FLAG(int, min_client_ping_interval_ms,
          absl::ToInt64Milliseconds(samplerd::TransportOptions().min_client_ping_interval),
          "Shortest interval between a client's keepalive pings accepted; more frequent pings "
          "close the connection (GOAWAY too_many_pings). At most the clients' keepalive time "
          "(10000).");
ABSL_FLAG(int, max_connection_idle_ms,
          absl::ToInt64Milliseconds(samplerd::TransportOptions().max_connection_idle),
          "A connection with no call in flight for this long is closed (clients reconnect on "
          "their next call); 0 keeps idle connections open.");
ABSL_FLAG(int, handshake_timeout_ms,
          absl::ToInt64Milliseconds(samplerd::TransportOptions().handshake_timeout),
          "A connection that has not completed its TLS handshake and HTTP/2 settings within "
          "this is closed.");
ABSL_FLAG(bool, accept_compressed_requests, false,
          "Decode gzip/deflate-compressed requests. Off: they are refused (UNIMPLEMENTED) before "
          "being inflated; samplerd's clients never compress.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file with the server's certificate chain (leaf first); with --tls_key, serves TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM file with the private key of --tls_cert (unencrypted).");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM file of CA certificates: when set, every client must present a certificate signed "
          "by one of them (mutual TLS).");
ABSL_FLAG(bool, plaintext, false,
          "Serve without TLS (for loopback, or a network that is already encrypted). Either this "
          "or --tls_cert/--tls_key is required.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens, one per line: \"TOKEN admin\" or \"TOKEN jobs=NAME,...\" "
          "(docs/SECURITY.md). When set, every Sampler call needs \"authorization: Bearer TOKEN\"; "
          "re-read on SIGHUP. Keep it chmod 600.");
ABSL_FLAG(int, log_level, 0, "Minimum log level to stderr: 0 INFO, 1 WARNING, 2 ERROR.");
ABSL_FLAG(int, metrics_port, -1,
          "Port of the Prometheus metrics endpoint (http://HOST:PORT/metrics, see "
          "docs/OPERATIONS.md): -1 none, 0 a free port (printed at startup).");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "Address the metrics endpoint listens on. The metrics name every job: an address "
          "other than loopback needs --metrics_token_file.");
ABSL_FLAG(std::string, metrics_token_file, "",
          "File holding the bearer token that /metrics then requires (Prometheus: "
          "authorization.credentials_file); required with a --metrics_host other than "
          "loopback. Keep it chmod 600.");

// glog's --v, as an Abseil flag (see server/logging_setup.h for why it is declared here).
ABSL_FLAG(int, v, 0,
          "Verbose logging: 1 adds a line per RPC (event=rpc method=... code=... ms=...). "
          "Events and errors are logged at every level.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sampler coordination service for distributed data-parallel training.\n"
      "Prints \"samplerd listening on HOST:PORT\" once serving; SIGTERM/SIGINT stop it "
      "gracefully; SIGHUP re-reads --auth_tokens_file.\n"
      "Usage: samplerd (--tls_cert=PEM --tls_key=PEM [--tls_client_ca=PEM] | --plaintext)\n"
      "                [--host=127.0.0.1] [--port=50051 | --port=0] [--auth_tokens_file=FILE] "
      "[flags]");
  // --help lists this file's flags (Abseil would look for samplerd.cc by the binary's name).
  absl::FlagsUsageConfig usage;
  usage.contains_helpshort_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_help_flags = usage.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil is built with absl::Mutex deadlock detection on: every lock of every
  // absl::Mutex (gRPC's included) goes through one process-wide spinlock and a graph of the
  // mutexes held together, whose nodes grow with the calls alive. At an epoch boundary of 4,096
  // ranks it took ~14% of samplerd's CPU and made the boundary super-linear in the ranks
  // (bench/RESULTS.md, "Epoch boundary of many ranks"). The tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  samplerd::InitLogging(argv[0], absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_v));

  // Block the signals in every thread; this thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  samplerd::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  options.planner_threads = absl::GetFlag(FLAGS_planner_threads);
  options.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.max_samples_per_job = absl::GetFlag(FLAGS_max_samples_per_job);
  options.rewind_epochs = absl::GetFlag(FLAGS_rewind_epochs);
  options.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_server_threads = absl::GetFlag(FLAGS_max_server_threads);
  options.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  options.max_transport_buffer_bytes = absl::GetFlag(FLAGS_max_transport_buffer_bytes);
  options.grace_period = absl::Milliseconds(absl::GetFlag(FLAGS_grace_period_ms));
  options.transport.keepalive_time = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_time_ms));
  options.transport.keepalive_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_timeout_ms));
  options.transport.min_client_ping_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_min_client_ping_interval_ms));
  options.transport.max_connection_idle =
      absl::GetFlag(FLAGS_max_connection_idle_ms) == 0
          ? absl::InfiniteDuration()
          : absl::Milliseconds(absl::GetFlag(FLAGS_max_connection_idle_ms));
  options.transport.handshake_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_handshake_timeout_ms));
  options.transport.accept_compressed_requests = absl::GetFlag(FLAGS_accept_compressed_requests);
  options.plaintext = absl::GetFlag(FLAGS_plaintext);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.metrics_token_file = absl::GetFlag(FLAGS_metrics_token_file);

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
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) {
    // A bad file keeps the tokens in use: a typo must not lock every trainer out.
    if (options.auth_tokens_file.empty()) {
      samplerd::LogEvent("event=reload_tokens result=skipped reason=no_auth_tokens_file");
    } else if (absl::Status s = (*server)->ReloadAuthTokens(); s.ok()) {
      samplerd::LogEvent(absl::StrCat("event=reload_tokens result=reloaded file=",
                                      samplerd::LogValue(options.auth_tokens_file)));
    } else {
      samplerd::LogErrorEvent(absl::StrCat("event=reload_tokens result=kept_tokens_in_use error=",
                                           samplerd::LogValue(s.message())));
    }
  }
  samplerd::LogEvent(absl::StrCat("event=signal signal=", sigabbrev_np(signal)));
  (*server)->Shutdown();
  (*server)->Wait();
  return 0;
}
