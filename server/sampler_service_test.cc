// The gRPC service over a real in-process server on port 0, driven by the C++ client library.
#include "server/sampler_service.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job_registry.h"
#include "server/server.h"
#include "server/testing/gated_backend.h"
#include "server/testing/service_server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SamplerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options = testutil::LoopbackTestOptions();
    options.planner_threads = 2;
    options.grace_period = absl::Seconds(1);
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    ClientOptions client_options;
    client_options.timeout = absl::Seconds(20);
    client_ = *SamplerClient::Create(server_->address(), client_options);
  }

  v1::JobSpec Spec(uint64_t n, uint32_t world, uint64_t m = 0) {
    v1::JobSpec spec;
    spec.set_num_samples(n);
    spec.set_world_size(world);
    spec.set_samples_per_epoch(m);
    spec.set_seed(17);
    return spec;
  }

  // Every rank's shard of `epoch`, read concurrently.
  std::vector<std::vector<uint64_t>> ReadAll(const std::string& job, uint64_t epoch,
                                             uint32_t world) {
    std::vector<std::vector<uint64_t>> shards(world);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto shard = client_->ReadShard(job, epoch, r, world);
        ASSERT_TRUE(shard.ok()) << shard.status();
        shards[r] = *std::move(shard);
      });
    }
    for (auto& t : threads) t.join();
    return shards;
  }

  // The losses of `shard`'s positions [from, to) (the shard as streamed to `rank`).
  v1::LossBatch Batch(const std::string& job, uint64_t epoch, uint32_t rank, uint64_t seq,
                      const std::vector<uint64_t>& shard, float (*loss)(uint64_t), size_t from = 0,
                      size_t to = SIZE_MAX) {
    v1::LossBatch b;
    b.set_job(job);
    b.set_epoch(epoch);
    b.set_rank(rank);
    b.set_seq(seq);
    for (size_t p = from; p < std::min(to, shard.size()); ++p) {
      b.add_indices(shard[p]);
      b.add_losses(loss(shard[p]));
      b.add_positions(p);
    }
    return b;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<SamplerClient> client_;
};

float HardLoss(uint64_t i) { return i < 1000 ? 3.0f : 0.1f; }

TEST_F(SamplerServiceTest, JobLifecycle) {
  auto job = client_->CreateJob("train", Spec(100, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->current_epoch(), 0u);
  EXPECT_TRUE(job->plan_ready());
  EXPECT_EQ(job->spec().samples_per_epoch(), 100u);  // Default filled in.
  // Idempotent with the same spec (also when defaults are spelled out).
  v1::JobSpec explicit_spec = Spec(100, 2, 100);
  explicit_spec.set_order(v1::WEIGHTED_RANDOM);
  EXPECT_TRUE(client_->CreateJob("train", explicit_spec).ok());
  auto conflict = client_->CreateJob("train", Spec(101, 2));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()), HasSubstr("train"));
  ASSERT_TRUE(client_->CreateJob("eval", Spec(10, 1)).ok());
  auto jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].name(), "eval");
  EXPECT_EQ((*jobs)[1].name(), "train");
  EXPECT_TRUE(client_->DeleteJob("eval").ok());
  EXPECT_EQ(client_->GetJob("eval").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->DeleteJob("eval").code(), absl::StatusCode::kNotFound);
}

