// LossReporter over real gRPC on loopback, against samplerd's own ingest in the same run.
//
// The server is an in-process samplerd (server/server.h, loopback, port 0, in memory) unless
// --address names a running one. Measures:
//   report_cost  host time of one LossReporter::Report of 512 pairs (median, p99, max), at a
//                trainer-like pace (one call every --pace_us), so that the calls never wait for
//                room: the cost a training step pays. Its input arrays are in cache, as a
//                step's fresh outputs are.
//   reporter     end-to-end (index, loss) pairs/s through LossReporters: --ranks threads, each
//                reporting its whole shard of N in Report calls of 512 pairs as fast as it can,
//                then Flush (timed until every rank's Flush returned: all acknowledged).
//   anchor       the same pairs sent by SamplerClient::ReportLosses from prebuilt LossBatch
//                messages of 65536 pairs, one stream per rank (what bench/server_bench calls
//                ingest): the server's own rate, which the reporter cannot beat.
//   device_cost  (with a GPU) host time of one ReportFromDevice of 512 pairs, same pace: the
//                call only enqueues two copies and an event on the trainer's stream. Without a
//                GPU the line says why it was skipped.
// The two throughputs alternate, --repeats times each, on fresh jobs; medians and the ratio are
// printed. Every run checks that the server accepted each pair once (GetJobStatus).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/cpp/cuda_support.h"
#include "client/cpp/loss_reporter.h"
#include "client/cpp/sampler_client.h"
#include "server/server.h"

ABSL_FLAG(std::string, address, "", "samplerd host:port; empty: an in-process server");
ABSL_FLAG(uint64_t, num_samples, 10'000'000, "N of every job");
ABSL_FLAG(uint32_t, ranks, 2, "ranks (reporters, or anchor streams) reporting at once");
ABSL_FLAG(int, repeats, 3, "runs of each throughput; medians reported");
ABSL_FLAG(int, report_calls, 20000, "Report calls timed for the host cost");
ABSL_FLAG(int, pace_us, 50, "pause between the timed Report calls, microseconds");
ABSL_FLAG(bool, mutex_deadlock_detection, true,
          "leave absl::Mutex deadlock detection as the library ships it (Debian's libabsl: on, "
          "~40 ns per lock and a process-wide graph); false: kIgnore");

namespace samplerd {
namespace {

using bench::Median;

constexpr size_t kStep = 512;  // Pairs per Report: one training step's batch.

// Job `name` (loss policy, as a trainer reweighting by loss would use) and every rank's shard
// of epoch 0 with a loss per pair.
struct Workload {
  std::vector<std::vector<uint64_t>> shards;
  std::vector<std::vector<float>> losses;
};

Workload CreateJob(SamplerClient& client, const std::string& name, uint64_t n, uint32_t ranks) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_seed(42);
  spec.set_world_size(ranks);
  spec.mutable_policy()->set_loss(v1::LOSS);
  CHECK_OK_OR_DIE(client.CreateJob(name, spec).status());
  Workload w;
  for (uint32_t r = 0; r < ranks; ++r) {
    auto shard = client.ReadShard(name, 0, r, ranks);
    CHECK_OK_OR_DIE(shard.status());
    std::vector<float> losses(shard->size());
    for (size_t k = 0; k < losses.size(); ++k) losses[k] = ((*shard)[k] % 1000) * 1e-3f;
    w.shards.push_back(*std::move(shard));
    w.losses.push_back(std::move(losses));
  }
  // The server plans the next epoch ahead after a creation: let it finish before timing.
  absl::SleepFor(absl::Seconds(2));
  return w;
}

// Every pair must have been accepted once.
void CheckAccepted(SamplerClient& client, const std::string& job, uint64_t n) {
  auto status = client.GetJobStatus(job);
  CHECK_OK_OR_DIE(status.status());
  uint64_t accepted = 0;
  for (const v1::RankProgress& rank : status->ranks()) accepted += rank.losses_accepted();
  if (accepted != n) {
    std::fprintf(stderr, "%s: the server accepted %lu pairs of %lu\n", job.c_str(),
                 static_cast<unsigned long>(accepted), static_cast<unsigned long>(n));
    std::exit(1);
  }
}

// Pairs/s through LossReporters, one per rank thread.
double ReporterThroughput(SamplerClient& client, const std::string& job, uint64_t n,
                          uint32_t ranks) {
  Workload w = CreateJob(client, job, n, ranks);
  std::vector<std::unique_ptr<LossReporter>> reporters;
  for (uint32_t r = 0; r < ranks; ++r) {
    auto reporter = LossReporter::Create(&client, job, r, ranks);
    CHECK_OK_OR_DIE(reporter.status());
    reporters.push_back(*std::move(reporter));
  }
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<uint64_t>& shard = w.shards[r];
      const std::vector<float>& losses = w.losses[r];
      for (size_t lo = 0; lo < shard.size(); lo += kStep) {
        const size_t len = std::min(kStep, shard.size() - lo);
        CHECK_OK_OR_DIE(reporters[r]->Report(0, lo, absl::MakeConstSpan(shard.data() + lo, len),
                                             absl::MakeConstSpan(losses.data() + lo, len)));
      }
      CHECK_OK_OR_DIE(reporters[r]->Flush());
    });
  }
  for (std::thread& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  uint64_t batches = 0, streams = 0;
  for (auto& reporter : reporters) {
    batches += reporter->counts().batches;
    streams += reporter->counts().streams;
    CHECK_OK_OR_DIE(reporter->Close());
  }
  CheckAccepted(client, job, n);
  CHECK_OK_OR_DIE(client.DeleteJob(job));
  std::printf(
      "{\"bench\": \"reporter\", \"pairs_per_s\": %.0f, \"batches\": %lu, "
      "\"streams\": %lu}\n",
      n / secs, static_cast<unsigned long>(batches), static_cast<unsigned long>(streams));
  std::fflush(stdout);
  return n / secs;
}

