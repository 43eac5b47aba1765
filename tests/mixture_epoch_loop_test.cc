// EpochLoop runs a mixture job (JobSpec.mixture) unchanged (issue 35 item 4): two ranks in
// threads against a real in-process samplerd over real gRPC read four epochs of a job of three
// groups, one smaller than its share of a window. Every epoch's shards are disjoint where a
// group's pass allows it and of equal length, each window holds each group's apportioned share,
// every sample of a group comes once per pass over it, and every loss is accepted once. The
// trainer's side of the mapping (a global index -> group, index in group) is
// client/python/samplerd/mixture.py; here the groups come from the offsets.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "gtest/gtest.h"
#include "tests/loop_server_test_base.h"

namespace samplerd {
namespace {

constexpr uint64_t kSizes[] = {300, 40, 1000};  // Group 1 (40) is smaller than its 60 a window.
constexpr double kWeights[] = {1.0, 2.0, 1.0};  // Shares 30, 60, 30 of every window of 120.
constexpr uint64_t kWindow = 120;
constexpr uint32_t kWorld = 2;
constexpr uint64_t kEpochs = 4;

uint64_t GroupOf(uint64_t index) {
  uint64_t k = 0;
  while (index >= kSizes[k]) index -= kSizes[k++];
  return k;
}

uint64_t Offset(uint64_t k) {
  uint64_t o = 0;
  for (uint64_t g = 0; g < k; ++g) o += kSizes[g];
  return o;
}

class MixtureEpochLoopTest : public LoopServerTest {};

TEST_F(MixtureEpochLoopTest, RanksReadAMixtureJobsWindowsWithEveryLossOnce) {
  v1::JobSpec spec;
  spec.set_world_size(kWorld);
  spec.set_seed(11);
  spec.set_samples_per_epoch(kWindow);
  for (uint64_t n : kSizes) spec.mutable_mixture()->add_group_sizes(n);
  for (double w : kWeights) spec.mutable_mixture()->add_group_weights(w);
  absl::StatusOr<v1::Job> job = client_->CreateJob("mix", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->spec().num_samples(), 1340u);

  std::vector<std::vector<std::vector<uint64_t>>> read(
      kWorld, std::vector<std::vector<uint64_t>>(kEpochs));  // [rank][epoch]
  std::vector<std::vector<ShardEnd>> ends(kWorld);
  std::vector<absl::Status> results(kWorld);
  std::vector<std::unique_ptr<EpochLoop>> loops;
  for (uint32_t r = 0; r < kWorld; ++r) loops.push_back(NewLoop("mix", r, kWorld));
  for (const auto& loop : loops) ASSERT_NE(loop, nullptr);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = loops[r]->Run(
          0, kEpochs,
          [&, r](const EpochBatch& batch, LossSink& losses) -> absl::Status {
            std::vector<uint64_t>& seen = read[r][batch.epoch];
            if (batch.position != seen.size()) {
              return absl::InternalError(absl::StrCat("position ", batch.position));
            }
            seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
            std::vector<float> values;
            for (uint64_t i : batch.indices) values.push_back(0.1f * (1 + GroupOf(i)));
            return losses.Report(values);
          },
          [&, r](const ShardEnd& end) {
            ends[r].push_back(end);
            return absl::OkStatus();
          });
    });
  }
  for (std::thread& t : ranks) t.join();

  std::vector<std::vector<uint64_t>> seen(3);  // Per group, per index in the group: reads.
  for (uint64_t k = 0; k < 3; ++k) seen[k].assign(kSizes[k], 0);
  for (uint32_t r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    ASSERT_EQ(ends[r].size(), kEpochs);
    // Every loss of the rank's four shards accepted once.
    EXPECT_EQ(ends[r].back().losses.accepted, kEpochs * kWindow / kWorld) << "rank " << r;
    EXPECT_EQ(ends[r].back().losses.duplicates, 0u) << "rank " << r;
  }
  for (uint64_t epoch = 0; epoch < kEpochs; ++epoch) {
    std::vector<uint64_t> window;
    for (uint32_t r = 0; r < kWorld; ++r) {
      EXPECT_EQ(read[r][epoch].size(), kWindow / kWorld) << "epoch " << epoch << " rank " << r;
      EXPECT_EQ(ends[r][epoch].shard_length, kWindow / kWorld);
      window.insert(window.end(), read[r][epoch].begin(), read[r][epoch].end());
    }
    std::vector<uint64_t> counts(3, 0);
    std::vector<std::vector<uint64_t>> in_group(3);
    for (uint64_t i : window) {
      ASSERT_LT(i, 1340u);
      ++counts[GroupOf(i)];
      in_group[GroupOf(i)].push_back(i);
    }
    EXPECT_EQ(counts, (std::vector<uint64_t>{30, 60, 30})) << "epoch " << epoch;
    // Groups 0 and 2 stay within their first pass in 4 windows: no index twice in a window.
    for (uint64_t k : {0u, 2u}) {
      std::sort(in_group[k].begin(), in_group[k].end());
      EXPECT_EQ(std::adjacent_find(in_group[k].begin(), in_group[k].end()), in_group[k].end())
          << "epoch " << epoch << " group " << k;
    }
    for (uint64_t i : window) ++seen[GroupOf(i)][i - Offset(GroupOf(i))];
  }
  // Once per pass: group 1 took 240 = 6 passes of 40, each sample exactly 6 times; groups 0 and
  // 2 took 120 of their first pass, so 120 samples once and the rest never.
  EXPECT_EQ(std::count(seen[1].begin(), seen[1].end(), 6u), 40);
  for (uint64_t k : {0u, 2u}) {
    EXPECT_EQ(std::count(seen[k].begin(), seen[k].end(), 1u), 120) << "group " << k;
    EXPECT_EQ(std::count(seen[k].begin(), seen[k].end(), 0u),
              static_cast<std::ptrdiff_t>(kSizes[k] - 120))
        << "group " << k;
  }
}

}  // namespace
}  // namespace samplerd