TEST_F(SamplerServiceTest, FourRanksThreeEpochsWithTheLossPolicy) {
  const uint64_t n = 10000, m = 4000;
  const uint32_t world = 4;
  v1::JobSpec spec = Spec(n, world, m);
  spec.mutable_policy()->set_loss(v1::LOSS);
  spec.mutable_policy()->set_ema_decay(0.5);
  ASSERT_TRUE(client_->CreateJob("j", spec).ok());
  std::vector<double> hard_share;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    auto shards = ReadAll("j", epoch, world);
    // Equal lengths; no index twice (without replacement); union = the plan (M indices).
    std::set<uint64_t> all;
    uint64_t hard = 0;
    for (const auto& s : shards) {
      EXPECT_EQ(s.size(), m / world);
      for (uint64_t i : s) {
        EXPECT_TRUE(all.insert(i).second) << "index " << i << " served twice";
        hard += i < 1000;
      }
    }
    EXPECT_EQ(all.size(), m);
    hard_share.push_back(static_cast<double>(hard) / m);
    if (epoch == 0) {
      // All ranks saw one plan: the interleaved union equals the plan computed locally.
      auto plan =
          NewCpuBackend(1)->PlanEpoch({n, m, 17, false, SampleOrder::kWeightedRandom}, 0, {});
      ASSERT_TRUE(plan.ok());
      for (uint64_t p = 0; p < m; ++p) ASSERT_EQ(shards[p % world][p / world], (*plan)[p]);
    }
    for (uint32_t r = 0; r < world; ++r) {
      auto summary = client_->ReportLosses({Batch("j", epoch, r, 0, shards[r], HardLoss)});
      ASSERT_TRUE(summary.ok()) << summary.status();
      EXPECT_EQ(summary->accepted(), shards[r].size());
    }
    auto status = client_->GetJobStatus("j");
    ASSERT_TRUE(status.ok());
    for (const auto& rank : status->ranks()) {
      EXPECT_EQ(rank.indices_streamed(), m / world);
      EXPECT_EQ(rank.losses_accepted(), m / world);
    }
    for (uint32_t r = 0; r < world; ++r) {
      auto end = client_->EndEpoch("j", epoch, r);
      ASSERT_TRUE(end.ok()) << end.status();
      EXPECT_EQ(end->ranks_ended(), r + 1);
      EXPECT_EQ(end->epoch_closed(), r + 1 == world);
    }
  }
  // Hard samples are 10% of the data; the loss policy draws them more and more often (after
  // epoch 0 only the 40% of samples seen have their own loss, the rest keep the prior).
  EXPECT_NEAR(hard_share[0], 0.1, 0.03);
  EXPECT_GT(hard_share[1], 0.15);
  EXPECT_GT(hard_share[2], hard_share[1])
      << hard_share[0] << " " << hard_share[1] << " " << hard_share[2];
  // Epoch 3's weights are shown once its plan is ready (while it is planned, none: not
  // epoch 2's under its number).
  absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus("j");
  for (int tries = 0; status.ok() && !status->job().plan_ready() && tries < 1000; ++tries) {
    EXPECT_FALSE(status->has_weights());
    absl::SleepFor(absl::Milliseconds(10));
    status = client_->GetJobStatus("j");
  }
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(status->job().plan_ready());
  EXPECT_EQ(status->job().current_epoch(), 3u);
  EXPECT_GT(status->weights().max(), 3.0);
  EXPECT_LT(status->weights().effective_sample_size(), 0.9 * n);
  EXPECT_EQ(status->backend(), "cpu");
}