// Pairs/s of SamplerClient::ReportLosses with prebuilt batches: the server's own ingest.
double AnchorThroughput(SamplerClient& client, const std::string& job, uint64_t n, uint32_t ranks) {
  Workload w = CreateJob(client, job, n, ranks);
  std::vector<std::vector<v1::LossBatch>> per_rank(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    for (size_t lo = 0; lo < w.shards[r].size(); lo += 1 << 16) {
      const size_t hi = std::min(w.shards[r].size(), lo + (1 << 16));
      v1::LossBatch b;
      b.set_job(job);
      b.set_rank(r);
      b.set_seq(per_rank[r].size());
      b.set_first_position(lo);
      b.mutable_indices()->Add(w.shards[r].begin() + lo, w.shards[r].begin() + hi);
      b.mutable_losses()->Add(w.losses[r].begin() + lo, w.losses[r].begin() + hi);
      per_rank[r].push_back(std::move(b));
    }
  }
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { CHECK_OK_OR_DIE(client.ReportLosses(per_rank[r]).status()); });
  }
  for (std::thread& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  CheckAccepted(client, job, n);
  CHECK_OK_OR_DIE(client.DeleteJob(job));
  std::printf("{\"bench\": \"anchor\", \"pairs_per_s\": %.0f}\n", n / secs);
  std::fflush(stdout);
  return n / secs;
}

struct Cost {
  double median_us, p99_us, max_us;
};

Cost CostOf(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100], us.back()};
}

// Host time of single Report calls of 512 pairs at a trainer's pace, and, measured in the same
// iterations (same machine load), the floor: a bare copy of the same 6 KB into a batch-sized
// array, which any buffering reporter must do.
std::pair<Cost, Cost> ReportCost(SamplerClient& client, uint64_t n) {
  const std::string job = "bench-report-cost";
  Workload w = CreateJob(client, job, n, 1);
  auto reporter = LossReporter::Create(&client, job, 0, 1);
  CHECK_OK_OR_DIE(reporter.status());
  const std::vector<uint64_t>& shard = w.shards[0];
  const std::vector<float>& losses = w.losses[0];
  const int calls = std::min<int>(absl::GetFlag(FLAGS_report_calls), shard.size() / kStep);
  const absl::Duration pace = absl::Microseconds(absl::GetFlag(FLAGS_pace_us));
  std::vector<double> us;
  us.reserve(calls);
  // A step's indices and losses, as the step just produced them (in cache): the 80 MB shard
  // itself would be read from DRAM, which a trainer's own arrays are not.
  std::vector<uint64_t> step_indices(kStep);
  std::vector<float> step_losses(kStep);
  std::vector<uint64_t> floor_indices(1 << 16);
  std::vector<float> floor_losses(1 << 16);
  std::vector<double> floor_us;
  floor_us.reserve(calls);
  for (int i = 0; i < calls; ++i) {
    const size_t lo = i * kStep;
    std::copy(shard.begin() + lo, shard.begin() + lo + kStep, step_indices.begin());
    std::copy(losses.begin() + lo, losses.begin() + lo + kStep, step_losses.begin());
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK_OR_DIE((*reporter)->Report(0, lo, step_indices, step_losses));
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    const size_t at = lo % floor_indices.size();
    const auto f0 = std::chrono::steady_clock::now();
    std::copy(step_indices.begin(), step_indices.end(), floor_indices.begin() + at);
    std::copy(step_losses.begin(), step_losses.end(), floor_losses.begin() + at);
    const auto f1 = std::chrono::steady_clock::now();
    floor_us.push_back(std::chrono::duration<double, std::micro>(f1 - f0).count());
    absl::SleepFor(pace);
  }
  CHECK_OK_OR_DIE((*reporter)->Close());
  CheckAccepted(client, job, calls * kStep);
  CHECK_OK_OR_DIE(client.DeleteJob(job));
  return {CostOf(us), CostOf(floor_us)};
}

