// LossReporter against a real in-process samplerd over real gRPC (loopback, port 0): ranks in
// threads and in a separate process, exactly-once counting under injected faults (a gRPC client
// interceptor that loses acknowledgements, cuts streams or holds them) and across a reporter
// restart, errors at the call and from the server, back-pressure, and the device path (skipped
// without a GPU).
#include "client/cpp/loss_reporter.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/cuda_support.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

constexpr char kReportLosses[] = "/samplerd.v1.Sampler/ReportLosses";

// What the interceptor does to the n-th ReportLosses call (0-based) of its channel.
enum class Fault {
  kNone,
  // The server applies the whole stream, then its OK never reaches the client (UNAVAILABLE).
  kLoseAcknowledgement,
  // The stream is cancelled as its second message is sent; the client sees UNAVAILABLE, as for
  // a dropped connection. The server may have applied the first batch, or not.
  kCutAfterFirstBatch,
  // The status is held until the test releases it (FaultInjector::Release).
  kHold,
  // The server applies the whole stream, and the client sees CANCELLED: what a samplerd shutting
  // down gracefully does to the calls it had not finished when its drain ended (gRPC's
  // Server::Shutdown cancels them), e.g. one that reached it just as its handlers went idle.
  kCancelledByServer,
};

// Injects faults into ReportLosses calls: a client interceptor factory whose plan says, per
// call number, which fault to inject.
class FaultInjector : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit FaultInjector(std::function<Fault(int call)> plan) : plan_(std::move(plan)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    if (std::string(info->method()) != kReportLosses) return nullptr;
    return new Interceptor(this, info, plan_(calls_++));
  }

  void Release() { released_.Notify(); }
  int calls() const { return calls_.load(); }
  int faults() const { return faults_.load(); }

 private:
  class Interceptor : public grpc::experimental::Interceptor {
   public:
    Interceptor(FaultInjector* owner, grpc::experimental::ClientRpcInfo* info, Fault fault)
        : owner_(owner), info_(info), fault_(fault) {}

    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      using Hook = grpc::experimental::InterceptionHookPoints;
      if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE) &&
          fault_ == Fault::kCutAfterFirstBatch && ++sent_ == 2) {
        info_->client_context()->TryCancel();
      }
      if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_STATUS)) {
        grpc::Status* status = methods->GetRecvStatus();
        switch (fault_) {
          case Fault::kNone:
            break;
          case Fault::kLoseAcknowledgement:
            if (status->ok()) {
              *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected: summary lost");
              ++owner_->faults_;
            }
            break;
          case Fault::kCutAfterFirstBatch:
            if (status->error_code() == grpc::StatusCode::CANCELLED) {
              *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected: stream cut");
              ++owner_->faults_;
            }
            break;
          case Fault::kHold:
            owner_->released_.WaitForNotification();
            break;
          case Fault::kCancelledByServer:
            if (status->ok()) {
              *status = grpc::Status(grpc::StatusCode::CANCELLED, "injected: server shutdown");
              ++owner_->faults_;
            }
            break;
        }
      }
      methods->Proceed();
    }

   private:
    FaultInjector* const owner_;
    grpc::experimental::ClientRpcInfo* const info_;
    const Fault fault_;
    int sent_ = 0;
  };

  const std::function<Fault(int)> plan_;
  std::atomic<int> calls_{0};
  std::atomic<int> faults_{0};
  absl::Notification released_;
};

// A client whose ReportLosses calls go through `injector` (owned by the channel).
std::unique_ptr<SamplerClient> ClientWithFaults(const std::string& address,
                                                std::unique_ptr<FaultInjector> injector) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::move(injector));
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(factories));
  ClientOptions options;
  options.initial_backoff = absl::Milliseconds(5);
  return *SamplerClient::CreateWithChannel(channel, options);
}

float LossOf(uint64_t index) { return (index % 100) * 0.01f; }

class LossReporterTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSamples = 20000;
  static constexpr uint32_t kWorld = 4;
  static constexpr uint64_t kShard = kSamples / kWorld;

  void SetUp() override {
    auto server = Server::Create(testutil::LoopbackTestOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = *SamplerClient::Create(server_->address());
    v1::JobSpec spec;
    spec.set_num_samples(kSamples);
    spec.set_world_size(kWorld);
    spec.set_seed(5);
    spec.mutable_policy()->set_loss(v1::LOSS);
    ASSERT_TRUE(client_->CreateJob("j", spec).ok());
    for (uint32_t r = 0; r < kWorld; ++r) {
      auto shard = client_->ReadShard("j", 0, r, kWorld);
      ASSERT_TRUE(shard.ok()) << shard.status();
      ASSERT_EQ(shard->size(), kShard);
      shards_.push_back(*std::move(shard));
    }
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Reports rank `rank`'s losses of epoch 0 at positions [from, to), `step` pairs per call.
  static absl::Status ReportRange(LossReporter& reporter, const std::vector<uint64_t>& shard,
                                  uint64_t from, uint64_t to, uint64_t step = 512) {
    std::vector<float> losses;
    for (uint64_t lo = from; lo < to; lo += step) {
      const uint64_t hi = std::min(to, lo + step);
      losses.clear();
      for (uint64_t p = lo; p < hi; ++p) losses.push_back(LossOf(shard[p]));
      absl::Status s =
          reporter.Report(0, lo, absl::MakeConstSpan(shard.data() + lo, hi - lo), losses);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Loss pairs the server accepted from `rank` in the current epoch.
  uint64_t AcceptedByServer(uint32_t rank) {
    auto status = client_->GetJobStatus("j");
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return 0;
    for (const v1::RankProgress& progress : status->ranks()) {
      if (progress.rank() == rank) return progress.losses_accepted();
    }
    return 0;
  }

  std::unique_ptr<LossReporter> NewReporter(SamplerClient* client, uint32_t rank,
                                            LossReporterOptions options = {}) {
    auto reporter = LossReporter::Create(client, "j", rank, kWorld, options);
    EXPECT_TRUE(reporter.ok()) << reporter.status();
    return reporter.ok() ? *std::move(reporter) : nullptr;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<SamplerClient> client_;
  std::vector<std::vector<uint64_t>> shards_;
};

// Runs `command` through the shell; returns its exit status and stdout.
std::pair<int, std::string> RunProcess(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  return {pclose(pipe), out};
}

std::string RankCommand(const std::string& address, uint32_t rank, bool flush) {
  return absl::StrCat("tests/loss_reporter_rank --address=", address, " --job=j --rank=", rank,
                      " --world_size=4 --flush=", flush ? "true" : "false");
}

TEST_F(LossReporterTest, RanksInThreadsAndInAProcessReportEveryLossOnce) {
  std::vector<std::unique_ptr<LossReporter>> reporters(kWorld - 1);
  std::vector<absl::Status> results(kWorld - 1);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r + 1 < kWorld; ++r) {
    reporters[r] = NewReporter(client_.get(), r);
    ASSERT_NE(reporters[r], nullptr);
    ranks.emplace_back([&, r] {
      results[r] = ReportRange(*reporters[r], shards_[r], 0, kShard);
      if (results[r].ok()) results[r] = reporters[r]->Flush();
    });
  }
  // The last rank is a process of its own, with its own client and reporter.
  const auto [exit_status, out] = RunProcess(RankCommand(server_->address(), kWorld - 1, true));
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(exit_status, 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("accepted=", kShard, " duplicates=0")));
  for (uint32_t r = 0; r + 1 < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r];
    const LossCounts counts = reporters[r]->counts();
    EXPECT_EQ(counts.reported, kShard);
    EXPECT_EQ(counts.acknowledged, kShard);
    EXPECT_EQ(counts.accepted, kShard);
    EXPECT_EQ(counts.duplicates + counts.stale, 0u);
  }
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(AcceptedByServer(r), kShard) << "rank " << r;
  auto status = client_->GetJobStatus("j");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->samples_seen(), kSamples);  // M = N without replacement: each sample once.
}