TEST_F(SamplerServiceTest, BrokenStreamResumesWithStartOffset) {
  ASSERT_TRUE(client_->CreateJob("r", Spec(5000, 2)).ok());
  auto full = client_->ReadShard("r", 0, 1, 2);
  ASSERT_TRUE(full.ok());
  // Break after the first chunk of 300 indices, then resume where it stopped.
  v1::StreamShardRequest request;
  request.set_job("r");
  request.set_rank(1);
  request.set_world_size(2);
  request.set_max_chunk_size(300);
  std::vector<uint64_t> got;
  {
    grpc::ClientContext context;
    auto reader = client_->stub()->StreamShard(&context, request);
    v1::ShardChunk chunk;
    ASSERT_TRUE(reader->Read(&chunk));
    EXPECT_EQ(chunk.indices32_size(), 300);
    got.assign(chunk.indices32().begin(), chunk.indices32().end());
    context.TryCancel();
    while (reader->Read(&chunk)) {
    }
    EXPECT_FALSE(reader->Finish().ok());
  }
  absl::Status s = client_->StreamShard("r", 0, 1, 2, got.size(), false, [&](const ShardSlice& sl) {
    EXPECT_EQ(sl.offset, got.size());
    got.insert(got.end(), sl.indices.begin(), sl.indices.end());
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, *full);
}

TEST_F(SamplerServiceTest, PeersOfOneRankShareChunksAndLossesCountOnce) {
  v1::JobSpec spec = Spec(2000, 2);
  spec.mutable_policy()->set_loss(v1::LOSS);  // Per-sample statistics are kept.
  ASSERT_TRUE(client_->CreateJob("tp", spec).ok());
  auto a = client_->ReadShard("tp", 0, 0, 2);
  auto b = client_->ReadShard("tp", 0, 0, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // Tensor-parallel peer 1 reports seq 0; peer 2 reports the same indices as its own seq 7.
  auto first = client_->ReportLosses({Batch("tp", 0, 0, 0, *a, HardLoss)});
  auto peer = client_->ReportLosses({Batch("tp", 0, 0, 7, *b, HardLoss)});
  auto retry = client_->ReportLosses({Batch("tp", 0, 0, 0, *a, HardLoss)});
  ASSERT_TRUE(first.ok() && peer.ok() && retry.ok());
  EXPECT_EQ(first->accepted(), a->size());
  EXPECT_EQ(peer->accepted(), 0u);
  EXPECT_EQ(peer->duplicates(), b->size());
  EXPECT_EQ(retry->accepted(), 0u);
  EXPECT_EQ(retry->duplicates(), a->size());
  auto status = client_->GetJobStatus("tp");
  EXPECT_EQ(status->ranks(0).losses_accepted(), a->size());
  EXPECT_EQ(status->samples_seen(), a->size());
  // EndEpoch counts data-parallel ranks: two peers ending rank 0 do not close the epoch.
  EXPECT_FALSE(client_->EndEpoch("tp", 0, 0)->epoch_closed());
  EXPECT_EQ(client_->EndEpoch("tp", 0, 0)->ranks_ended(), 1u);
  EXPECT_TRUE(client_->EndEpoch("tp", 0, 1)->epoch_closed());
}

TEST_F(SamplerServiceTest, StaleLossesAreCountedAndIgnored) {
  ASSERT_TRUE(client_->CreateJob("s", Spec(100, 1)).ok());
  auto closed = client_->ReadShard("s", 0, 0, 1);
  ASSERT_TRUE(closed.ok());
  ASSERT_TRUE(client_->EndEpoch("s", 0, 0).ok());
  ASSERT_TRUE(client_->ReadShard("s", 1, 0, 1).ok());  // Waits for epoch 1's plan.
  auto summary = client_->ReportLosses({Batch("s", 0, 0, 0, *closed, HardLoss, 0, 3)});
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->stale(), 3u);
  EXPECT_EQ(summary->accepted(), 0u);
  ASSERT_EQ(summary->stale_epochs_size(), 1);
  EXPECT_EQ(summary->stale_epochs(0), 0u);
  EXPECT_EQ(client_->GetJobStatus("s")->samples_seen(), 0u);
  // EndEpoch of the closed epoch again: an idempotent retry.
  EXPECT_TRUE(client_->EndEpoch("s", 0, 0).ok());
}

TEST_F(SamplerServiceTest, NextEpochWaitsForTheBarrierAndTheDeadline) {
  ASSERT_TRUE(client_->CreateJob("w", Spec(1000, 2)).ok());
  // Epoch 1 is not planned before both ranks end epoch 0: a short deadline expires.
  ClientOptions quick;
  quick.timeout = absl::Milliseconds(200);
  quick.max_retries = 0;
  auto quick_client = *SamplerClient::Create(server_->address(), quick);
  EXPECT_EQ(quick_client->ReadShard("w", 1, 0, 2).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A rank that finished early waits for the others, then gets epoch 1.
  absl::Notification got;
  std::thread early([&] {
    auto shard = client_->ReadShard("w", 1, 0, 2);
    EXPECT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->size(), 500u);
    got.Notify();
  });
  ASSERT_TRUE(client_->EndEpoch("w", 0, 0).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(got.HasBeenNotified());
  ASSERT_TRUE(client_->EndEpoch("w", 0, 1).ok());
  early.join();
  EXPECT_TRUE(got.HasBeenNotified());
}

TEST_F(SamplerServiceTest, ManyConcurrentRankStreams) {
  // 256 ranks all parked on the server at once (waiting for epoch 1 behind the barrier), each
  // holding a server thread; then the barrier opens and all of them are served. No retries: a
  // refused call (thread quota) would fail the test.
  const uint32_t world = 256;
  const uint64_t per_rank = 200;
  ASSERT_TRUE(client_->CreateJob("wide", Spec(world * per_rank, world)).ok());
  ClientOptions no_retries;
  no_retries.timeout = absl::Seconds(60);
  no_retries.max_retries = 0;
  auto strict = *SamplerClient::Create(server_->address(), no_retries);
  std::vector<absl::StatusOr<std::vector<uint64_t>>> shards(world);
  std::atomic<uint32_t> started{0}, finished{0};
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ++started;
      shards[r] = strict->ReadShard("wide", 1, r, world);
      ++finished;
    });
  }
  while (started.load() < world) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));  // Let every call reach the server and wait there.
  EXPECT_EQ(finished.load(), 0u) << "calls ended before the barrier opened";
  for (uint32_t r = 0; r < world; ++r) {
    auto end = strict->EndEpoch("wide", 0, r);
    ASSERT_TRUE(end.ok()) << end.status();
  }
  for (auto& t : threads) t.join();
  std::set<uint64_t> all;
  for (uint32_t r = 0; r < world; ++r) {
    ASSERT_TRUE(shards[r].ok()) << "rank " << r << ": " << shards[r].status();
    ASSERT_EQ(shards[r]->size(), per_rank);
    all.insert(shards[r]->begin(), shards[r]->end());
  }
  EXPECT_EQ(all.size(), world * per_rank);
}