// Host time of single ReportFromDevice calls of 512 pairs at a trainer's pace; the reason when
// there is no GPU.
absl::StatusOr<Cost> DeviceCost(SamplerClient& client, uint64_t n) {
  if (absl::Status gpu = GpuAvailable(); !gpu.ok()) return gpu;
  const std::string job = "bench-device-cost";
  Workload w = CreateJob(client, job, n, 1);
  auto reporter = LossReporter::Create(&client, job, 0, 1);
  CHECK_OK_OR_DIE(reporter.status());
  const std::vector<int64_t> indices(w.shards[0].begin(), w.shards[0].end());
  const int calls = std::min<int>(absl::GetFlag(FLAGS_report_calls), indices.size() / kStep);
  int64_t* d_indices = nullptr;
  float* d_losses = nullptr;
  const size_t pairs = calls * kStep;
  CHECK_OK_OR_DIE(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_indices), pairs * 8), "malloc"));
  CHECK_OK_OR_DIE(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&d_losses), pairs * 4), "malloc"));
  CHECK_OK_OR_DIE(CudaStatus(
      cudaMemcpy(d_indices, indices.data(), pairs * 8, cudaMemcpyHostToDevice), "memcpy"));
  CHECK_OK_OR_DIE(CudaStatus(
      cudaMemcpy(d_losses, w.losses[0].data(), pairs * 4, cudaMemcpyHostToDevice), "memcpy"));
  // Pageable copies may still be in flight on the legacy stream, which `stream` (non-blocking)
  // does not wait for.
  CHECK_OK_OR_DIE(CudaStatus(cudaDeviceSynchronize(), "synchronize"));
  cudaStream_t stream;
  CHECK_OK_OR_DIE(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  const absl::Duration pace = absl::Microseconds(absl::GetFlag(FLAGS_pace_us));
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    const size_t lo = i * kStep;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK_OR_DIE(
        (*reporter)->ReportFromDevice(0, lo, d_indices + lo, d_losses + lo, kStep, stream));
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    absl::SleepFor(pace);
  }
  CHECK_OK_OR_DIE((*reporter)->Close());
  CheckAccepted(client, job, pairs);
  CHECK_OK_OR_DIE(client.DeleteJob(job));
  cudaStreamDestroy(stream);
  cudaFree(d_indices);
  cudaFree(d_losses);
  return CostOf(us);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  using namespace samplerd;  // NOLINT: a main.
  std::unique_ptr<Server> server;
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    Options options;
    options.port = 0;
    options.plaintext = true;  // Loopback (Options::host's default).
    options.max_samples_per_job = uint64_t{1} << 34;
    auto created = Server::Create(options);
    CHECK_OK_OR_DIE(created.status());
    server = *std::move(created);
    address = server->address();
  }
  ClientOptions options;
  options.timeout = absl::Seconds(120);
  auto client_or = SamplerClient::Create(address, options);
  CHECK_OK_OR_DIE(client_or.status());
  SamplerClient& client = **client_or;
  const uint64_t n = absl::GetFlag(FLAGS_num_samples);
  const uint32_t ranks = absl::GetFlag(FLAGS_ranks);

  const auto [cost, floor] = ReportCost(client, n);
  std::printf(
      "{\"bench\": \"report_cost\", \"pairs\": %zu, \"median_us\": %.2f, \"p99_us\": %.2f, "
      "\"max_us\": %.1f, \"copy_floor_median_us\": %.2f, \"copy_floor_p99_us\": %.2f}\n",
      kStep, cost.median_us, cost.p99_us, cost.max_us, floor.median_us, floor.p99_us);
  std::fflush(stdout);
  const absl::StatusOr<Cost> device = DeviceCost(client, n);
  if (device.ok()) {
    std::printf(
        "{\"bench\": \"device_cost\", \"pairs\": %zu, \"median_us\": %.2f, "
        "\"p99_us\": %.2f, \"max_us\": %.1f}\n",
        kStep, device->median_us, device->p99_us, device->max_us);
  } else {
    std::printf("{\"bench\": \"device_cost\", \"skipped\": \"%s\"}\n",
                std::string(device.status().message()).c_str());
  }
  std::fflush(stdout);
  std::vector<double> reporter, anchor;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    anchor.push_back(AnchorThroughput(client, absl::StrCat("bench-anchor-", rep), n, ranks));
    reporter.push_back(ReporterThroughput(client, absl::StrCat("bench-reporter-", rep), n, ranks));
  }
  const double r = Median(reporter), a = Median(anchor);
  std::printf("\n| what (N = %.0e, %u ranks) | measured | target |\n|---|---|---|\n", (double)n,
              ranks);
  std::printf("| Report of %zu pairs, host time, median / p99 | %.2f / %.2f us | <= 5 us |\n",
              kStep, cost.median_us, cost.p99_us);
  std::printf(
      "| bare copy of the same 6 KB, same iterations (floor), median / p99 | %.2f / %.2f us "
      "| |\n",
      floor.median_us, floor.p99_us);
  std::printf(
      "| loss pairs/s through LossReporter (Report of 512, Flush) | %.1f M/s | >= 20 M/s |\n",
      r / 1e6);
  std::printf(
      "| loss pairs/s, SamplerClient::ReportLosses of prebuilt batches (anchor) | %.1f M/s "
      "| |\n",
      a / 1e6);
  std::printf("| ratio reporter / anchor | %.2f | |\n", r / a);
  if (server) server->Shutdown();
  return 0;
}
