// Mixture jobs through the real server (samplerd's Server on a loopback port 0, the C++ client
// over gRPC): creation at the scale, bad specs refused with nothing created, shards
// disjoint and equal, the status of the groups, and plans identical across a server restart on
// --data_dir, a rewind and an elastic resize (and equal to an in-memory server's).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/mixture/apportion.h"
#include "server/mixture_config.h"
#include "server/mixture_planner.h"
#include "server/persistence/snapshot.h"
#include "server/server.h"
#include "server/testing/test_dir.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

// The CPU backend on `threads` threads (1 or 2), made once: a planner's windows are its.
ComputeBackend* CpuBackendOf(int threads) {
  static ComputeBackend* const one = NewCpuBackend(1).release();
  static ComputeBackend* const two = NewCpuBackend(2).release();
  return threads == 1 ? one : two;
}

using ::testing::HasSubstr;

class MixtureJobTest : public ::testing::Test {
 protected:
  // `rewind_epochs`: -1 the server's default (none kept in memory, 3 on disk).
  std::unique_ptr<Server> Start(const std::string& data_dir = "", int rewind_epochs = -1) {
    Options options = testutil::LoopbackTestOptions();
    options.planner_threads = 2;
    options.grace_period = absl::Seconds(1);
    options.data_dir = data_dir;
    options.rewind_epochs = rewind_epochs;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  static std::unique_ptr<SamplerClient> Connect(const Server& server) {
    ClientOptions options;
    options.timeout = absl::Seconds(60);
    return *SamplerClient::Create(server.address(), options);
  }

  // Every rank's shard of `epoch` in `deal`, read concurrently.
  static std::vector<std::vector<uint64_t>> ReadAll(SamplerClient& client, const std::string& job,
                                                    uint64_t epoch, uint32_t world,
                                                    uint32_t deal = 0) {
    std::vector<std::vector<uint64_t>> shards(world);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        StreamShardOptions options;
        options.deal = deal;
        absl::Status s =
            client.StreamShard(job, epoch, r, world, options, [&](const ShardSlice& slice) {
              shards[r].insert(shards[r].end(), slice.indices.begin(), slice.indices.end());
              return absl::OkStatus();
            });
        EXPECT_TRUE(s.ok()) << s;
      });
    }
    for (std::thread& t : threads) t.join();
    return shards;
  }

  // A server on `dir` runs mixture job "m" (SmallMixture) to epoch 2 and stops; `damage`
  // changes the groups' state in the snapshot of epoch 2; the status of a server restarted on
  // `dir` (expected to refuse it).
  absl::Status RestartWith(const std::string& dir,
                           const std::function<void(state::MixtureState*)>& damage);

  // The plan of an epoch from its INTERLEAVED shards (no padding: M a multiple of the world
  // size): position p is rank p mod R's position p / R.
  static std::vector<uint64_t> PlanOf(const std::vector<std::vector<uint64_t>>& shards) {
    const size_t world = shards.size();
    std::vector<uint64_t> plan(world * shards[0].size());
    for (size_t p = 0; p < plan.size(); ++p) plan[p] = shards[p % world].at(p / world);
    return plan;
  }

  static void EndAll(SamplerClient& client, const std::string& job, uint64_t epoch, uint32_t world,
                     uint32_t deal = 0) {
    for (uint32_t r = 0; r < world; ++r) {
      absl::StatusOr<v1::EndEpochResponse> ended = client.EndEpoch(job, epoch, r, deal);
      ASSERT_TRUE(ended.ok()) << ended.status();
    }
  }

  // Waits until `epoch` is current and planned.
  static void AwaitEpoch(SamplerClient& client, const std::string& job, uint64_t epoch) {
    for (int i = 0; i < 600; ++i) {
      absl::StatusOr<v1::Job> got = client.GetJob(job);
      ASSERT_TRUE(got.ok()) << got.status();
      if (got->current_epoch() == epoch && got->plan_ready()) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "epoch " << epoch << " of " << job << " was not served";
  }
};

// A spec with groups smaller and larger than the window, and uneven weights.
v1::JobSpec SmallMixture() {
  v1::JobSpec spec;
  spec.set_world_size(3);
  spec.set_seed(2024);
  spec.set_samples_per_epoch(60);
  v1::MixtureSpec* m = spec.mutable_mixture();
  for (uint64_t n : {40, 3, 500, 17, 1, 90, 26}) m->add_group_sizes(n);
  for (double w : {4.0, 1.0, 3.0, 0.5, 0.25, 2.0, 1.0}) m->add_group_weights(w);
  return spec;
}

