// An epoch boundary of many ranks through the real samplerd binary (issue 22): every rank opens
// its StreamShard for epoch 1 before epoch 0 is over and waits in the server; every rank ends
// epoch 0; every rank must then receive its epoch-1 shard.
//
// For each world size W (--world_sizes, the anchor W = 1 first, all in the same run) a fresh
// samplerd is started (RLIMIT_NOFILE raised for it and for this driver), C = min(W,
// --max_connections) client connections are opened (distinct channels, each its own TCP
// connection), and the W streams are spread over them round-robin, driven by gRPC's callback
// client API (no thread per stream here either). Reported per W:
//   rss_idle / rss_job / rss_connected / rss_waiting   the server's VmRSS at start, with the
//                                            job created, with the C connections open too, and
//                                            with the W streams waiting
//   per_connection, per_waiting_stream       the differences divided by C and by W
//   threads_waiting                          the server's threads with the W streams waiting
//   end_epoch_s                              the W - 1 first EndEpoch calls, made while the W
//                                            streams wait (at most 256 in flight)
//   boundary_first_ms / boundary_all_ms      from the last EndEpoch sent to the first chunk at
//                                            every rank / to the last chunk at every rank
// The job: N = --num_samples (the same for every W, so the plan costs the same), uniform, no
// persistence; rank r's shard holds N / W indices.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/metrics/process_metrics.h"
#include "tests/samplerd_process.h"

ABSL_FLAG(std::string, samplerd, "bazel-bin/server/samplerd", "the samplerd binary");
ABSL_FLAG(std::string, world_sizes, "1,64,1024,16384", "world sizes, in order (anchor first)");
ABSL_FLAG(int, max_connections, 4096,
          "most client connections (each a file descriptor here "
          "and one in the server)");
ABSL_FLAG(uint64_t, num_samples, 1 << 20, "N of every job");
ABSL_FLAG(std::string, server_flags, "", "extra samplerd flags, comma-separated");

