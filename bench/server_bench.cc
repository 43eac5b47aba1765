// End-to-end throughput of a running samplerd, over real gRPC (bench/server_bench.sh starts the
// real binary on loopback and passes its address).
//
// Measures, each on its own job:
//   stream_1      indices/s streamed to one rank (world_size 1, the whole epoch).
//   stream_64     indices/s streamed to 64 concurrent ranks (aggregate).
//   ingest        (index, loss) pairs/s accepted by ReportLosses (several concurrent streams).
//   boundary      epoch-boundary latency: last EndEpoch -> first chunk of the next epoch, with the
//                 loss policy (weights recomputed from the reported losses, then a new plan).
// Prints one JSON object per line, then a summary table.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "client/cpp/sampler_client.h"

ABSL_FLAG(std::string, address, "", "samplerd address host:port");
ABSL_FLAG(uint64_t, num_samples, 10'000'000, "N of every benchmark job");
ABSL_FLAG(int, repeats, 3, "repetitions; the median is reported");
ABSL_FLAG(int, ingest_streams, 2, "concurrent ReportLosses streams");

namespace samplerd {
namespace {

using bench::Median;

v1::JobSpec Spec(uint64_t n, uint32_t world_size, v1::LossPolicy loss) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_seed(42);
  spec.set_world_size(world_size);
  spec.mutable_policy()->set_loss(loss);
  return spec;
}

// Streams every rank's shard of `epoch` concurrently; returns the indices received.
uint64_t StreamAllRanks(SamplerClient& client, const std::string& job, uint64_t epoch,
                        uint32_t world_size) {
  std::atomic<uint64_t> received{0};
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      CHECK_OK_OR_DIE(
          client.StreamShard(job, epoch, r, world_size, 0, false, [&](const ShardSlice& s) {
            received += s.indices.size();
            return absl::OkStatus();
          }));
    });
  }
  for (auto& t : threads) t.join();
  return received.load();
}

// Indices/s to `world_size` concurrent ranks; each repeat is a fresh epoch-0 job.
double StreamThroughput(SamplerClient& client, uint64_t n, uint32_t world_size) {
  std::vector<double> rates;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    const std::string job = absl::StrCat("bench-stream-", world_size, "-", rep);
    CHECK_OK_OR_DIE(client.CreateJob(job, Spec(n, world_size, v1::NONE)).status());
    // Wait for the plan so that only streaming is timed.
    while (!client.GetJob(job)->plan_ready()) absl::SleepFor(absl::Milliseconds(5));
    const absl::Time start = absl::Now();
    const uint64_t got = StreamAllRanks(client, job, 0, world_size);
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    rates.push_back(got / secs);
    CHECK_OK_OR_DIE(client.DeleteJob(job));
  }
  return Median(rates);
}