TEST_F(LossReporterTest, LostAcknowledgementsAndCutStreamsCountEveryLossOnce) {
  // Calls 0, 3, 6... lose their summary after the server applied them; calls 1, 4, 7... are
  // cut after their first batch. The client resends each (its retries), the reporter waits.
  auto injector = std::make_unique<FaultInjector>([](int call) {
    switch (call % 3) {
      case 0:
        return Fault::kLoseAcknowledgement;
      case 1:
        return Fault::kCutAfterFirstBatch;
      default:
        return Fault::kNone;
    }
  });
  FaultInjector* faults = injector.get();
  auto client = ClientWithFaults(server_->address(), std::move(injector));
  LossReporterOptions options;
  options.max_batch_pairs = 256;  // Several batches per stream, so that a cut can fall inside.
  auto reporter = NewReporter(client.get(), 1, options);
  ASSERT_NE(reporter, nullptr);
  // Flushing every few calls makes many streams, each with its own fault.
  for (uint64_t lo = 0; lo < kShard; lo += 1024) {
    ASSERT_TRUE(ReportRange(*reporter, shards_[1], lo, std::min(kShard, lo + 1024)).ok());
    ASSERT_TRUE(reporter->Flush().ok());
  }
  EXPECT_GE(faults->faults(), 4);
  const LossCounts counts = reporter->counts();
  EXPECT_EQ(counts.reported, kShard);
  EXPECT_EQ(counts.acknowledged, kShard);
  EXPECT_GT(counts.duplicates, 0u);  // The resent streams' pairs applied the first time.
  EXPECT_EQ(counts.accepted + counts.duplicates, kShard);
  EXPECT_EQ(AcceptedByServer(1), kShard);
}

TEST_F(LossReporterTest, StreamsTheServerCancelledAreSentAgainAndCountedOnce) {
  // Every other call comes back CANCELLED after the server applied it.
  auto injector = std::make_unique<FaultInjector>(
      [](int call) { return call % 2 == 0 ? Fault::kCancelledByServer : Fault::kNone; });
  FaultInjector* faults = injector.get();
  auto client = ClientWithFaults(server_->address(), std::move(injector));
  auto reporter = NewReporter(client.get(), 3);
  ASSERT_NE(reporter, nullptr);
  for (uint64_t lo = 0; lo < kShard; lo += 2500) {
    ASSERT_TRUE(ReportRange(*reporter, shards_[3], lo, lo + 2500).ok());
    ASSERT_TRUE(reporter->Flush().ok()) << reporter->Flush();
  }
  EXPECT_GE(faults->faults(), 2);
  const LossCounts counts = reporter->counts();
  EXPECT_EQ(counts.acknowledged, kShard);
  EXPECT_EQ(counts.accepted + counts.duplicates, kShard);
  EXPECT_EQ(AcceptedByServer(3), kShard);
}

TEST_F(LossReporterTest, ARestartedReporterResendsPositionsAsDuplicates) {
  {
    auto first = NewReporter(client_.get(), 2);
    ASSERT_TRUE(ReportRange(*first, shards_[2], 0, 3000).ok());
    ASSERT_TRUE(first->Close().ok());
    EXPECT_EQ(first->counts().accepted, 3000u);
  }
  // The restarted rank trains from position 0 again (an older checkpoint) and goes further.
  auto second = NewReporter(client_.get(), 2);
  ASSERT_TRUE(ReportRange(*second, shards_[2], 0, kShard, 1000).ok());
  ASSERT_TRUE(second->Flush().ok());
  EXPECT_EQ(second->counts().duplicates, 3000u);
  EXPECT_EQ(second->counts().accepted, kShard - 3000);
  EXPECT_EQ(AcceptedByServer(2), kShard);
}

TEST_F(LossReporterTest, AProcessThatDiesBeforeFlushingIsCompletedByItsSuccessor) {
  // The child reports all of rank 0's shard and exits without flushing: some of it reached
  // the server, maybe none, maybe all.
  const auto [exit_status, out] = RunProcess(RankCommand(server_->address(), 0, false));
  ASSERT_EQ(exit_status, 0) << out;
  const uint64_t applied_by_child = AcceptedByServer(0);
  auto successor = NewReporter(client_.get(), 0);
  ASSERT_TRUE(ReportRange(*successor, shards_[0], 0, kShard).ok());
  ASSERT_TRUE(successor->Flush().ok());
  EXPECT_EQ(successor->counts().duplicates, applied_by_child);
  EXPECT_EQ(successor->counts().accepted, kShard - applied_by_child);
  EXPECT_EQ(AcceptedByServer(0), kShard);
}

