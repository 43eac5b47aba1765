// Indices/s that ShardReader::Next delivers to the application, one rank over loopback, against
// the server alone in the same run (SamplerClient::StreamShard with an empty callback, the same
// chunk size): the reader's cost is the ratio.
//
//   bazel run -c opt //bench:shard_reader_bench -- [--address=host:port]
//
// Without --address an in-process server on a free loopback port is used.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "client/cpp/sampler_client.h"
#include "client/cpp/shard_reader.h"
#include "server/server.h"

ABSL_FLAG(std::string, address, "", "samplerd host:port; empty: an in-process server");
ABSL_FLAG(uint64_t, num_samples, 10'000'000, "N = M of the benchmark job (one rank)");
ABSL_FLAG(int, repeats, 5, "repetitions of each measurement; the median is reported");
ABSL_FLAG(std::string, batch_sizes, "512,4096,65536", "Next(n) batch sizes to measure");
ABSL_FLAG(uint32_t, chunk_size, 0, "indices per chunk asked of the server (0: its default)");
ABSL_FLAG(uint64_t, queue_capacity, uint64_t{1} << 21, "ShardReader queue capacity (indices)");

namespace samplerd {
namespace {

using bench::Median;

void DieIf(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

int Main() {
  std::unique_ptr<Server> server;
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    Options options;
    options.port = 0;
    options.plaintext = true;
    auto created = Server::Create(options);
    DieIf(created.status(), "server");
    server = *std::move(created);
    address = server->address();
  }
  auto created = SamplerClient::Create(address);
  DieIf(created.status(), "client");
  std::shared_ptr<SamplerClient> client = *std::move(created);
  const uint64_t n = absl::GetFlag(FLAGS_num_samples);
  const std::string job = absl::StrCat("bench-reader-", absl::ToUnixMicros(absl::Now()));
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(1);
  spec.set_seed(1);
  DieIf(client->CreateJob(job, spec).status(), "CreateJob");

  ShardReaderOptions options;
  options.job = job;
  options.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
  options.max_chunk_size = absl::GetFlag(FLAGS_chunk_size);
  auto reader = ShardReader::Create(client, options);
  DieIf(reader.status(), "ShardReader");
  StreamShardOptions stream_options;
  stream_options.max_chunk_size = std::min<uint64_t>(
      options.max_chunk_size == 0 ? v1::DEFAULT_SHARD_CHUNK_SIZE : options.max_chunk_size,
      options.queue_capacity / 2);

  std::vector<size_t> batch_sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_batch_sizes), ',')) {
    size_t b = 0;
    if (!absl::SimpleAtoi(s, &b) || b == 0)
      DieIf(absl::InvalidArgumentError(std::string(s)), "batch_sizes");
    batch_sizes.push_back(b);
  }
  // Interleaved, so that load from elsewhere on the machine hits both alike.
  std::vector<double> alone;
  std::vector<std::vector<double>> through_reader(batch_sizes.size());
  uint64_t checksum = 0;  // Every index is read by the "application".
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    uint64_t received = 0;
    absl::Time start = absl::Now();
    DieIf(client->StreamShard(job, 0, 0, 1, stream_options,
                              [&](const ShardSlice& slice) {
                                received += slice.indices.size();
                                return absl::OkStatus();
                              }),
          "StreamShard");
    alone.push_back(received / absl::ToDoubleSeconds(absl::Now() - start));
    for (size_t b = 0; b < batch_sizes.size(); ++b) {
      start = absl::Now();
      DieIf((*reader)->StartEpoch(0), "StartEpoch");
      uint64_t delivered = 0;
      for (;;) {
        absl::StatusOr<ShardBatch> batch = (*reader)->Next(batch_sizes[b]);
        DieIf(batch.status(), "Next");
        if (batch->end_of_shard()) break;
        for (uint64_t i : batch->indices) checksum ^= i;
        delivered += batch->indices.size();
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (delivered != n) DieIf(absl::InternalError(absl::StrCat("delivered ", delivered)), "Next");
      through_reader[b].push_back(delivered / seconds);
    }
  }
  const double anchor = Median(alone);
  std::printf(
      "{\"what\": \"server alone (StreamShard, empty callback)\", \"chunk\": %llu, "
      "\"indices_per_s\": %.0f}\n",
      static_cast<unsigned long long>(stream_options.max_chunk_size), anchor);
  for (size_t b = 0; b < batch_sizes.size(); ++b) {
    const double rate = Median(through_reader[b]);
    std::printf(
        "{\"what\": \"ShardReader::Next\", \"n\": %zu, \"indices_per_s\": %.0f, "
        "\"ratio_to_server_alone\": %.3f}\n",
        batch_sizes[b], rate, rate / anchor);
  }
  std::printf("N = %llu, one rank, %d repeats (median), queue %llu indices, checksum %llx\n",
              static_cast<unsigned long long>(n), absl::GetFlag(FLAGS_repeats),
              static_cast<unsigned long long>(options.queue_capacity),
              static_cast<unsigned long long>(checksum));
  (*reader).reset();
  DieIf(client->DeleteJob(job), "DeleteJob");
  return 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return samplerd::Main();
}
