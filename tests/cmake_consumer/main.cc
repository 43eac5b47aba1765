// A minimal trainer outside Bazel: creates a job on the samplerd at --address, reads epoch 0 with
// a ShardReader and reports its losses with a LossReporter (after asking for a batch in device
// memory, which is refused), then runs epoch 1 with an EpochLoop.
// Checks that each epoch's shard holds every sample once (one rank, M = N without replacement)
// and prints one line per epoch; exits non-zero with the error otherwise.
//
//   cmake_consumer <host:port>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/loss_reporter.h"
#include "client/cpp/sampler_client.h"
#include "client/cpp/shard_reader.h"

namespace {

constexpr char kJob[] = "cmake_consumer";
constexpr uint64_t kSamples = 1000;

float LossOf(uint64_t index) { return static_cast<float>(index % 7) * 0.5f; }

// OK if `seen` counts every sample once.
absl::Status CheckComplete(const std::vector<int>& seen, uint64_t epoch) {
  for (uint64_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 1) {
      return absl::InternalError(
          absl::StrCat("epoch ", epoch, ": sample ", i, " read ", seen[i], " times"));
    }
  }
  return absl::OkStatus();
}

// Epoch 0 by hand: the reader's batches, their losses reported, flushed, the epoch ended.
absl::Status ReadAndReport(const std::shared_ptr<samplerd::SamplerClient>& client) {
  samplerd::ShardReaderOptions options;
  options.job = kJob;
  absl::StatusOr<std::unique_ptr<samplerd::ShardReader>> reader =
      samplerd::ShardReader::Create(client, options);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<std::unique_ptr<samplerd::LossReporter>> reporter =
      samplerd::LossReporter::Create(client.get(), kJob, 0, 1);
  if (!reporter.ok()) return reporter.status();
  if (absl::Status s = (*reader)->StartEpoch(0); !s.ok()) return s;
  // The device path, with no device memory to copy to: refused, and nothing is consumed (the
  // CPU-only library has no device part; the CUDA one says why without a GPU).
  absl::StatusOr<samplerd::ShardBatch> device =
      (*reader)->NextToDevice(128, /*device_indices=*/nullptr, /*stream=*/nullptr);
  std::cout << "device path: " << device.status() << "\n";
  if (device.ok()) return absl::InternalError("NextToDevice to a null pointer succeeded");
  std::vector<int> seen(kSamples, 0);
  for (;;) {
    absl::StatusOr<samplerd::ShardBatch> batch = (*reader)->Next(128);
    if (!batch.ok()) return batch.status();
    if (batch->end_of_shard()) break;
    std::vector<float> losses;
    for (uint64_t index : batch->indices) {
      ++seen[index];
      losses.push_back(LossOf(index));
    }
    absl::Status s = (*reporter)->Report(batch->epoch, batch->position, batch->indices, losses);
    if (!s.ok()) return s;
  }
  if (absl::Status s = (*reporter)->Flush(); !s.ok()) return s;
  if (absl::Status s = CheckComplete(seen, 0); !s.ok()) return s;
  absl::StatusOr<samplerd::v1::EndEpochResponse> ended = client->EndEpoch(kJob, 0, 0);
  if (!ended.ok()) return ended.status();
  const samplerd::LossCounts counts = (*reporter)->counts();
  std::cout << "epoch 0 (ShardReader + LossReporter): read=" << kSamples
            << " accepted=" << counts.accepted << " closed=" << ended->epoch_closed() << "\n";
  return absl::OkStatus();
}

// Epoch 1 with the EpochLoop.
absl::Status RunLoop(const std::shared_ptr<samplerd::SamplerClient>& client) {
  absl::StatusOr<std::unique_ptr<samplerd::EpochLoop>> loop =
      samplerd::EpochLoop::Create(client, kJob, 0, 1);
  if (!loop.ok()) return loop.status();
  std::vector<int> seen(kSamples, 0);
  uint64_t accepted = 0;
  absl::Status s = (*loop)->Run(
      1, 1,
      [&](const samplerd::EpochBatch& batch, samplerd::LossSink& sink) {
        std::vector<float> losses;
        for (uint64_t index : batch.indices) {
          ++seen[index];
          losses.push_back(LossOf(index));
        }
        return sink.Report(losses);
      },
      [&](const samplerd::ShardEnd& end) {
        accepted = end.losses.accepted;
        return CheckComplete(seen, end.epoch);
      });
  if (!s.ok()) return s;
  std::cout << "epoch 1 (EpochLoop): read=" << kSamples << " accepted=" << accepted << "\n";
  return absl::OkStatus();
}

absl::Status Main(const std::string& address) {
  // A short retry budget (~0.35 s instead of the default 300 s that rides through restarts):
  // this program fails at once when the server is not there.
  samplerd::ClientOptions options;
  options.max_retries = 3;
  absl::StatusOr<std::unique_ptr<samplerd::SamplerClient>> created =
      samplerd::SamplerClient::Create(address, options);
  if (!created.ok()) return created.status();
  std::shared_ptr<samplerd::SamplerClient> client = *std::move(created);
  samplerd::v1::JobSpec spec;
  spec.set_num_samples(kSamples);
  spec.set_world_size(1);
  spec.set_seed(3);
  spec.mutable_policy()->set_loss(samplerd::v1::LOSS);
  if (absl::StatusOr<samplerd::v1::Job> job = client->CreateJob(kJob, spec); !job.ok()) {
    return job.status();
  }
  if (absl::Status s = ReadAndReport(client); !s.ok()) return s;
  return RunLoop(client);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <host:port>\n";
    return 2;
  }
  const absl::Status s = Main(argv[1]);
  if (!s.ok()) {
    std::cerr << "cmake_consumer: " << s << "\n";
    return 1;
  }
  return 0;
}