// A loopback samplerd whose open StreamShard calls may hold `max_stream_buffer_bytes` together.
absl::StatusOr<std::unique_ptr<Server>> BudgetServer(uint64_t max_stream_buffer_bytes) {
  Options options = testutil::LoopbackTestOptions();
  options.planner_threads = 1;
  options.grace_period = absl::Seconds(1);
  options.max_stream_buffer_bytes = max_stream_buffer_bytes;
  return Server::Create(options);
}

TEST(StreamBufferBudgetTest, AStreamWhoseChunkDoesNotFitIsResourceExhaustedNamingTheFlag) {
  // One stream of default-sized chunks (65536 indices, 16 bytes each) fits; a chunk of 2^20
  // indices (16 MiB while in flight) does not.
  auto server = BudgetServer(1 << 20);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec;
  spec.set_num_samples(1 << 21);
  spec.set_world_size(1);
  ASSERT_TRUE(client->CreateJob("big", spec).ok());
  auto stream = [&](uint32_t max_chunk_size, uint64_t* received) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::StreamShardRequest request;
    request.set_job("big");
    request.set_world_size(1);
    request.set_max_chunk_size(max_chunk_size);
    auto reader = client->stub()->StreamShard(&context, request);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) *received += chunk.indices32_size();
    return reader->Finish();
  };
  uint64_t received = 0;
  grpc::Status s = stream(1 << 20, &received);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("needs 16777216 bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr("more than the 1048576 bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr("ask for a smaller max_chunk_size"));
  EXPECT_THAT(s.error_message(), Not(HasSubstr("retry later")));  // Retrying cannot help.
  EXPECT_THAT(s.error_message(), HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_EQ(received, 0u);
  // The default chunk size fits, and the refused stream held nothing.
  ASSERT_TRUE(stream(0, &received).ok());
  EXPECT_EQ(received, uint64_t{1} << 21);
}

TEST(StreamBufferBudgetTest, TheCppClientRetriesARefusalByItsRetrySignalUntilItFits) {
  // Room for one stream of 1024-index chunks (16 KiB), not two (issue 33: the client retries by
  // the samplerd-retry-after-ms trailer the refusal carries, proto/retry_signal.h).
  auto server = BudgetServer(24 << 10);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions patient;
  patient.timeout = absl::Seconds(30);
  patient.initial_backoff = absl::Milliseconds(20);
  patient.max_backoff = absl::Milliseconds(100);
  patient.retry_budget = absl::Seconds(60);
  auto client = *SamplerClient::Create((*server)->address(), patient);
  v1::JobSpec spec;
  spec.set_num_samples(1 << 21);
  spec.set_world_size(2);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  // The holder reads one chunk of its 4 MiB shard and stops; without BDP probing its window
  // stays small, so the server waits to write, holding its budget.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto holder_channel = grpc::CreateCustomChannel((*server)->address(),
                                                  grpc::InsecureChannelCredentials(), args);
  auto holder_stub = v1::Sampler::NewStub(holder_channel);
  grpc::ClientContext holder_context;
  v1::StreamShardRequest held;
  held.set_job("j");
  held.set_rank(0);
  held.set_world_size(2);
  held.set_max_chunk_size(1024);
  held.set_observe(true);
  auto holder = holder_stub->StreamShard(&holder_context, held);
  v1::ShardChunk chunk;
  ASSERT_TRUE(holder->Read(&chunk));
  StreamShardOptions stream_options;
  stream_options.max_chunk_size = 1024;
  stream_options.observe = true;
  auto read = [&](SamplerClient& c, uint64_t* received) {
    return c.StreamShard("j", 0, 1, 2, stream_options, [received](const ShardSlice& slice) {
      *received += slice.indices.size();
      return absl::OkStatus();
    });
  };
  // Without retries the refusal surfaces (the budget is held).
  ClientOptions impatient = patient;
  impatient.max_retries = 0;
  auto once = *SamplerClient::Create((*server)->address(), impatient);
  uint64_t none = 0;
  const absl::Status refused = read(*once, &none);
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_EQ(none, 0u);
  // With retries the stream is opened again, by the signal, once the holder goes away.
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(500));
    holder_context.TryCancel();
  });
  const absl::Time start = absl::Now();
  uint64_t received = 0;
  const absl::Status served = read(*client, &received);
  const absl::Duration took = absl::Now() - start;
  release.join();
  holder->Finish();
  ASSERT_TRUE(served.ok()) << served;
  EXPECT_EQ(received, uint64_t{1} << 20);
  EXPECT_GT(took, absl::Milliseconds(300)) << "served at once: the budget was not held";
}