// The snapshot files of job `name` under `data_dir`, by epoch.
std::map<uint64_t, std::string> Snapshots(const std::string& data_dir, const std::string& name) {
  std::map<uint64_t, std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir + "/jobs/" + name)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("snapshot-", 0) == 0 && file.size() > 13 &&
        file.substr(file.size() - 4) == ".bin") {
      out[std::stoull(file.substr(9, file.size() - 13))] = entry.path().string();
    }
  }
  return out;
}

uint64_t VmRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

TEST_F(MixtureJobTest, TenToTheTwelveSamplesInTenThousandGroupsServesDisjointEqualShards) {
  std::unique_ptr<Server> server = Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<SamplerClient> client = Connect(*server);
  v1::JobSpec spec;
  spec.set_world_size(4);
  spec.set_seed(5);
  spec.set_samples_per_epoch(100000);
  for (int k = 0; k < 10000; ++k) {
    spec.mutable_mixture()->add_group_sizes(100000000);
    spec.mutable_mixture()->add_group_weights(1 + k % 7);
  }
  absl::StatusOr<v1::Job> job = client->CreateJob("big", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().num_samples(), uint64_t{1000000000000});
  EXPECT_TRUE(job->plan_ready());
  std::vector<uint64_t> by_class(7, 0);  // Samples of the groups k = c mod 7, so far.
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<std::vector<uint64_t>> shards = ReadAll(*client, "big", epoch, 4);
    std::set<uint64_t> all;
    for (const std::vector<uint64_t>& shard : shards) {
      EXPECT_EQ(shard.size(), 25000u);
      for (uint64_t i : shard) {
        EXPECT_LT(i, uint64_t{1000000000000});
        all.insert(i);
      }
    }
    // Disjoint: no group is read past its first pass in two windows of 10^5.
    EXPECT_EQ(all.size(), 100000u) << "epoch " << epoch;
    // The windows follow the weights: group k has weight 1 + k mod 7 (they add up to 39994),
    // and each group's running count stays within one sample of its running target (no
    // take-back happens with these weights), so the groups of class c = k mod 7 (1429 of them
    // for c < 4, else 1428) are within that many samples of theirs.
    for (uint64_t i : all) ++by_class[(i / 100000000) % 7];
    for (int c = 0; c < 7; ++c) {
      const double groups = c < 10000 % 7 ? 1429 : 1428;
      const double want = (epoch + 1) * 100000.0 * groups * (1 + c) / 39994.0;
      EXPECT_NEAR(static_cast<double>(by_class[c]), want, groups) << "class " << c;
    }
    if (epoch == 0) EndAll(*client, "big", 0, 4);
    if (epoch == 0) AwaitEpoch(*client, "big", 1);
  }
  absl::StatusOr<v1::JobStatus> status = client->GetJobStatus("big");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->mixture().groups(), 10000u);
  ASSERT_EQ(status->mixture().top_groups_size(), v1::MAX_STATUS_GROUPS);
  // The heaviest groups (weight 7: k = 6, 13, 20, ...), ties by group number.
  EXPECT_EQ(status->mixture().top_groups(0).group(), 6u);
  EXPECT_EQ(status->mixture().top_groups(1).group(), 13u);
  EXPECT_NEAR(status->mixture().top_groups(0).weight(), 7.0 / 39994.0, 1e-15);
  EXPECT_GT(status->mixture().top_groups(0).window_count(), 0u);
  const uint64_t rss = VmRssBytes();
  std::cout << "server process RSS with N = 10^12 in 10^4 groups, M = 10^5: " << rss / (1 << 20)
            << " MiB\n";
  EXPECT_LT(rss, uint64_t{400} << 20);  // The test binary, the server and the client together.
}