TEST_F(LossReporterTest, BadArgumentsAreRefusedAtTheCallAndChangeNothing) {
  auto reporter = NewReporter(client_.get(), 0);
  const std::vector<uint64_t> index = {shards_[0][0]};
  auto expect_refused = [&](const absl::Status& s, const std::string& names) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(names));
  };
  expect_refused(reporter->Report(0, 0, index, {std::nanf("")}), "losses[0] = nan");
  expect_refused(reporter->Report(0, 0, index, {std::numeric_limits<float>::infinity()}),
                 "losses[0] = inf");
  expect_refused(reporter->Report(0, 0, index, {-1.0f}), "losses[0] = -1");
  expect_refused(reporter->Report(0, 0, {shards_[0][0], kSamples}, {1.0f, 1.0f}),
                 "indices[1] = 20000 is outside [0, num_samples = 20000)");
  expect_refused(reporter->Report(0, 0, index, {1.0f, 2.0f}), "indices: 1 entries but losses: 2");
  expect_refused(reporter->ReportAt(0, {0, 1}, index, {1.0f}),
                 "positions: 2 entries but indices: 1");
  LossReporterOptions small;
  small.max_buffered_pairs = 1;
  auto tiny = NewReporter(client_.get(), 0, small);
  expect_refused(tiny->Report(0, 0, {shards_[0][0], shards_[0][1]}, {1.0f, 1.0f}),
                 "2 pairs in one call; at most max_buffered_pairs = 1");
  // At creation.
  expect_refused(LossReporter::Create(client_.get(), "j", 4, 4).status(),
                 "rank = 4: must be < world_size = 4");
  expect_refused(LossReporter::Create(client_.get(), "j", 0, 0).status(), "world_size = 0");
  LossReporterOptions zero;
  zero.max_batch_pairs = 0;
  expect_refused(LossReporter::Create(client_.get(), "j", 0, 4, zero).status(),
                 "max_batch_pairs = 0");
  EXPECT_EQ(LossReporter::Create(client_.get(), "nope", 0, 4).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing of the refused calls was reported; the reporter still works.
  ASSERT_TRUE(reporter->Report(0, 0, index, {0.5f}).ok());
  ASSERT_TRUE(reporter->Flush().ok());
  EXPECT_EQ(reporter->counts().reported, 1u);
  EXPECT_EQ(AcceptedByServer(0), 1u);
}

