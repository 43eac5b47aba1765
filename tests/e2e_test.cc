// End to end against the real samplerd binary: started on port 0 (the bound port read from its
// startup line), 6 rank threads stream, report and end 3 epochs, then SIGTERM must exit 0. Each
// rank also reads its peers' shards and hashes the whole plan: every rank must see one plan.
#include <signal.h>
#include <sys/wait.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/testing/test_util.h"
#include "tests/samplerd_process.h"

namespace samplerd {
namespace {

// FNV-1a over the plan's indices in order.
uint64_t PlanHash(const std::vector<uint64_t>& plan) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i : plan) {
    for (int b = 0; b < 8; ++b) {
      h ^= (i >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// The plan from every rank's interleaved shard (PAD with R | M: plan[p] = shard[p % R][p / R]).
std::vector<uint64_t> PlanFromShards(const std::vector<std::vector<uint64_t>>& shards) {
  const size_t world = shards.size();
  std::vector<uint64_t> plan(world * shards[0].size());
  for (size_t p = 0; p < plan.size(); ++p) plan[p] = shards[p % world][p / world];
  return plan;
}

TEST(EndToEndTest, SixRanksThreeEpochsAgainstTheRealBinary) {
  testutil::SamplerdProcess samplerd("server/samplerd", 0, {"--grace_period_ms=20000"});
  ASSERT_FALSE(samplerd.address().empty()) << "no 'samplerd listening on' line";
  EXPECT_FALSE(absl::EndsWith(samplerd.address(), ":0"));
  auto client = *SamplerClient::Create(samplerd.address());

  const uint64_t n = 60000, m = 30000;
  const uint32_t world = 6;
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_samples_per_epoch(m);
  spec.set_world_size(world);
  spec.set_seed(11);
  spec.mutable_policy()->set_loss(v1::LOSS);
  spec.mutable_policy()->set_ema_decay(0.5);
  spec.mutable_policy()->set_alpha(2);
  auto job = client->CreateJob("e2e", spec);
  ASSERT_TRUE(job.ok()) << job.status();

  auto is_hard = [](uint64_t i) { return i % 7 == 0; };  // 1/7 of the samples.
  std::vector<double> hard_share;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::vector<uint64_t>> shards(world);
    std::vector<uint64_t> plan_hash(world, 0);
    std::vector<absl::Status> errors(world);
    std::vector<std::thread> ranks;
    for (uint32_t r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        auto shard = client->ReadShard("e2e", epoch, r, world);
        if (!shard.ok()) {
          errors[r] = shard.status();
          return;
        }
        shards[r] = *shard;
        // What every rank can check: the plan hash from the union of all shards.
        std::vector<std::vector<uint64_t>> all(world);
        for (uint32_t peer = 0; peer < world; ++peer) {
          auto other = client->ReadShard("e2e", epoch, peer, world);
          if (!other.ok()) {
            errors[r] = other.status();
            return;
          }
          all[peer] = *std::move(other);
        }
        plan_hash[r] = PlanHash(PlanFromShards(all));
        // Report in batches of 1000, as a trainer would after each step.
        std::vector<v1::LossBatch> batches;
        for (size_t lo = 0; lo < shard->size(); lo += 1000) {
          v1::LossBatch b;
          b.set_job("e2e");
          b.set_epoch(epoch);
          b.set_rank(r);
          b.set_seq(lo / 1000);
          for (size_t k = lo; k < std::min(shard->size(), lo + 1000); ++k) {
            b.add_indices((*shard)[k]);
            b.add_losses(is_hard((*shard)[k]) ? 2.5f : 0.2f);
            b.add_positions(k);
          }
          batches.push_back(b);
        }
        auto summary = client->ReportLosses(batches);
        if (!summary.ok()) {
          errors[r] = summary.status();
          return;
        }
        if (summary->accepted() != shard->size()) {
          errors[r] = absl::InternalError(absl::StrCat("accepted ", summary->accepted()));
          return;
        }
        errors[r] = client->EndEpoch("e2e", epoch, r).status();
      });
    }
    for (auto& t : ranks) t.join();
    for (uint32_t r = 0; r < world; ++r) ASSERT_TRUE(errors[r].ok()) << r << ": " << errors[r];
    // Disjoint, equal-length shards whose union is the plan of M distinct indices.
    std::set<uint64_t> all;
    uint64_t hard = 0;
    for (const auto& s : shards) {
      EXPECT_EQ(s.size(), m / world);
      for (uint64_t i : s) {
        EXPECT_TRUE(all.insert(i).second) << "index " << i << " in two shards";
        hard += is_hard(i);
      }
    }
    EXPECT_EQ(all.size(), m);
    hard_share.push_back(static_cast<double>(hard) / m);
    // One plan for everybody, the one the ranks trained on.
    const uint64_t trained = PlanHash(PlanFromShards(shards));
    for (uint32_t r = 0; r < world; ++r) EXPECT_EQ(plan_hash[r], trained) << "rank " << r;
    if (epoch == 0) {
      // Uniform weights: the server's plan is the one any process computes from (seed, epoch).
      auto local = NewCpuBackend(1)->PlanEpoch(
          PlanSpec{n, m, 11, false, SampleOrder::kWeightedRandom}, 0, {});
      ASSERT_TRUE(local.ok()) << local.status();
      EXPECT_EQ(PlanHash(testutil::PlanIndices(*local)), trained);
    }
  }
  // The weights moved toward the high-loss samples.
  EXPECT_NEAR(hard_share[0], 1.0 / 7, 0.02);
  EXPECT_GT(hard_share[2], hard_share[0] + 0.1);
  // Epoch 3's weights are shown once its plan is ready: reading a shard of it waits for that.
  ASSERT_TRUE(client->ReadShard("e2e", 3, 0, world).ok());
  auto status = client->GetJobStatus("e2e");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->job().current_epoch(), 3u);
  EXPECT_GT(status->weights().max(), status->weights().min() * 5);

  // The client stays connected: SIGTERM must still not wait out the 20 s grace period.
  const absl::Time stop_start = absl::Now();
  const int exit_status = samplerd.Signal(SIGTERM);
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(5));
  EXPECT_TRUE(WIFEXITED(exit_status));
  EXPECT_EQ(WEXITSTATUS(exit_status), 0);
}

}  // namespace
}  // namespace samplerd
