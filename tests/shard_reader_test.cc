// ShardReader against a real in-process samplerd over real gRPC (port 0): several ranks in
// threads, batches of every size, reader positions saved and restored, a server shut down and
// restarted on its --data_dir, and the errors of bad arguments at the call.
#include "client/cpp/shard_reader.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/cuda_support.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_dir.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<SamplerClient> Connect(const std::string& address, ClientOptions options = {}) {
  absl::StatusOr<std::unique_ptr<SamplerClient>> client = SamplerClient::Create(address, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::shared_ptr<SamplerClient>(*std::move(client));
}

void CreateJob(SamplerClient& client, const std::string& name, uint64_t n, uint32_t world) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(world);
  spec.set_seed(5);
  absl::StatusOr<v1::Job> job = client.CreateJob(name, spec);
  ASSERT_TRUE(job.ok()) << job.status();
}

std::unique_ptr<ShardReader> MakeReader(std::shared_ptr<SamplerClient> client,
                                        const std::string& job, uint32_t rank, uint32_t world,
                                        size_t capacity, uint32_t chunk = 0) {
  ShardReaderOptions options;
  options.job = job;
  options.rank = rank;
  options.world_size = world;
  options.queue_capacity = capacity;
  options.max_chunk_size = chunk;
  absl::StatusOr<std::unique_ptr<ShardReader>> reader =
      ShardReader::Create(std::move(client), options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  return reader.ok() ? *std::move(reader) : nullptr;
}

// Reads the rest of the open epoch with Next(sizes[0]), Next(sizes[1]), ... (cycling), checking
// that each batch starts where the previous ended and has the size asked for (less only at the
// end of the shard). Appends the indices to *out.
absl::Status ReadRest(ShardReader& reader, const std::vector<size_t>& sizes,
                      std::vector<uint64_t>* out) {
  absl::StatusOr<ReaderPosition> at = reader.position();
  if (!at.ok()) return at.status();
  uint64_t expected = at->position;
  for (size_t call = 0;; ++call) {
    const size_t n = sizes[call % sizes.size()];
    absl::StatusOr<ShardBatch> batch = reader.Next(n);
    if (!batch.ok()) return batch.status();
    if (batch->position != expected) {
      return absl::InternalError(
          absl::StrCat("batch at ", batch->position, ", expected ", expected));
    }
    if (batch->end_of_shard()) {
      if (expected != batch->shard_length) {
        return absl::InternalError(
            absl::StrCat("ended at ", expected, " of ", batch->shard_length));
      }
      return absl::OkStatus();
    }
    if (batch->indices.size() != std::min<uint64_t>(n, batch->shard_length - expected)) {
      return absl::InternalError(absl::StrCat("Next(", n, ") gave ", batch->indices.size()));
    }
    out->insert(out->end(), batch->indices.begin(), batch->indices.end());
    expected += batch->indices.size();
  }
}

class ShardReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Create(testutil::LoopbackTestOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = Connect(server_->address());
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<SamplerClient> client_;
};

// Four ranks in threads, two epochs each, with a queue far smaller than the shard (the stream
// pauses and reopens many times) and batch sizes from 1 to the whole queue: every shard equals
// ReadShard's, and together they are the plan: every sample once (M = N, no replacement).
TEST_F(ShardReaderTest, RanksInThreadsReadCompleteDisjointShardsInOrder) {
  const uint64_t n = 40'003;  // Not a multiple of the world size: the last positions pad.
  const uint32_t world = 4;
  CreateJob(*client_, "j", n, world);
  std::vector<std::vector<std::vector<uint64_t>>> read(2,
                                                       std::vector<std::vector<uint64_t>>(world));
  std::vector<std::vector<std::vector<uint64_t>>> expected = read;
  std::vector<absl::Status> errors(world);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto reader = MakeReader(client_, "j", r, world, /*capacity=*/1000, /*chunk=*/300);
      if (reader == nullptr) return;
      const std::vector<size_t> sizes = {1, 7, 64, 333, 1000, 999, 2};
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        absl::StatusOr<std::vector<uint64_t>> reference = client_->ReadShard("j", epoch, r, world);
        if (!reference.ok()) {
          errors[r] = reference.status();
          return;
        }
        expected[epoch][r] = *std::move(reference);
        absl::Status s = reader->StartEpoch(epoch);
        if (s.ok()) s = ReadRest(*reader, sizes, &read[epoch][r]);
        // The end of the shard stays the end.
        if (s.ok()) {
          absl::StatusOr<ShardBatch> again = reader->Next(5);
          if (!again.ok() || !again->end_of_shard()) s = absl::InternalError("not at the end");
        }
        if (s.ok()) s = client_->EndEpoch("j", epoch, r).status();
        if (!s.ok()) {
          errors[r] = s;
          return;
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (uint32_t r = 0; r < world; ++r)
    ASSERT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<uint64_t> plan;
    for (uint32_t r = 0; r < world; ++r) {
      EXPECT_EQ(read[epoch][r], expected[epoch][r]) << "epoch " << epoch << " rank " << r;
      EXPECT_EQ(read[epoch][r].size(), (n + world - 1) / world);
    }
    // Interleaved: plan position p is rank p % R's shard position p / R.
    for (uint64_t p = 0; p < n; ++p) {
      EXPECT_TRUE(plan.insert(read[epoch][p % world][p / world]).second)
          << "epoch " << epoch << ": index at plan position " << p << " read twice";
    }
    EXPECT_EQ(plan.size(), n);
    EXPECT_EQ(*plan.rbegin(), n - 1);
  }
  EXPECT_NE(read[0][0], read[1][0]) << "epoch 1 served epoch 0's shard";
}

TEST_F(ShardReaderTest, BadArgumentsAreErrorsAtTheCall) {
  CreateJob(*client_, "j", 1000, 2);
  ShardReaderOptions options;
  options.job = "j";
  options.world_size = 2;
  const struct {
    void (*change)(ShardReaderOptions*);
    std::string message;
  } bad[] = {
      {[](ShardReaderOptions* o) { o->rank = 2; }, "rank = 2: must be < world_size = 2"},
      {[](ShardReaderOptions* o) { o->world_size = 0; }, "world_size = 0: must be >= 1"},
      {[](ShardReaderOptions* o) { o->job = ""; }, "job = \"\": must not be empty"},
      {[](ShardReaderOptions* o) { o->queue_capacity = 1; }, "queue_capacity = 1: must be >= 2"},
      {[](ShardReaderOptions* o) { o->max_chunk_size = 1 << 21; }, "max_chunk_size = 2097152"},
      {[](ShardReaderOptions* o) { o->device_staging_slots = 0; }, "device_staging_slots = 0"},
  };
  for (const auto& b : bad) {
    ShardReaderOptions o = options;
    b.change(&o);
    auto reader = ShardReader::Create(client_, o);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(b.message));
  }
  EXPECT_EQ(ShardReader::Create(nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto reader = MakeReader(client_, "j", 1, 2, /*capacity=*/100);
  ASSERT_NE(reader, nullptr);
  // Nothing open yet.
  EXPECT_EQ(reader->Next(10).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reader->Next(10).status().message()), HasSubstr("no epoch is open"));
  EXPECT_EQ(reader->position().status().code(), absl::StatusCode::kFailedPrecondition);
  // Refused by the server, at StartEpoch, naming job, epoch and rank.
  const absl::Status past = reader->StartEpoch(0, /*start_position=*/501);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
  EXPECT_THAT(std::string(past.message()), HasSubstr("job \"j\" epoch 0 rank 1 of 2"));
  EXPECT_THAT(std::string(past.message()), HasSubstr("start_offset = 501"));
  EXPECT_EQ(reader->Next(1).status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status future = reader->StartEpoch(5);
  EXPECT_EQ(future.code(), absl::StatusCode::kFailedPrecondition) << future;
  EXPECT_THAT(std::string(future.message()), HasSubstr("epoch = 5 of job 'j' is not open"));

  auto other_world = MakeReader(client_, "j", 2, 3, 100);
  ASSERT_NE(other_world, nullptr);
  const absl::Status world = other_world->StartEpoch(0);
  EXPECT_EQ(world.code(), absl::StatusCode::kFailedPrecondition) << world;
  EXPECT_THAT(std::string(world.message()), HasSubstr("world_size = 3 does not match"));
  auto unknown = MakeReader(client_, "nope", 0, 1, 100);
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(unknown->StartEpoch(0).code(), absl::StatusCode::kNotFound);

  // Batch sizes, with an epoch open; a refused call consumes nothing.
  ASSERT_TRUE(reader->StartEpoch(0).ok());
  EXPECT_THAT(std::string(reader->Next(0).status().message()), HasSubstr("n = 0: must be >= 1"));
  EXPECT_THAT(std::string(reader->Next(101).status().message()),
              HasSubstr("n = 101: must be <= queue_capacity = 100"));
  absl::StatusOr<ShardBatch> first = reader->Next(100);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->position, 0u);
  EXPECT_EQ(first->indices.size(), 100u);
  EXPECT_EQ(first->shard_length, 500u);
}

// A trainer checkpoints after some batches, dies, and a new process resumes from the text it
// saved: together they read the shard once, in order.
TEST_F(ShardReaderTest, ASavedPositionContinuesExactlyAfterTheLastBatch) {
  CreateJob(*client_, "j", 20'000, 2);
  absl::StatusOr<std::vector<uint64_t>> shard = client_->ReadShard("j", 0, 1, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  std::vector<uint64_t> read;
  std::string checkpoint;
  {
    auto reader = MakeReader(client_, "j", 1, 2, /*capacity=*/4096, /*chunk=*/512);
    ASSERT_TRUE(reader->StartEpoch(0).ok());
    for (int step = 0; step < 5; ++step) {
      absl::StatusOr<ShardBatch> batch = reader->Next(777);
      ASSERT_TRUE(batch.ok()) << batch.status();
      read.insert(read.end(), batch->indices.begin(), batch->indices.end());
    }
    checkpoint = reader->position()->Serialize();
    // Prefetched beyond the checkpoint, then lost with the process.
    ASSERT_TRUE(reader->Next(100).ok());
  }
  EXPECT_THAT(checkpoint, HasSubstr("position=3885"));
  absl::StatusOr<ReaderPosition> saved = ReaderPosition::Parse(checkpoint);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->shard_length, shard->size());  // The reader knew it: the server said it.
  auto reader = MakeReader(client_, "j", 1, 2, 4096, 512);
  ASSERT_TRUE(reader->Resume(*saved).ok());
  EXPECT_EQ(*reader->position(), *saved);
  ASSERT_TRUE(ReadRest(*reader, {1000}, &read).ok());
  EXPECT_EQ(read, *shard);

  // A position of another job, rank or world size is refused and changes nothing.
  ReaderPosition other = *saved;
  other.rank = 0;
  EXPECT_EQ(reader->Resume(other).code(), absl::StatusCode::kInvalidArgument);
  other = *saved;
  other.job = "k";
  EXPECT_THAT(std::string(reader->Resume(other).message()), HasSubstr("position.job = \"k\""));
  other = *saved;
  other.world_size = 4;
  EXPECT_EQ(reader->Resume(other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reader->position()->position, shard->size());
}

// The server shuts down with streams open and comes back on the same port and --data_dir: the
// reader rides through on its client's retries, losing and repeating nothing.
TEST(ShardReaderRestartTest, AServerRestartedOnItsDataDirIsRiddenThrough) {
  testutil::TestDir dir;
  Options options = testutil::LoopbackTestOptions();
  options.data_dir = dir.path();
  options.grace_period = absl::ZeroDuration();  // Cut the open streams.
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  options.port = (*server)->port();
  ClientOptions client_options;
  client_options.max_retries = 12;
  client_options.initial_backoff = absl::Milliseconds(20);
  client_options.max_backoff = absl::Milliseconds(300);
  auto client = Connect((*server)->address(), client_options);
  CreateJob(*client, "j", 300'000, 1);
  absl::StatusOr<std::vector<uint64_t>> shard = client->ReadShard("j", 0, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();

  auto reader = MakeReader(client, "j", 0, 1, /*capacity=*/20'000, /*chunk=*/2000);
  ASSERT_TRUE(reader->StartEpoch(0).ok());
  std::vector<uint64_t> read;
  for (int step = 0; step < 10; ++step) {
    absl::StatusOr<ShardBatch> batch = reader->Next(1500);
    ASSERT_TRUE(batch.ok()) << batch.status();
    read.insert(read.end(), batch->indices.begin(), batch->indices.end());
  }
  (*server)->Shutdown();
  server->reset();
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(400));
    server = Server::Create(options);
  });
  // Blocks once the queue runs dry, until the restarted server streams again.
  const absl::Status rest = ReadRest(*reader, {1500, 64}, &read);
  restart.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(rest.ok()) << rest;
  EXPECT_EQ(read, *shard);
}

// A server that stays down: once the client's retries run out, the next Next that needs an
// index the queue lacks fails, naming job, epoch, rank and position; the indices queued before
// are served first; Resume(position()) then continues on a restarted server.
TEST(ShardReaderRestartTest, AServerThatStaysDownIsAnErrorAtNextThenResumable) {
  testutil::TestDir dir;
  Options options = testutil::LoopbackTestOptions();
  options.data_dir = dir.path();
  options.grace_period = absl::ZeroDuration();
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  options.port = (*server)->port();
  ClientOptions client_options;
  // ~370 ms of retries, several times the channel's longest reconnection backoff (max_backoff):
  // with 4 (~110 ms) the resume after the restart was refused now and then on a loaded machine,
  // its timers firing late while the channel still reported the old connection's failure.
  client_options.max_retries = 10;
  client_options.initial_backoff = absl::Milliseconds(10);
  client_options.max_backoff = absl::Milliseconds(40);
  auto client = Connect((*server)->address(), client_options);
  CreateJob(*client, "j", 100'000, 1);
  absl::StatusOr<std::vector<uint64_t>> shard = client->ReadShard("j", 0, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();

  auto reader = MakeReader(client, "j", 0, 1, /*capacity=*/10'000, /*chunk=*/1000);
  ASSERT_TRUE(reader->StartEpoch(0).ok());
  std::vector<uint64_t> read;
  absl::StatusOr<ShardBatch> first = reader->Next(1000);
  ASSERT_TRUE(first.ok());
  read.assign(first->indices.begin(), first->indices.end());
  (*server)->Shutdown();
  server->reset();
  absl::Status failure;
  while (failure.ok()) {
    absl::StatusOr<ShardBatch> batch = reader->Next(500);
    if (!batch.ok()) {
      failure = batch.status();
      break;
    }
    ASSERT_FALSE(batch->end_of_shard()) << "the whole shard was queued: nothing to fail";
    read.insert(read.end(), batch->indices.begin(), batch->indices.end());
  }
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_THAT(std::string(failure.message()),
              HasSubstr("job \"j\" epoch 0 rank 0 of 1: shard stream failed at position "));
  // Sticky, and nothing consumed by the failed calls.
  const ReaderPosition at = *reader->position();
  EXPECT_EQ(at.position, read.size());
  EXPECT_EQ(reader->Next(1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*reader->position(), at);

  server = Server::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Status resumed = reader->Resume(at);
  ASSERT_TRUE(resumed.ok()) << resumed;
  ASSERT_TRUE(ReadRest(*reader, {4096}, &read).ok());
  EXPECT_EQ(read, *shard);
}

// Opening another epoch while a stream is open (or paused on a full queue) cancels it at once,
// and an epoch that does not open within the client's timeout is DEADLINE_EXCEEDED at StartEpoch.
TEST(ShardReaderCancelTest, StartEpochCancelsTheOpenStreamPromptly) {
  auto server = Server::Create(testutil::LoopbackTestOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions client_options;
  client_options.timeout = absl::Milliseconds(800);
  auto client = Connect((*server)->address(), client_options);
  CreateJob(*client, "j", 1'000'000, 1);
  auto reader = MakeReader(client, "j", 0, 1, /*capacity=*/1000, /*chunk=*/100);
  ASSERT_TRUE(reader->StartEpoch(0).ok());
  ASSERT_TRUE(reader->Next(10).ok());
  absl::Time start = absl::Now();
  const absl::Status next_epoch = reader->StartEpoch(1);  // Not open: epoch 0 was not ended.
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(next_epoch.code(), absl::StatusCode::kDeadlineExceeded) << next_epoch;
  EXPECT_THAT(std::string(next_epoch.message()), HasSubstr("job \"j\" epoch 1 rank 0"));
  EXPECT_LT(waited, absl::Seconds(3));
  ASSERT_TRUE(reader->StartEpoch(0, 500).ok());
  start = absl::Now();
  reader.reset();  // Its stream is paused or open; the destructor must not wait for it.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

// Without a GPU, NextToDevice says why and consumes nothing; with one, the device receives
// exactly the batches Next would have returned.
TEST_F(ShardReaderTest, NextToDeviceDeliversTheBatchesOrSaysWhyNot) {
  CreateJob(*client_, "j", 50'000, 1);
  absl::StatusOr<std::vector<uint64_t>> shard = client_->ReadShard("j", 0, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto reader = MakeReader(client_, "j", 0, 1, /*capacity=*/8192, /*chunk=*/1024);
  ASSERT_TRUE(reader->StartEpoch(0).ok());
  if (absl::Status gpu = GpuAvailable(); !gpu.ok()) {
    int64_t* not_device = nullptr;
    absl::StatusOr<ShardBatch> batch = reader->NextToDevice(100, not_device, nullptr);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(batch.status().message(), gpu.message());
    EXPECT_EQ(reader->position()->position, 0u);
    absl::StatusOr<ShardBatch> host = reader->Next(100);
    ASSERT_TRUE(host.ok());
    EXPECT_EQ(host->position, 0u);
    EXPECT_EQ(host->indices[0], (*shard)[0]);
    GTEST_SKIP() << "device delivery not run: " << gpu.message();
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t batch_size = 3000;
  int64_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), shard->size() * sizeof(int64_t)),
            cudaSuccess);
  // Each batch lands in its own slice of one device array; no synchronisation until the end.
  for (;;) {
    const uint64_t at = reader->position()->position;
    absl::StatusOr<ShardBatch> batch = reader->NextToDevice(batch_size, device + at, stream);
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->end_of_shard()) break;
    EXPECT_EQ(batch->position, at);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int64_t> back(shard->size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, back.size() * sizeof(int64_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::vector<uint64_t>(back.begin(), back.end()), *shard);
  cudaFree(device);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace samplerd