TEST_F(SamplerServiceTest, DeletingAJobEndsItsStreamsWithNotFound) {
  ASSERT_TRUE(client_->CreateJob("d", Spec(2'000'000, 2)).ok());
  // One rank waits for epoch 1, another is in the middle of epoch 0's 1e6 indices.
  grpc::Status waiter_status;
  std::thread waiter([&] {
    grpc::ClientContext context;
    v1::StreamShardRequest request;
    request.set_job("d");
    request.set_epoch(1);
    request.set_world_size(2);
    auto reader = client_->stub()->StreamShard(&context, request);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) {
    }
    waiter_status = reader->Finish();
  });
  // A reader with a small, fixed flow-control window (no BDP growth): the server blocks in
  // Write after a few chunks, as with a slow trainer.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  auto slow = v1::Sampler::NewStub(
      grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  v1::StreamShardRequest request;
  request.set_job("d");
  request.set_world_size(2);
  request.set_max_chunk_size(1000);
  auto reader = slow->StreamShard(&context, request);
  v1::ShardChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  uint64_t received = chunk.indices32_size();
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(client_->DeleteJob("d").ok());
  while (reader->Read(&chunk)) received += chunk.indices32_size();
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_LT(received, 1'000'000u);
  waiter.join();
  EXPECT_EQ(waiter_status.error_code(), grpc::StatusCode::NOT_FOUND);
  // The name is free again.
  EXPECT_TRUE(client_->CreateJob("d", Spec(10, 1)).ok());
}

