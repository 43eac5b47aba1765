#include "client/cpp/sampler_client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// A job of `n` samples for one rank, without a policy.
v1::JobSpec OneRankSpec(uint64_t n) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(1);
  return spec;
}

TEST(SamplerClientTest, ADeadServerIsUnavailableAfterBoundedRetries) {
  ClientOptions options;
  options.timeout = absl::Milliseconds(300);
  options.max_retries = 2;
  options.initial_backoff = absl::Milliseconds(20);
  auto client = SamplerClient::Create("127.0.0.1:1", options);  // Nothing listens on port 1.
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  auto jobs = (*client)->ListJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(SamplerClientTest, TheRetryBudgetBoundsTheRetriesAndTheErrorSaysSo) {
  ClientOptions options;
  options.timeout = absl::Milliseconds(300);
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(100);
  options.retry_budget = absl::Milliseconds(700);               // And no max_retries: the default.
  auto client = SamplerClient::Create("127.0.0.1:1", options);  // Nothing listens on port 1.
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  auto jobs = (*client)->ListJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(jobs.status().message()), HasSubstr("retry_budget = 700ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(SamplerClientTest, BadOptionsAreRejected) {
  EXPECT_EQ(SamplerClient::Create("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.max_retries = -1;
  auto client = SamplerClient::Create("127.0.0.1:1", options);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("max_retries = -1"));
  options = ClientOptions();
  options.retry_budget = absl::Seconds(-1);
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              HasSubstr("retry_budget = -1s"));
  options = ClientOptions();
  options.keepalive_timeout = absl::ZeroDuration();
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              HasSubstr("keepalive_timeout = 0: must be > 0"));
}

TEST(SamplerClientTest, AStreamDeadlineNamesJobEpochRankAndPosition) {
  auto server = Server::Create(testutil::LoopbackTestOptions());
  ASSERT_TRUE(server.ok());
  ClientOptions options;
  options.timeout = absl::Seconds(1);
  auto client = *SamplerClient::Create((*server)->address(), options);
  v1::JobSpec spec;
  spec.set_num_samples(1000);
  spec.set_world_size(2);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  ASSERT_TRUE(client->EndEpoch("j", 0, 0).ok());  // Rank 1 has not: epoch 1 is not planned.
  absl::Status s = client->StreamShard("j", 1, 0, 2, 0, false,
                                       [](const ShardSlice&) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job \"j\" epoch 1 rank 0 of 2: shard stream failed at position 0: "));
}