TEST_F(MixtureJobTest, BadMixturesAreInvalidArgumentAndCreateNothing) {
  std::unique_ptr<Server> server = Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<SamplerClient> client = Connect(*server);
  v1::JobSpec spec = SmallMixture();
  spec.set_num_samples(678);  // The sizes add up to 677.
  absl::StatusOr<v1::Job> job = client->CreateJob("bad", spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("spec.num_samples = 678: the 7 groups of spec.mixture.group_sizes hold "
                        "677 samples"));
  spec = SmallMixture();
  spec.mutable_mixture()->set_group_weights(4, -1);
  job = client->CreateJob("bad", spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.mixture.group_weights[4] = -1"));
  absl::StatusOr<std::vector<v1::Job>> jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
  // The name is free: the good spec creates it.
  EXPECT_TRUE(client->CreateJob("bad", SmallMixture()).ok());
}

TEST_F(MixtureJobTest, PlansAreTheSameAcrossRestartRewindAndResize) {
  testutil::TestDir dir;
  const v1::JobSpec spec = SmallMixture();
  // The reference: an in-memory server run through epochs 0-6, keeping 3 epoch starts.
  std::vector<std::vector<uint64_t>> want;
  {
    std::unique_ptr<Server> server = Start("", 3);
    ASSERT_NE(server, nullptr);
    std::unique_ptr<SamplerClient> client = Connect(*server);
    ASSERT_TRUE(client->CreateJob("m", spec).ok());
    for (uint64_t e = 0; e < 6; ++e) {
      AwaitEpoch(*client, "m", e);
      want.push_back(PlanOf(ReadAll(*client, "m", e, 3)));
      EndAll(*client, "m", e, 3);
    }
    // An in-memory rewind: its kept start holds the groups' state too.
    AwaitEpoch(*client, "m", 6);
    absl::StatusOr<v1::Job> rewound = client->RewindJob("m", 4);
    ASSERT_TRUE(rewound.ok()) << rewound.status();
    EXPECT_EQ(PlanOf(ReadAll(*client, "m", 4, 3)), want[4]) << "after the in-memory rewind";
    EndAll(*client, "m", 4, 3);
    AwaitEpoch(*client, "m", 5);
    EXPECT_EQ(PlanOf(ReadAll(*client, "m", 5, 3)), want[5]) << "after the in-memory rewind";
  }
  // Every epoch's window holds the counts of the apportionment under the job's shares.
  std::shared_ptr<const MixtureConfig> config = *MakeMixtureConfig(spec.mixture(), 0);
  mixture::Apportioner apportioner = *mixture::Apportioner::Create(7);
  for (uint64_t e = 0; e < 6; ++e) {
    std::vector<uint64_t> counts(7, 0);
    for (uint64_t i : want[e]) ++counts[config->layout.GroupOf(i)];
    EXPECT_EQ(counts, apportioner.Next(config->shares, 60)->counts) << "epoch " << e;
  }

  {
    std::unique_ptr<Server> server = Start(dir.path());
    ASSERT_NE(server, nullptr);
    std::unique_ptr<SamplerClient> client = Connect(*server);
    ASSERT_TRUE(client->CreateJob("m", spec).ok());
    for (uint64_t e = 0; e < 4; ++e) {
      AwaitEpoch(*client, "m", e);
      EXPECT_EQ(PlanOf(ReadAll(*client, "m", e, 3)), want[e]) << "epoch " << e;
      EndAll(*client, "m", e, 3);
    }
    AwaitEpoch(*client, "m", 4);
    EXPECT_EQ(PlanOf(ReadAll(*client, "m", 4, 3)), want[4]);
  }  // The server goes (its snapshot of epoch 4 is on disk, with the groups' state).
  // Each snapshot holds the state its epoch's window starts from: the planner's own.
  MixturePlanner reference(config, spec.seed(), 60, CpuBackendOf(1));
  const std::map<uint64_t, std::string> snapshots = Snapshots(dir.path(), "m");
  ASSERT_FALSE(snapshots.empty());
  EXPECT_EQ(snapshots.rbegin()->first, 4u);
  for (const auto& [epoch, path] : snapshots) {
    absl::StatusOr<Snapshot> snapshot = ReadSnapshot(path);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ASSERT_TRUE(snapshot->header.has_mixture()) << path;
    absl::StatusOr<MixtureState> held = MixtureStateFromProto(snapshot->header.mixture());
    ASSERT_TRUE(held.ok()) << held.status();
    std::shared_ptr<const MixtureState> want_state = *reference.StateAt(epoch);
    EXPECT_EQ(held->epoch, epoch);
    EXPECT_EQ(held->lags, want_state->lags) << path;
    for (size_t k = 0; k < 7; ++k) {
      EXPECT_EQ(held->cursors[k].position, want_state->cursors[k].position) << path << " " << k;
      EXPECT_EQ(held->cursors[k].pass, want_state->cursors[k].pass) << path << " " << k;
    }
  }
  std::unique_ptr<Server> server = Start(dir.path());
  ASSERT_NE(server, nullptr);
  std::unique_ptr<SamplerClient> client = Connect(*server);
  AwaitEpoch(*client, "m", 4);
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 4, 3)), want[4]) << "after the restart";
  EndAll(*client, "m", 4, 3);
  AwaitEpoch(*client, "m", 5);
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 5, 3)), want[5]) << "after the restart";
  // Rewind to epoch 3: the same window again, and the same epochs after it.
  absl::StatusOr<v1::Job> rewound = client->RewindJob("m", 3);
  ASSERT_TRUE(rewound.ok()) << rewound.status();
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 3, 3)), want[3]) << "after the rewind";
  // An elastic resize to 2 ranks before anything of epoch 3 is done: the same plan, dealt to 2.
  absl::StatusOr<v1::Job> resized = client->ResizeJob("m", 3, 2);
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(resized->world_size(), 2u);
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 3, 2, resized->deal())), want[3]) << "after the resize";
  EndAll(*client, "m", 3, 2, resized->deal());
  AwaitEpoch(*client, "m", 4);
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 4, 2)), want[4]) << "2 ranks after the resize";
  EndAll(*client, "m", 4, 2);
  AwaitEpoch(*client, "m", 5);
  EXPECT_EQ(PlanOf(ReadAll(*client, "m", 5, 2)), want[5]) << "2 ranks after the resize";
}