TEST_F(SamplerServiceTest, ImportanceWeightsFollowTheLossWeights) {
  // With replacement and loss-driven weights: is_weight = 1 / (N p_i) = 1 / w_i, so over the
  // draws its mean is 1 and hard samples (drawn more) carry smaller corrections.
  const uint64_t n = 2000, m = 40000;
  v1::JobSpec spec = Spec(n, 2, m);
  spec.set_replacement(true);
  spec.mutable_policy()->set_loss(v1::LOSS);
  ASSERT_TRUE(client_->CreateJob("is", spec).ok());
  for (uint32_t r = 0; r < 2; ++r) {  // Both shards: 40000 draws see every sample.
    auto shard = client_->ReadShard("is", 0, r, 2);
    ASSERT_TRUE(shard.ok());
    ASSERT_TRUE(client_->ReportLosses({Batch("is", 0, r, 0, *shard, HardLoss)}).ok());
  }
  ASSERT_EQ(client_->GetJobStatus("is")->samples_seen(), n);
  ASSERT_TRUE(client_->EndEpoch("is", 0, 0).ok());
  ASSERT_TRUE(client_->EndEpoch("is", 0, 1).ok());
  double sum = 0, hard_sum = 0, easy_sum = 0;
  uint64_t count = 0, hard = 0, easy = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    absl::Status s = client_->StreamShard("is", 1, r, 2, 0, true, [&](const ShardSlice& sl) {
      EXPECT_EQ(sl.is_weights.size(), sl.indices.size());
      for (size_t k = 0; k < sl.indices.size(); ++k) {
        sum += sl.is_weights[k];
        ++count;
        (sl.indices[k] < 1000 ? hard_sum : easy_sum) += sl.is_weights[k];
        ++(sl.indices[k] < 1000 ? hard : easy);
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(count, m);
  EXPECT_NEAR(sum / count, 1.0, 0.05);
  EXPECT_LT(hard_sum / hard, 0.5 * (easy_sum / easy));
  // Every sample once per epoch (M == N, no replacement): the weights have no effect, is = 1.
  v1::JobSpec once = Spec(500, 1);
  once.mutable_policy()->set_loss(v1::LOSS);
  ASSERT_TRUE(client_->CreateJob("once", once).ok());
  auto once_shard = client_->ReadShard("once", 0, 0, 1);
  ASSERT_TRUE(once_shard.ok());
  ASSERT_TRUE(client_->ReportLosses({Batch("once", 0, 0, 0, *once_shard, HardLoss, 0, 3)}).ok());
  ASSERT_TRUE(client_->EndEpoch("once", 0, 0).ok());
  absl::Status s = client_->StreamShard("once", 1, 0, 1, 0, true, [&](const ShardSlice& sl) {
    for (float w : sl.is_weights) EXPECT_EQ(w, 1.0f);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST_F(SamplerServiceTest, JobsAreIndependent) {
  // Two jobs advance separately: ending epochs of one does not touch the other.
  ASSERT_TRUE(client_->CreateJob("a", Spec(100, 1)).ok());
  ASSERT_TRUE(client_->CreateJob("b", Spec(100, 1)).ok());
  const std::vector<uint64_t> a0 = *client_->ReadShard("a", 0, 0, 1);
  ASSERT_TRUE(client_->EndEpoch("a", 0, 0).ok());
  ASSERT_TRUE(client_->ReadShard("a", 1, 0, 1).ok());
  EXPECT_EQ(client_->GetJob("a")->current_epoch(), 1u);
  EXPECT_EQ(client_->GetJob("b")->current_epoch(), 0u);
  // Plans depend on (spec, seed, epoch) only: b's epoch 0 is a's epoch 0; epochs differ.
  auto b0 = client_->ReadShard("b", 0, 0, 1);
  auto a1 = client_->ReadShard("a", 1, 0, 1);
  ASSERT_TRUE(b0.ok() && a1.ok());
  EXPECT_EQ(*b0, a0);
  EXPECT_NE(*a1, a0);
}

TEST_F(SamplerServiceTest, StaticWeightsDecideTheDrawsAndTheImportanceWeights) {
  const uint64_t n = 1000;
  v1::JobSpec spec = Spec(n, 2, 20000);
  spec.set_replacement(true);
  spec.mutable_policy()->set_base(v1::STATIC);
  ASSERT_TRUE(client_->CreateJob("st", spec).ok());
  EXPECT_FALSE(client_->GetJob("st")->plan_ready());
  std::vector<float> w(n, 1.0f);
  for (uint64_t i = 0; i < n; i += 2) w[i] = 0.0f;  // Even samples never drawn.
  w[1] = 3.0f;
  ASSERT_TRUE(client_->UploadWeights("st", w, 300).ok());
  EXPECT_TRUE(client_->GetJob("st")->plan_ready());
  std::map<uint64_t, float> is_weight;
  absl::Status s = client_->StreamShard("st", 0, 0, 2, 0, true, [&](const ShardSlice& sl) {
    EXPECT_EQ(sl.is_weights.size(), sl.indices.size());
    for (size_t k = 0; k < sl.indices.size(); ++k) {
      EXPECT_EQ(sl.indices[k] % 2, 1u) << "zero-weight sample drawn";
      is_weight[sl.indices[k]] = sl.is_weights[k];
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // Weights normalised to mean 1: mean of w = (499 + 3) / 1000 -> w_1 = 3 / 0.502.
  ASSERT_TRUE(is_weight.count(1));
  EXPECT_NEAR(is_weight[1], 0.502 / 3.0, 1e-5);
  EXPECT_NEAR(is_weight[3], 0.502, 1e-5);
}

// A STATIC job of n samples, m per epoch, one rank, awaiting its weights: "rep" or "norep".
std::string CreateStaticJob(SamplerClient& client, uint64_t n, uint64_t m, bool replacement) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_samples_per_epoch(m);
  spec.set_world_size(1);
  spec.set_replacement(replacement);
  spec.mutable_policy()->set_base(v1::STATIC);
  const std::string name = replacement ? "rep" : "norep";
  EXPECT_TRUE(client.CreateJob(name, spec).ok());
  return name;
}

// Issue 9, defect 5: [3.4e38, 1e-45 x 999] used to be accepted with zero_count 999 (with
// replacement) or refused as "1 have [positive weight]" (without): normalised to mean 1 the
// small weights underflowed to 0. Now the upload is refused in both modes, naming the ratio,
// and the job still awaits its weights.
TEST_F(SamplerServiceTest, StaticWeightsBeyondTheSupportedRatioAreRefusedNamingIt) {
  std::vector<float> w(1000, 1e-45f);
  w[0] = 3.4e38f;
  for (bool replacement : {true, false}) {
    SCOPED_TRACE(replacement ? "with replacement" : "without replacement");
    const std::string name = CreateStaticJob(*client_, 1000, 500, replacement);
    const absl::Status s = client_->UploadWeights(name, w, 300);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("weights[0] = 3.4e+38"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("(2^277.0) times the smallest (weights[1]"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("at most 2^126"));
    EXPECT_FALSE(client_->GetJob(name)->plan_ready());
  }
}

// At the supported ratio every positive weight stays drawable: none counts as zero, a draw
// without replacement of all but one sample succeeds, and importance weights stay finite.
TEST_F(SamplerServiceTest, StaticWeightsAtTheSupportedRatioStayPositive) {
  std::vector<float> w(1000, 0x1p-26f);
  w[0] = 0x1p100f;  // 2^126 times the others.
  for (bool replacement : {true, false}) {
    SCOPED_TRACE(replacement ? "with replacement" : "without replacement");
    const std::string name = CreateStaticJob(*client_, 1000, 999, replacement);
    ASSERT_TRUE(client_->UploadWeights(name, w, 300).ok());
    auto status = client_->GetJobStatus(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->weights().zero_count(), 0u);
    EXPECT_GT(status->weights().min(), 0.0);
    std::set<uint64_t> drawn;
    absl::Status s = client_->StreamShard(name, 0, 0, 1, 0, true, [&](const ShardSlice& sl) {
      for (size_t k = 0; k < sl.indices.size(); ++k) {
        drawn.insert(sl.indices[k]);
        EXPECT_TRUE(std::isfinite(sl.is_weights[k])) << "index " << sl.indices[k];
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    if (!replacement) {
      EXPECT_EQ(drawn.size(), 999u);
    }
  }
}

TEST_F(SamplerServiceTest, ClassBalancedLabels) {
  const uint64_t n = 1100;
  v1::JobSpec spec = Spec(n, 1, 10000);
  spec.set_replacement(true);
  spec.mutable_policy()->set_base(v1::CLASS_BALANCED);
  ASSERT_TRUE(client_->CreateJob("cb", spec).ok());
  std::vector<uint32_t> labels(n, 0);
  for (uint64_t i = 0; i < 100; ++i) labels[i] = 1;  // Minority: 100 of 1100.
  ASSERT_TRUE(client_->UploadLabels("cb", labels).ok());
  auto shard = client_->ReadShard("cb", 0, 0, 1);
  ASSERT_TRUE(shard.ok());
  uint64_t minority = 0;
  for (uint64_t i : *shard) minority += i < 100;
  // Balanced: each class half of the draws (binomial sd 0.005).
  EXPECT_NEAR(static_cast<double>(minority) / shard->size(), 0.5, 0.03);
  // Uploads after the job started are refused and change nothing.
  ASSERT_TRUE(client_->ReportLosses({Batch("cb", 0, 0, 0, *shard, HardLoss, 0, 1)}).ok());
  EXPECT_EQ(client_->UploadLabels("cb", labels).code(), absl::StatusCode::kFailedPrecondition);
}


// GetJobStatus while an epoch is planned, over real gRPC (port 0), the planner held half-way by
// a GatedBackend. Fails before issue 33's fix: the status said epoch 1 with epoch 0's progress
// (every rank ended, its positions streamed) until plan_ready.
TEST(JobStatusWhilePlanningTest, ShowsTheEpochBeingPlannedWithNoProgressAndSaysPlanning) {
  std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(1);
  testutil::GatedBackend gated(cpu.get());
  JobRegistry registry(JobRegistry::Limits(), &gated);
  SamplerService service(&registry, &gated);
  testutil::ServiceServer server(&service);
  v1::Sampler::Stub& stub = server.stub();
  v1::JobSpec spec;
  spec.set_num_samples(1000);
  spec.set_world_size(2);
  spec.set_samples_per_epoch(600);  // Weighted plans: not computed ahead, so the gate holds it.
  spec.set_seed(5);
  spec.mutable_policy()->set_loss(v1::LOSS);
  v1::CreateJobRequest create;
  create.set_name("p");
  *create.mutable_spec() = spec;
  v1::Job job;
  ASSERT_TRUE(stub.CreateJob(testutil::ServiceServer::Context().get(), create, &job).ok());
  auto status_now = [&stub] {
    v1::GetJobStatusRequest request;
    request.set_name("p");
    v1::JobStatus status;
    const grpc::Status s = stub.GetJobStatus(testutil::ServiceServer::Context().get(), request,
                                             &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return status;
  };
  // Reads `rank`'s shard of `epoch` whole.
  auto read_whole = [&stub](uint64_t epoch, uint32_t rank) {
    v1::StreamShardRequest read;
    read.set_job("p");
    read.set_epoch(epoch);
    read.set_rank(rank);
    read.set_world_size(2);
    auto context = testutil::ServiceServer::Context();
    auto reader = stub.StreamShard(context.get(), read);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  // Both ranks read their shard of epoch 0 whole (300 positions each) and end it.
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(read_whole(0, rank).ok());
  const v1::JobStatus serving = status_now();
  ASSERT_EQ(serving.ranks_size(), 2);
  EXPECT_EQ(serving.ranks(1).indices_streamed(), 300u);
  EXPECT_FALSE(serving.planning());
  gated.Hold();
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::EndEpochRequest end;
    end.set_job("p");
    end.set_epoch(0);
    end.set_rank(rank);
    v1::EndEpochResponse response;
    ASSERT_TRUE(stub.EndEpoch(testutil::ServiceServer::Context().get(), end, &response).ok());
  }
  gated.AwaitHeldCall();  // Epoch 1 is being planned.
  const v1::JobStatus planning = status_now();
  EXPECT_TRUE(planning.planning());
  EXPECT_EQ(planning.job().current_epoch(), 1u);
  EXPECT_FALSE(planning.job().plan_ready());
  EXPECT_EQ(planning.job().deal(), 0u);
  EXPECT_EQ(planning.job().world_size(), 2u);
  ASSERT_EQ(planning.ranks_size(), 2);
  for (const v1::RankProgress& rank : planning.ranks()) {
    EXPECT_EQ(rank.indices_streamed(), 0u) << rank.DebugString();
    EXPECT_EQ(rank.losses_accepted(), 0u) << rank.DebugString();
    EXPECT_FALSE(rank.ended()) << rank.DebugString();
  }
  gated.Release();
  v1::JobStatus served = status_now();
  for (int tries = 0; !served.job().plan_ready() && tries < 2000; ++tries) {
    absl::SleepFor(absl::Milliseconds(10));
    served = status_now();
  }
  ASSERT_TRUE(served.job().plan_ready());
  EXPECT_FALSE(served.planning());
  EXPECT_EQ(served.job().current_epoch(), 1u);

  // A rewind to epoch 0, held while it plans: the status shows epoch 0 being planned, deal 0,
  // not epoch 1's progress.
  ASSERT_TRUE(read_whole(1, 0).ok());
  gated.Hold();
  std::thread rewind([&stub] {
    v1::RewindJobRequest request;
    request.set_name("p");
    request.set_epoch(0);
    v1::Job rewound;
    const grpc::Status s =
        stub.RewindJob(testutil::ServiceServer::Context().get(), request, &rewound);
    EXPECT_TRUE(s.ok()) << s.error_message();
  });
  gated.AwaitHeldCall();
  const v1::JobStatus rewinding = status_now();
  gated.Release();
  rewind.join();
  EXPECT_TRUE(rewinding.planning());
  EXPECT_EQ(rewinding.job().current_epoch(), 0u);
  EXPECT_EQ(rewinding.job().deal(), 0u);
  ASSERT_EQ(rewinding.ranks_size(), 2);
  EXPECT_EQ(rewinding.ranks(0).indices_streamed(), 0u);
}

}  // namespace
}  // namespace samplerd