namespace samplerd {
namespace {

// GET `url` ("http://127.0.0.1:PORT/metrics") over a plain socket; empty on failure.
std::string HttpGet(const std::string& url) {
  const std::string prefix = "http://127.0.0.1:";
  if (url.rfind(prefix, 0) != 0) return "";
  const std::string rest = url.substr(prefix.size());
  const size_t slash = rest.find('/');
  int port = 0;
  if (!absl::SimpleAtoi(rest.substr(0, slash), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        absl::StrCat("GET ", slash == std::string::npos ? "/" : rest.substr(slash),
                     " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

// The value of the sample `series` (its full name with labels) in a text exposition; -1 if absent.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

// One rank's StreamShard of epoch 1.
class ShardRead final : public grpc::ClientReadReactor<v1::ShardChunk> {
 public:
  ShardRead(v1::Sampler::Stub* stub, const std::string& job, uint32_t rank, uint32_t world,
            std::atomic<int64_t>* first_seen, std::atomic<int64_t>* done)
      : first_seen_(first_seen), done_(done) {
    request_.set_job(job);
    request_.set_epoch(1);
    request_.set_rank(rank);
    request_.set_world_size(world);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    stub->async()->StreamShard(&context_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (indices_ == 0) {
      first_ = absl::Now();
      ++*first_seen_;
    }
    indices_ += chunk_.indices32_size() + chunk_.indices64_size();
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    last_ = absl::Now();
    finished_ = true;
    ++*done_;
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  absl::Time first() const { return first_; }
  absl::Time last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  uint64_t indices() const { return indices_; }

 private:
  grpc::ClientContext context_;
  v1::StreamShardRequest request_;
  v1::ShardChunk chunk_;
  std::atomic<int64_t>* const first_seen_;
  std::atomic<int64_t>* const done_;
  uint64_t indices_ = 0;
  absl::Time first_;
  absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Ends epoch 0 for `ranks`, at most `in_flight` calls at once; dies on an error.
void EndEpochs(const std::vector<std::unique_ptr<v1::Sampler::Stub>>& stubs, const std::string& job,
               const std::vector<uint32_t>& ranks, int in_flight) {
  absl::Mutex mu;
  int running = 0;
  int failed = 0;
  std::string first_error;
  for (uint32_t rank : ranks) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return running < in_flight; };
      mu.Await(absl::Condition(&room));
      ++running;
    }
    auto* context = new grpc::ClientContext;
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    auto* request = new v1::EndEpochRequest;
    request->set_job(job);
    request->set_epoch(0);
    request->set_rank(rank);
    auto* response = new v1::EndEpochResponse;
    stubs[rank % stubs.size()]->async()->EndEpoch(
        context, request, response, [&, context, request, response](grpc::Status s) {
          absl::MutexLock lock(&mu);
          if (!s.ok() && failed++ == 0) {
            first_error = absl::StrCat(s.error_code(), " ", s.error_message());
          }
          --running;
          delete context;
          delete request;
          delete response;
        });
  }
  absl::MutexLock lock(&mu);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return running == 0; };
  mu.Await(absl::Condition(&idle));
  if (failed > 0) {
    std::fprintf(stderr, "%d EndEpoch calls failed, e.g. %s\n", failed, first_error.c_str());
    std::exit(1);
  }
}

void Die(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::exit(1);
}

void RunWorld(uint32_t world) {
  std::vector<std::string> flags = {"--metrics_port=0", "--max_samples_per_job=4000000000"};
  for (absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_server_flags), ',', absl::SkipEmpty())) {
    flags.emplace_back(f);
  }
  testutil::SamplerdProcess server(absl::GetFlag(FLAGS_samplerd), 0, flags);
  if (server.address().empty()) Die("samplerd did not start");
  const std::string metrics_line = server.NextLine();
  absl::string_view metrics_view = metrics_line;
  if (!absl::ConsumePrefix(&metrics_view, "samplerd metrics on ")) Die("no metrics line");
  const std::string metrics_url(metrics_view);
  const pid_t pid = server.pid();
  absl::SleepFor(absl::Milliseconds(300));
  const int64_t rss_idle = metrics::ReadProcessResources(pid).resident_bytes / 1024;

  const std::string job = absl::StrCat("w", world);
  {
    grpc::ClientContext context;
    v1::CreateJobRequest request;
    request.set_name(job);
    request.mutable_spec()->set_num_samples(absl::GetFlag(FLAGS_num_samples));
    request.mutable_spec()->set_world_size(world);
    request.mutable_spec()->set_seed(42);
    v1::Job created;
    auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
    grpc::Status s = v1::Sampler::NewStub(channel)->CreateJob(&context, request, &created);
    if (!s.ok()) Die(absl::StrCat("CreateJob: ", s.error_message()));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const int64_t rss_job = metrics::ReadProcessResources(pid).resident_bytes / 1024;
  const int connections =
      static_cast<int>(std::min<uint32_t>(world, absl::GetFlag(FLAGS_max_connections)));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // Its own subchannel: its own socket.
    args.SetInt("samplerd.bench.connection", c);
    channels.push_back(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    stubs.push_back(v1::Sampler::NewStub(channels.back()));
  }
  for (int c = 0; c < connections; ++c) {
    if (!channels[c]->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(60))) {
      Die(absl::StrCat("connection ", c, " did not connect"));
    }
  }
  absl::SleepFor(absl::Milliseconds(300));
  const int64_t rss_connected = metrics::ReadProcessResources(pid).resident_bytes / 1024;

  std::atomic<int64_t> first_seen{0}, done{0};
  std::vector<std::unique_ptr<ShardRead>> reads;
  reads.reserve(world);
  for (uint32_t r = 0; r < world; ++r) {
    reads.push_back(std::make_unique<ShardRead>(stubs[r % connections].get(), job, r, world,
                                                &first_seen, &done));
  }
  // Every stream waiting in the server (its own gauge), or a stream failed.
  const std::string waiting_series = "samplerd_calls_waiting{method=\"StreamShard\"}";
  const absl::Time wait_limit = absl::Now() + absl::Minutes(5);
  double waiting = 0;
  while ((waiting = Sample(HttpGet(metrics_url), waiting_series)) < world) {
    if (done.load() > 0 || absl::Now() > wait_limit) {
      Die(absl::StrCat("W=", world, ": ", waiting, " streams waiting, ", done.load(), " ended"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const int64_t rss_waiting = metrics::ReadProcessResources(pid).resident_bytes / 1024;
  const int64_t threads_waiting = metrics::ReadProcessResources(pid).threads;

  std::vector<uint32_t> first_ranks;
  for (uint32_t r = 0; r + 1 < world; ++r) first_ranks.push_back(r);
  const absl::Time end_start = absl::Now();
  EndEpochs(stubs, job, first_ranks, 256);
  const double end_epoch_s = absl::ToDoubleSeconds(absl::Now() - end_start);
  if (done.load() > 0) Die("a stream ended before the boundary");

  const absl::Time boundary = absl::Now();
  EndEpochs(stubs, job, {world - 1}, 1);
  const absl::Time done_limit = absl::Now() + absl::Minutes(5);
  while (done.load() < world && absl::Now() < done_limit) absl::SleepFor(absl::Milliseconds(1));
  absl::Time first_all = boundary, last_all = boundary;
  uint64_t indices = 0;
  int failed = 0;
  for (auto& read : reads) {
    if (!read->status().ok() && failed++ == 0) {
      std::fprintf(stderr, "rank stream failed: %d %s\n", read->status().error_code(),
                   read->status().error_message().c_str());
    }
    first_all = std::max(first_all, read->first());
    last_all = std::max(last_all, read->last());
    indices += read->indices();
  }
  if (failed > 0 || done.load() < world) {
    Die(absl::StrCat("W=", world, ": ", failed, " streams failed, ", world - done.load(),
                     " never ended"));
  }
  if (indices != absl::GetFlag(FLAGS_num_samples) / world * world) {
    Die(absl::StrCat("W=", world, ": received ", indices, " indices"));
  }
  const double per_connection = static_cast<double>(rss_connected - rss_job) * 1024 / connections;
  const double per_stream = static_cast<double>(rss_waiting - rss_connected) * 1024 / world;
  std::printf(
      "{\"world_size\": %u, \"connections\": %d, \"rss_idle_kib\": %ld, \"rss_job_kib\": %ld, "
      "\"rss_connected_kib\": "
      "%ld, \"rss_waiting_kib\": %ld, \"bytes_per_connection\": %.0f, "
      "\"bytes_per_waiting_stream\": %.0f, \"threads_waiting\": %ld, \"end_epoch_s\": %.3f, "
      "\"boundary_first_ms\": %.1f, \"boundary_all_ms\": %.1f}\n",
      world, connections, rss_idle, rss_job, rss_connected, rss_waiting, per_connection, per_stream,
      threads_waiting, end_epoch_s, absl::ToDoubleMilliseconds(first_all - boundary),
      absl::ToDoubleMilliseconds(last_all - boundary));
  std::fflush(stdout);
  reads.clear();
  stubs.clear();
  channels.clear();
  server.Signal(SIGTERM);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The ranks' side runs on the server's cores: without Debian's Abseil deadlock detection, as
  // samplerd and trainers run (client/cpp/loss_reporter.h).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Room for the connections, here and in the server (which inherits the limit).
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  std::printf("RLIMIT_NOFILE %lu; %ld cores\n", static_cast<unsigned long>(limit.rlim_cur),
              sysconf(_SC_NPROCESSORS_ONLN));
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_world_sizes), ',')) {
    uint32_t world = 0;
    if (!absl::SimpleAtoi(w, &world) || world == 0) samplerd::Die("bad --world_sizes");
    samplerd::RunWorld(world);
  }
  return 0;
}