TEST_F(LossReporterTest, AServerErrorSurfacesAtTheNextCallAndStopsTheReporter) {
  auto reporter = NewReporter(client_.get(), 1);
  // A valid index (< N), but not the one rank 1 was served at position 7.
  const uint64_t wrong = shards_[1][7] == 0 ? 1 : 0;
  ASSERT_TRUE(reporter->Report(0, 7, {wrong}, {1.0f}).ok());  // Found by the server, later.
  const absl::Status flushed = reporter->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInvalidArgument) << flushed;
  EXPECT_THAT(std::string(flushed.message()), HasSubstr(absl::StrCat("indices[0] = ", wrong,
                                                                     " was not served to rank 1 at "
                                                                     "position 7")));
  EXPECT_THAT(std::string(flushed.message()), HasSubstr("epoch 0, positions [7, 8)"));
  // Sticky: the next Report returns it too, and reports nothing.
  const absl::Status next = reporter->Report(0, 8, {shards_[1][8]}, {1.0f});
  EXPECT_EQ(next, flushed);
  EXPECT_EQ(reporter->Close(), flushed);
  EXPECT_EQ(AcceptedByServer(1), 0u);

  // An epoch not open yet: FAILED_PRECONDITION, at the next call.
  auto early = NewReporter(client_.get(), 1);
  ASSERT_TRUE(early->Report(5, 0, {shards_[1][0]}, {1.0f}).ok());
  EXPECT_EQ(early->Flush().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LossReporterTest, ReportsMergeWhileAStreamIsInFlightAndBlockWhenTheBufferIsFull) {
  // The first ReportLosses call is held by the interceptor until released.
  auto injector = std::make_unique<FaultInjector>(
      [](int call) { return call == 0 ? Fault::kHold : Fault::kNone; });
  FaultInjector* faults = injector.get();
  auto client = ClientWithFaults(server_->address(), std::move(injector));
  LossReporterOptions options;
  options.max_buffered_pairs = 4 * 512;
  auto reporter = NewReporter(client.get(), 3, options);
  ASSERT_TRUE(ReportRange(*reporter, shards_[3], 0, 512).ok());
  while (faults->calls() == 0) absl::SleepFor(absl::Milliseconds(1));  // In flight, held.
  // Three more calls fit (4 x 512 in all) and merge into one batch; the fifth blocks.
  ASSERT_TRUE(ReportRange(*reporter, shards_[3], 512, 4 * 512).ok());
  std::atomic<bool> returned{false};
  std::thread fifth([&] {
    EXPECT_TRUE(ReportRange(*reporter, shards_[3], 4 * 512, 5 * 512).ok());
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(returned.load()) << "Report did not block on a full buffer";
  faults->Release();
  fifth.join();
  ASSERT_TRUE(reporter->Flush().ok());
  const LossCounts counts = reporter->counts();
  EXPECT_EQ(counts.accepted, 5 * 512u);
  // The held batch, the three merged calls, and the fifth (which may still join them if it
  // takes the lock before the sender seals them): 2 or 3 batches for 5 calls.
  EXPECT_GE(counts.batches, 2u);
  EXPECT_LE(counts.batches, 3u);
  EXPECT_EQ(AcceptedByServer(3), 5 * 512u);
}

TEST_F(LossReporterTest, LossesOfAClosedEpochAreCountedStale) {
  // One rank reports part of epoch 0 late, after every rank ended it.
  for (uint32_t r = 0; r < kWorld; ++r) ASSERT_TRUE(client_->EndEpoch("j", 0, r).ok());
  auto reporter = NewReporter(client_.get(), 0);
  // The server opens epoch 1 in the background: epoch 0's losses are stale from then on.
  ASSERT_TRUE(client_->ReadShard("j", 1, 0, kWorld).ok());
  ASSERT_TRUE(ReportRange(*reporter, shards_[0], 0, 100).ok());
  ASSERT_TRUE(reporter->Flush().ok());
  EXPECT_EQ(reporter->counts().stale, 100u);
  EXPECT_EQ(reporter->counts().accepted, 0u);
}

TEST_F(LossReporterTest, ReportFromDevice) {
  auto reporter = NewReporter(client_.get(), 2);
  if (absl::Status gpu = GpuAvailable(); !gpu.ok()) {
    // Without a GPU the device path fails at the call, naming why, and reports nothing.
    const int64_t fake = 0;
    const float loss = 0;
    const absl::Status s = reporter->ReportFromDevice(0, 0, &fake, &loss, 1, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(reporter->counts().reported, 0u);
    GTEST_SKIP() << "no GPU: " << gpu.message();
  }
  const std::vector<uint64_t>& shard = shards_[2];
  std::vector<int64_t> indices(shard.begin(), shard.end());
  std::vector<float> losses;
  for (uint64_t i : shard) losses.push_back(LossOf(i));
  int64_t* d_indices = nullptr;
  float* d_losses = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_indices), kShard * sizeof(int64_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_losses), kShard * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_indices, indices.data(), kShard * sizeof(int64_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_losses, losses.data(), kShard * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  // cudaMemcpy from pageable memory may return before its DMA (on the legacy stream) is done,
  // and the non-blocking stream below does not wait for it.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // Steps of 512, as a trainer would, and one call larger than a staging slot.
  LossReporterOptions options;
  options.device_slot_pairs = 1024;
  auto small_slots = NewReporter(client_.get(), 2, options);
  for (uint64_t lo = 0; lo < 3072; lo += 512) {
    ASSERT_TRUE(
        small_slots->ReportFromDevice(0, lo, d_indices + lo, d_losses + lo, 512, stream).ok());
  }
  ASSERT_TRUE(
      small_slots
          ->ReportFromDevice(0, 3072, d_indices + 3072, d_losses + 3072, kShard - 3072, stream)
          .ok());
  ASSERT_TRUE(small_slots->Flush().ok());
  EXPECT_EQ(small_slots->counts().accepted, kShard);
  EXPECT_EQ(AcceptedByServer(2), kShard);

  // A NaN on the device is found when the copy lands, and surfaces at the next call.
  const float nan = std::nanf("");
  ASSERT_EQ(cudaMemcpy(d_losses + 5, &nan, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // As above: landed before `stream` reads it.
  ASSERT_TRUE(reporter->ReportFromDevice(0, 0, d_indices, d_losses, 16, stream).ok());
  const absl::Status flushed = reporter->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInvalidArgument) << flushed;
  EXPECT_THAT(std::string(flushed.message()), HasSubstr("losses[5] = nan"));
  EXPECT_EQ(reporter->Report(0, 0, {shard[0]}, {1.0f}), flushed);
  cudaStreamDestroy(stream);
  cudaFree(d_indices);
  cudaFree(d_losses);
}

}  // namespace
}  // namespace samplerd