// Loss batches of `batch` pairs covering rank `rank`'s whole shard of `epoch`, in shard order
// (as a trainer reports them, step after step): the shard is read from the server first.
std::vector<v1::LossBatch> LossBatches(SamplerClient& client, const std::string& job,
                                       uint64_t epoch, uint32_t rank, uint32_t world_size,
                                       uint64_t batch) {
  auto shard = client.ReadShard(job, epoch, rank, world_size);
  CHECK_OK_OR_DIE(shard.status());
  std::vector<v1::LossBatch> batches;
  uint64_t seq = 0;
  for (uint64_t lo = 0; lo < shard->size(); lo += batch) {
    v1::LossBatch b;
    b.set_job(job);
    b.set_epoch(epoch);
    b.set_rank(rank);
    b.set_seq(seq++);
    const uint64_t hi = std::min<uint64_t>(shard->size(), lo + batch);
    b.mutable_indices()->Reserve(hi - lo);
    b.mutable_losses()->Reserve(hi - lo);
    b.set_first_position(lo);  // Consecutive positions, as a trainer reports them.
    for (uint64_t p = lo; p < hi; ++p) {
      const uint64_t index = (*shard)[p];
      b.add_indices(index);
      b.add_losses(static_cast<float>(index % 1000) * 1e-3f);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

// Loss pairs/s: `streams` ranks each report a disjoint 1/streams of the samples.
double IngestThroughput(SamplerClient& client, uint64_t n) {
  const int streams = absl::GetFlag(FLAGS_ingest_streams);
  std::vector<double> rates;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    const std::string job = absl::StrCat("bench-ingest-", rep);
    CHECK_OK_OR_DIE(client.CreateJob(job, Spec(n, streams, v1::LOSS)).status());
    std::vector<std::vector<v1::LossBatch>> per_stream;
    for (int s = 0; s < streams; ++s) {
      per_stream.push_back(LossBatches(client, job, 0, s, streams, 1 << 16));
    }
    // The server plans the next epoch ahead in the background after a creation (uniform plans
    // do not depend on the weights): let it finish, so that only the ingest is timed.
    absl::SleepFor(absl::Seconds(2));
    std::atomic<uint64_t> accepted{0};
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads;
    for (int s = 0; s < streams; ++s) {
      threads.emplace_back([&, s] {
        auto summary = client.ReportLosses(per_stream[s]);
        CHECK_OK_OR_DIE(summary.status());
        accepted += summary->accepted();
      });
    }
    for (auto& t : threads) t.join();
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (accepted.load() != n) {
      std::fprintf(stderr, "ingest: accepted %lu of %lu\n", (unsigned long)accepted.load(),
                   (unsigned long)n);
      std::exit(1);
    }
    rates.push_back(n / secs);
    CHECK_OK_OR_DIE(client.DeleteJob(job));
  }
  return Median(rates);
}

// Milliseconds from the last EndEpoch to the first chunk of the next epoch, loss policy.
double BoundaryLatencyMs(SamplerClient& client, uint64_t n) {
  const std::string job = "bench-boundary";
  const uint32_t world_size = 2;
  CHECK_OK_OR_DIE(client.CreateJob(job, Spec(n, world_size, v1::LOSS)).status());
  std::vector<double> latencies;
  for (int epoch = 0; epoch < absl::GetFlag(FLAGS_repeats); ++epoch) {
    for (uint32_t r = 0; r < world_size; ++r) {
      CHECK_OK_OR_DIE(
          client.ReportLosses(LossBatches(client, job, epoch, r, world_size, 1 << 16)).status());
    }
    // A real epoch trains for a while between its shard and its end: give the server that
    // time (it plans ahead where plans do not depend on the weights).
    absl::SleepFor(absl::Seconds(1));
    CHECK_OK_OR_DIE(client.EndEpoch(job, epoch, 0).status());
    const absl::Time start = absl::Now();
    CHECK_OK_OR_DIE(client.EndEpoch(job, epoch, 1).status());
    absl::Time first_chunk;
    bool got_first = false;
    // Stop after the first chunk: that is what is measured.
    absl::Status s =
        client.StreamShard(job, epoch + 1, 0, world_size, 0, false, [&](const ShardSlice&) {
          first_chunk = absl::Now();
          got_first = true;
          return absl::CancelledError("first chunk received");
        });
    if (!got_first) CHECK_OK_OR_DIE(s.ok() ? absl::InternalError("no chunk streamed") : s);
    latencies.push_back(absl::ToDoubleMilliseconds(first_chunk - start));
    auto status = client.GetJobStatus(job);
    CHECK_OK_OR_DIE(status.status());
    std::printf(
        "{\"bench\": \"boundary_epoch\", \"epoch\": %d, \"ms\": %.1f, "
        "\"recompute_ms\": %.1f, \"plan_ms\": %.1f}\n",
        epoch + 1, latencies.back(), status->last_recompute_ms(), status->last_plan_ms());
  }
  CHECK_OK_OR_DIE(client.DeleteJob(job));
  return Median(latencies);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace samplerd;  // NOLINT: a main.
  const std::string address = absl::GetFlag(FLAGS_address);
  const uint64_t n = absl::GetFlag(FLAGS_num_samples);
  ClientOptions options;
  options.timeout = absl::Seconds(120);
  auto client_or = SamplerClient::Create(address, options);
  CHECK_OK_OR_DIE(client_or.status());
  SamplerClient& client = **client_or;

  const double stream1 = StreamThroughput(client, n, 1);
  std::printf("{\"bench\": \"stream_1\", \"n\": %lu, \"indices_per_s\": %.0f}\n", (unsigned long)n,
              stream1);
  std::fflush(stdout);
  const double stream64 = StreamThroughput(client, n, 64);
  std::printf("{\"bench\": \"stream_64\", \"n\": %lu, \"indices_per_s\": %.0f}\n", (unsigned long)n,
              stream64);
  std::fflush(stdout);
  const double ingest = IngestThroughput(client, n);
  std::printf("{\"bench\": \"ingest\", \"n\": %lu, \"pairs_per_s\": %.0f}\n", (unsigned long)n,
              ingest);
  std::fflush(stdout);
  const double boundary = BoundaryLatencyMs(client, n);
  std::printf("{\"bench\": \"boundary\", \"n\": %lu, \"ms\": %.1f}\n", (unsigned long)n, boundary);

  std::printf("\n| what | measured | target |\n|---|---|---|\n");
  std::printf("| indices/s to 1 rank | %.1f M/s | >= 50 M/s |\n", stream1 / 1e6);
  std::printf("| indices/s to 64 ranks (aggregate) | %.1f M/s | |\n", stream64 / 1e6);
  std::printf("| loss pairs/s ingested | %.1f M/s | >= 20 M/s |\n", ingest / 1e6);
  std::printf(
      "| epoch boundary, loss policy, N = %.0e | %.1f ms | <= 150 ms (in memory; --data_dir within "
      "15%%) |\n",
      (double)n, boundary);
  return 0;
}