// The restored groups' state is the snapshot's (not recomputed): a damaged one is DATA_LOSS.
absl::Status MixtureJobTest::RestartWith(
    const std::string& dir, const std::function<void(state::MixtureState*)>& damage) {
  {
    std::unique_ptr<Server> server = Start(dir);
    if (server == nullptr) return absl::InternalError("no server");
    std::unique_ptr<SamplerClient> client = Connect(*server);
    if (absl::Status s = client->CreateJob("m", SmallMixture()).status(); !s.ok()) return s;
    for (uint64_t e = 0; e < 2; ++e) {
      AwaitEpoch(*client, "m", e);
      EndAll(*client, "m", e, 3);
    }
    AwaitEpoch(*client, "m", 2);
  }
  const std::map<uint64_t, std::string> snapshots = Snapshots(dir, "m");
  EXPECT_EQ(snapshots.rbegin()->first, 2u);
  const std::string path = snapshots.rbegin()->second;
  absl::StatusOr<Snapshot> snapshot = ReadSnapshot(path);
  if (!snapshot.ok()) return snapshot.status();
  EXPECT_EQ(snapshot->header.mixture().epoch(), 2u);
  damage(snapshot->header.mutable_mixture());
  if (absl::Status s = WriteSnapshot(path, snapshot->header, snapshot->base, snapshot->weights,
                                     snapshot->loss_stats, snapshot->irreducible);
      !s.ok()) {
    return s;
  }
  Options options = testutil::LoopbackTestOptions();
  options.data_dir = dir;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  return server.status();
}

TEST_F(MixtureJobTest, ADamagedGroupStateInTheSnapshotIsDataLossAtRestart) {
  testutil::TestDir dir;
  const absl::Status s = RestartWith(dir.path(), [](state::MixtureState* m) {
    m->set_position(0, 40);  // Group 0 holds 40 samples.
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cursors[0].position = 40"));
}

// The groups' state of another epoch in the snapshot of epoch 2 (valid for the groups: epoch 1's
// own) is DATA_LOSS naming both epochs, not planned from.
TEST_F(MixtureJobTest, AGroupStateOfAnotherEpochInTheSnapshotIsDataLossAtRestart) {
  testutil::TestDir dir;
  std::shared_ptr<const MixtureConfig> config =
      *MakeMixtureConfig(SmallMixture().mixture(), /*num_samples=*/0);
  MixturePlanner planner(config, SmallMixture().seed(), SmallMixture().samples_per_epoch(),
                         CpuBackendOf(1));
  const std::shared_ptr<const MixtureState> at1 = *planner.StateAt(1);
  const absl::Status s = RestartWith(dir.path(), [&](state::MixtureState* m) {
    *m = MixtureStateToProto(*at1);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the start of epoch 2 holds the mixture state of epoch 1"));
}

}  // namespace
}  // namespace samplerd