TEST(SamplerClientTest, ACallbackErrorStopsTheStreamAndIsReturned) {
  Options options = testutil::LoopbackTestOptions();
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok());
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec;
  spec.set_num_samples(1 << 18);
  spec.set_world_size(1);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  int chunks = 0;
  absl::Status s = client->StreamShard("j", 0, 0, 1, 0, false, [&](const ShardSlice& slice) {
    ++chunks;
    EXPECT_EQ(slice.shard_length, uint64_t{1} << 18);
    return absl::AbortedError("trainer stopped");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunks, 1);
  // Uploads validate their chunk size before sending anything.
  EXPECT_EQ(client->UploadWeights("j", std::vector<float>(4, 1.0f), 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// Job "j", epoch 0, rank 0: one loss for `index`, served at shard position `position`.
v1::LossBatch LossBatch(uint64_t seq, uint64_t index, uint64_t position) {
  v1::LossBatch batch;
  batch.set_job("j");
  batch.set_seq(seq);
  batch.add_indices(index);
  batch.add_losses(1.0f);
  batch.add_positions(position);
  return batch;
}

// A server that ends ReportLosses and uploads OK after reading only their first message (as
// samplerd did when a message in the middle did not parse): the client must not take that for
// success.
class UndercountingService final : public v1::Sampler::Service {
 public:
  grpc::Status UploadWeights(grpc::ServerContext*,
                             grpc::ServerReader<v1::UploadWeightsChunk>* reader,
                             v1::UploadSummary* summary) override {
    v1::UploadWeightsChunk chunk;
    if (reader->Read(&chunk)) summary->set_received(chunk.weights_size());
    return grpc::Status::OK;
  }
  grpc::Status ReportLosses(grpc::ServerContext*, grpc::ServerReader<v1::LossBatch>* reader,
                            v1::LossReportSummary* summary) override {
    v1::LossBatch batch;
    if (reader->Read(&batch)) {
      summary->set_batches(1);
      summary->set_accepted(batch.indices_size());
    }
    return grpc::Status::OK;
  }
};

TEST(SamplerClientTest, ASummaryThatCountsLessThanWasSentIsDataLoss) {
  UndercountingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  auto client = *SamplerClient::Create("127.0.0.1:" + std::to_string(port));

  absl::StatusOr<v1::LossReportSummary> summary =
      client->ReportLosses({LossBatch(0, 0, 0), LossBatch(1, 1, 1), LossBatch(2, 2, 2)});
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(summary.status().message()),
              HasSubstr("acknowledged 1 loss batches but the client sent 3"));

  const absl::Status upload = client->UploadWeights("j", std::vector<float>(8, 1.0f), 4);
  EXPECT_EQ(upload.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(upload.message()),
              HasSubstr("acknowledged 4 weights but the client sent 8"));
  server->Shutdown();
}

TEST(SamplerClientTest, ARealServerCountsEveryBatch) {
  Options options = testutil::LoopbackTestOptions();
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok());
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec;
  spec.set_num_samples(10);
  spec.set_world_size(1);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  auto shard = client->ReadShard("j", 0, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const v1::LossBatch first = LossBatch(0, (*shard)[0], 0), second = LossBatch(1, (*shard)[1], 1);
  // The last two are retries (duplicates): still counted.
  absl::StatusOr<v1::LossReportSummary> summary =
      client->ReportLosses({first, second, first, second});
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->batches(), 4u);
  EXPECT_EQ(summary->accepted(), 2u);
  EXPECT_EQ(summary->duplicates(), 2u);
}

// A stream waiting for an epoch that is not open (or between retries) ends with CANCELLED soon
// after Cancel(), not at its 30 s deadline; a cancelled StreamCancellation stops the next call
// before it starts.
TEST(SamplerClientTest, AStreamCancellationEndsAWaitingStreamPromptly) {
  auto server = Server::Create(testutil::LoopbackTestOptions());
  ASSERT_TRUE(server.ok());
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec = OneRankSpec(100);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  StreamCancellation cancellation;
  StreamShardOptions options;
  options.cancellation = &cancellation;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancellation.Cancel();
  });
  const absl::Time start = absl::Now();
  // Epoch 1 opens only when epoch 0 is ended: the call waits on the server.
  absl::Status s = client->StreamShard("j", 1, 0, 1, options,
                                       [](const ShardSlice&) { return absl::OkStatus(); });
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  int slices = 0;
  s = client->StreamShard("j", 0, 0, 1, options, [&](const ShardSlice&) {
    ++slices;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(slices, 0);
}

// max_chunk_size reaches the server: 100 indices in chunks of at most 7.
TEST(SamplerClientTest, StreamShardAsksForTheChunkSizeGiven) {
  auto server = Server::Create(testutil::LoopbackTestOptions());
  ASSERT_TRUE(server.ok());
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec = OneRankSpec(100);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  StreamShardOptions options;
  options.max_chunk_size = 7;
  options.start_offset = 2;
  std::vector<size_t> sizes;
  ASSERT_TRUE(client
                  ->StreamShard("j", 0, 0, 1, options,
                                [&](const ShardSlice& slice) {
                                  sizes.push_back(slice.indices.size());
                                  return absl::OkStatus();
                                })
                  .ok());
  ASSERT_EQ(sizes.size(), 14u);  // 98 indices from position 2.
  EXPECT_EQ(sizes.front(), 7u);
}

// StreamShardOptions::with_irreducible_losses: each slice carries the irreducible loss uploaded
// for each of its indices; a job without them is FAILED_PRECONDITION naming job and field.
TEST(SamplerClientTest, StreamShardDeliversTheIrreducibleLossesOfAReducibleLossJob) {
  auto server = Server::Create(testutil::LoopbackTestOptions());
  ASSERT_TRUE(server.ok());
  auto client = *SamplerClient::Create((*server)->address());
  v1::JobSpec spec = OneRankSpec(100);
  ASSERT_TRUE(client->CreateJob("plain", spec).ok());
  spec.mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
  spec.mutable_policy()->set_mix(1.0);
  ASSERT_TRUE(client->CreateJob("rho", spec).ok());
  std::vector<float> uploaded(100);
  for (int i = 0; i < 100; ++i) uploaded[i] = 0.25f * i;
  {
    auto stub = v1::Sampler::NewStub(
        grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::UploadSummary summary;
    auto writer = stub->UploadIrreducibleLosses(&context, &summary);
    v1::UploadIrreducibleLossesChunk chunk;
    chunk.set_job("rho");
    chunk.mutable_losses()->Add(uploaded.begin(), uploaded.end());
    ASSERT_TRUE(writer->Write(chunk));
    ASSERT_TRUE(writer->WritesDone());
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  StreamShardOptions options;
  options.max_chunk_size = 7;
  options.with_irreducible_losses = true;
  size_t delivered = 0;
  absl::Status s = client->StreamShard("rho", 0, 0, 1, options, [&](const ShardSlice& slice) {
    EXPECT_EQ(slice.irreducible_losses.size(), slice.indices.size());
    for (size_t k = 0; k < slice.indices.size(); ++k) {
      EXPECT_EQ(slice.irreducible_losses[k], uploaded[slice.indices[k]]) << slice.indices[k];
    }
    delivered += slice.indices.size();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(delivered, 100u);
  s = client->StreamShard("plain", 0, 0, 1, options,
                          [](const ShardSlice&) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("job 'plain'"));
  EXPECT_THAT(s.message(), HasSubstr("with_irreducible_losses"));
}

// An in-process server with `options` on the CPU backend; null, failing the test, if it does not
// start.
std::unique_ptr<Server> StartCpuServer(Options options) {
  options.backend = "cpu";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A second shard stream, refused by the server's stream buffer budget (RESOURCE_EXHAUSTED,
// "retry later") while a first holds it, is retried with backoff and completes once the first
// ends, instead of failing the trainer. Before the retry: RESOURCE_EXHAUSTED at once.
TEST(SamplerClientTest, AStreamRefusedByTheStreamBufferBudgetIsRetriedUntilItFits) {
  Options server_options = testutil::LoopbackTestOptions();
  // 1024-index chunks cost 16 KiB (SamplerService::ChunkBytes): room for one stream, not two.
  server_options.max_stream_buffer_bytes = 24 << 10;
  std::unique_ptr<Server> server = StartCpuServer(server_options);
  ASSERT_NE(server, nullptr);
  const std::string address = server->address();
  // The holder reads one chunk of its 4 MiB shard and stops. Without BDP probing its
  // flow-control window stays 64 KiB: the server waits to write, holding its budget.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto holder = *SamplerClient::CreateWithChannel(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  v1::JobSpec spec;
  spec.set_num_samples(1 << 21);
  spec.set_world_size(2);
  ASSERT_TRUE(holder->CreateJob("j", spec).ok());
  StreamShardOptions chunks;
  chunks.max_chunk_size = 1024;
  absl::Notification holding;
  absl::Notification release;
  std::thread first([&] {
    absl::Status s = holder->StreamShard("j", 0, 0, 2, chunks, [&](const ShardSlice&) {
      if (!holding.HasBeenNotified()) {
        holding.Notify();
        release.WaitForNotification();
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  holding.WaitForNotification();
  ClientOptions once;
  once.max_retries = 0;
  absl::Status refused = (*SamplerClient::Create(address, once))
                             ->StreamShard("j", 0, 1, 2, chunks,
                                           [](const ShardSlice&) { return absl::OkStatus(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("retry later"));
  ClientOptions patient;
  patient.initial_backoff = absl::Milliseconds(20);
  patient.max_backoff = absl::Milliseconds(100);
  patient.retry_budget = absl::Seconds(60);
  auto client = *SamplerClient::Create(address, patient);
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(500));
    release.Notify();
  });
  const absl::Time start = absl::Now();
  uint64_t received = 0;
  absl::Status s = client->StreamShard("j", 0, 1, 2, chunks, [&](const ShardSlice& slice) {
    received += slice.indices.size();
    return absl::OkStatus();
  });
  const absl::Duration elapsed = absl::Now() - start;
  releaser.join();
  first.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(received, uint64_t{1} << 20);
  EXPECT_GT(elapsed, absl::Milliseconds(300)) << "the budget was not held";
}

// Records how each StreamShard call of its channel ended, as gRPC gave it to the client: the
// attempts behind one SamplerClient::StreamShard. Observes only (the statuses pass unchanged).
class StreamShardOutcomes : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    if (std::string(info->method()) != "/samplerd.v1.Sampler/StreamShard") return nullptr;
    return new Recorder(this);
  }

  std::vector<grpc::Status> outcomes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return outcomes_;
  }

 private:
  class Recorder : public grpc::experimental::Interceptor {
   public:
    explicit Recorder(StreamShardOutcomes* owner) : owner_(owner) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      if (methods->QueryInterceptionHookPoint(
              grpc::experimental::InterceptionHookPoints::POST_RECV_STATUS)) {
        absl::MutexLock lock(&owner_->mu_);
        owner_->outcomes_.push_back(*methods->GetRecvStatus());
      }
      methods->Proceed();
    }

   private:
    StreamShardOutcomes* const owner_;
  };

  mutable absl::Mutex mu_;
  std::vector<grpc::Status> outcomes_ ABSL_GUARDED_BY(mu_);
};

// `count` CreateJob requests of `bytes` bytes at once, each on a connection of its own (a local
// subchannel pool per channel), until each has ended.
void LargeRequests(const std::string& address, int count, size_t bytes) {
  std::vector<std::thread> threads;
  for (int k = 0; k < count; ++k) {
    threads.emplace_back([&, k] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = v1::Sampler::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      v1::CreateJobRequest request;
      request.set_name(std::string(bytes, 'n'));
      v1::Job job;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      stub->CreateJob(&context, request, &job);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Issue 33: a shard stream that gRPC's transport quota resets (Options::max_transport_buffer_bytes
// exceeded: RST_STREAM ENHANCE_YOUR_CALM, RESOURCE_EXHAUSTED "Received RST_STREAM with error
// code 11" at the client) is opened again with backoff within the retry budget, not returned.
// Rank 0's stream of epoch 1 waits in the server (rank 1 has not ended epoch 0) while two
// 16 MiB requests arrive on connections of their own against an 8 MiB quota. gRPC 1.51 frees
// memory by resetting one stream of a connection per step, the connections in the order they
// first opened a stream (its destructive reclaimers queue first in, first out): the client's
// connection opened one (CreateJob) before the requests', so its waiting stream is reset first,
// then the requests. Should the stream not have reached the server yet, the requests are sent
// again. The interceptor shows the reset attempt; the shard is read whole once the epoch closes.
// Seen on the way (85 of 185 runs): the reset leaves the client's connection without a stream,
// so gRPC's next step may close it (GOAWAY, its benign reclaimer), and the retry opened on it
// then fails UNAVAILABLE "GOAWAY received" and is retried again, on a new connection; in 4 the
// first retry was reset too. Every run was reset at the first round of requests.
TEST(SamplerClientTest, AShardStreamResetByTheTransportQuotaIsRetriedWithinTheRetryBudget) {
  Options server_options = testutil::LoopbackTestOptions();
  server_options.max_transport_buffer_bytes = 8 << 20;
  std::unique_ptr<Server> server = StartCpuServer(server_options);
  ASSERT_NE(server, nullptr);
  const std::string address = server->address();
  auto outcomes = std::make_unique<StreamShardOutcomes>();
  StreamShardOutcomes* const seen = outcomes.get();  // Owned by the channel.
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::move(outcomes));
  ClientOptions patient;
  patient.initial_backoff = absl::Milliseconds(50);
  patient.max_backoff = absl::Milliseconds(200);
  patient.retry_budget = absl::Seconds(60);
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(factories));
  auto client = *SamplerClient::CreateWithChannel(channel, patient);
  v1::JobSpec spec;
  spec.set_num_samples(1000);
  spec.set_world_size(2);
  ASSERT_TRUE(client->CreateJob("j", spec).ok());
  ASSERT_TRUE(client->EndEpoch("j", 0, 0).ok());  // Rank 1 has not: epoch 1 waits for it.
  absl::StatusOr<std::vector<uint64_t>> shard;
  std::thread reader([&] { shard = client->ReadShard("j", 1, 0, 2); });
  const auto reset = [&] {
    for (const grpc::Status& s : seen->outcomes()) {
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          absl::StrContains(s.error_message(), "RST_STREAM")) {
        return true;
      }
    }
    return false;
  };
  int rounds = 0;
  for (; rounds < 20 && !reset(); ++rounds) {
    absl::SleepFor(absl::Milliseconds(200));  // The stream reaches the server and waits.
    // Each reset, or closed, or read whole once the quota was freed: load only.
    LargeRequests(address, 2, 16 << 20);
  }
  ASSERT_TRUE(reset()) << "the waiting shard stream was not reset in " << rounds << " rounds";
  ASSERT_TRUE(client->EndEpoch("j", 0, 1).ok());
  reader.join();
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<grpc::Status> attempts = seen->outcomes();
  EXPECT_EQ(attempts.front().error_message(), "Received RST_STREAM with error code 11");
  EXPECT_TRUE(attempts.back().ok()) << attempts.back().error_message();
  // The whole shard, as an observer reads it; with rank 1's, every sample once.
  std::vector<uint64_t> observed[2];
  for (uint32_t rank : {0u, 1u}) {
    StreamShardOptions look;
    look.observe = true;
    ASSERT_TRUE(client
                    ->StreamShard("j", 1, rank, 2, look,
                                  [&](const ShardSlice& slice) {
                                    observed[rank].insert(observed[rank].end(),
                                                          slice.indices.begin(),
                                                          slice.indices.end());
                                    return absl::OkStatus();
                                  })
                    .ok());
  }
  EXPECT_EQ(*shard, observed[0]);
  std::vector<uint64_t> all = observed[0];
  all.insert(all.end(), observed[1].begin(), observed[1].end());
  std::sort(all.begin(), all.end());
  std::vector<uint64_t> every(1000);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(all, every);
  std::printf("reset after %d round(s) of requests; %zu attempts:", rounds, attempts.size());
  for (const grpc::Status& s : attempts) {
    std::printf(" [%d %s]", static_cast<int>(s.error_code()), s.error_message().c_str());
  }
  std::printf("\n");
}

}  // namespace
}  // namespace samplerd
