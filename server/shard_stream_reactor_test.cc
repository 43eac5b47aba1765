// StreamShard's reactor through a real gRPC server (server/testing/service_server.h): chunk
// sizes, resuming at an offset, a client that goes away mid-shard, the stream buffer budget held
// by a reader that stopped reading, a call waiting for its epoch's plan without a thread, and
// the irreducible losses streamed beside the indices (with_irreducible_losses).
#include "server/shard_stream_reactor.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "proto/retry_signal.h"
#include "server/job_registry.h"
#include "server/sampler_service.h"
#include "server/shard_chunks.h"
#include "server/testing/service_server.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// Waits up to 20 s for `done`.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class ShardStreamReactorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // "j": 1000 samples, 2 ranks (shards of 500). "big": 2^16 samples, 1 rank.
    ASSERT_TRUE(registry_.Create("j", Spec(1000, 2)).ok());
    ASSERT_TRUE(registry_.Create("big", Spec(1 << 16, 1)).ok());
  }
  static v1::JobSpec Spec(uint64_t n, uint32_t world) {
    v1::JobSpec spec;
    spec.set_num_samples(n);
    spec.set_world_size(world);
    return spec;
  }
  static v1::StreamShardRequest Request(uint32_t chunk, const std::string& job = "j",
                                        uint32_t rank = 1, uint32_t world = 2) {
    v1::StreamShardRequest r;
    r.set_job(job);
    r.set_rank(rank);
    r.set_world_size(world);
    r.set_max_chunk_size(chunk);
    return r;
  }
  // Reads a whole stream; its status in `status`, its samplerd-retry-after-ms trailer (empty
  // if none) in `retry_after`.
  static std::vector<v1::ShardChunk> ReadAll(v1::Sampler::Stub& stub,
                                             const v1::StreamShardRequest& request,
                                             grpc::Status* status,
                                             std::string* retry_after = nullptr) {
    auto context = testutil::ServiceServer::Context();
    auto reader = stub.StreamShard(context.get(), request);
    std::vector<v1::ShardChunk> chunks;
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) chunks.push_back(chunk);
    *status = reader->Finish();
    if (retry_after != nullptr) {
      const auto& trailers = context->GetServerTrailingMetadata();
      auto it = trailers.find(kRetryAfterMsKey);
      *retry_after = it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
    }
    return chunks;
  }
  static std::vector<uint32_t> Indices(const std::vector<v1::ShardChunk>& chunks) {
    std::vector<uint32_t> out;
    for (const auto& c : chunks) out.insert(out.end(), c.indices32().begin(), c.indices32().end());
    return out;
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  SamplerService service_{&registry_, backend_.get()};
  testutil::ServiceServer server_{&service_};
};

TEST_F(ShardStreamReactorTest, ChunksCoverTheShardInOrderAndTheLastSaysSo) {
  grpc::Status s;
  std::vector<v1::ShardChunk> chunks = ReadAll(server_.stub(), Request(64), &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(chunks.size(), 8u);  // 500 indices in chunks of 64.
  uint64_t offset = 0;
  for (const v1::ShardChunk& c : chunks) {
    EXPECT_EQ(c.offset(), offset);
    EXPECT_LE(c.indices32_size(), 64);
    EXPECT_EQ(c.indices64_size(), 0);  // N <= 2^32: packed 32-bit indices.
    EXPECT_EQ(c.shard_length(), 500u);
    EXPECT_EQ(c.last(), offset + c.indices32_size() == 500);
    offset += c.indices32_size();
  }
  EXPECT_EQ(offset, 500u);
  EXPECT_EQ((*registry_.Get("j"))->Status().ranks(1).indices_streamed(), 500u);
}

TEST_F(ShardStreamReactorTest, AClientThatGoesAwayStopsTheStream) {
  // 65,536 chunks of one index: the server is far from done when the client goes away.
  auto context = testutil::ServiceServer::Context();
  auto reader = server_.stub().StreamShard(context.get(), Request(1, "big", 0, 1));
  v1::ShardChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ASSERT_TRUE(reader->Read(&chunk));
  context->TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server's call ends: its budget back, the progress it recorded short of the shard.
  ASSERT_TRUE(Eventually([&] { return service_.CallsInFlight() == 0; }));
  EXPECT_EQ(service_.StreamBufferBytesInUse(), 0u);
  const uint64_t streamed = (*registry_.Get("big"))->Status().ranks(0).indices_streamed();
  EXPECT_GE(streamed, 2u);
  EXPECT_LT(streamed, uint64_t{1} << 16);
}

TEST_F(ShardStreamReactorTest, StalledStreamsHoldTheBufferBudgetAndTheNextOneIsRefused) {
  // Room for one stream of 64-index chunks (16 bytes an index) and not two.
  const uint64_t one = ShardChunkBytes(64, false, 0);
  ASSERT_EQ(one, 64u * 16);
  SamplerService service(&registry_, backend_.get(), 64 << 20, one + one / 2);
  testutil::ServiceServer server(&service);
  // A reader that stops after one chunk of a 2^16-index shard: gRPC's flow control stalls the
  // server's writes, and the call holds its bytes.
  auto stalled_context = testutil::ServiceServer::Context();
  auto stalled = server.stub().StreamShard(stalled_context.get(), Request(64, "big", 0, 1));
  v1::ShardChunk chunk;
  ASSERT_TRUE(stalled->Read(&chunk));
  EXPECT_EQ(service.StreamBufferBytesInUse(), one);
  grpc::Status second;
  std::string retry_after;
  EXPECT_TRUE(ReadAll(server.stub(), Request(64), &second, &retry_after).empty());
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The machine-readable signal the clients retry by (issue 33): it fits once others end.
  EXPECT_EQ(retry_after, absl::StrCat(absl::ToInt64Milliseconds(kStreamBudgetRetryAfter)));
  EXPECT_THAT(second.error_message(), HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_THAT(second.error_message(), HasSubstr(absl::StrCat("needs ", one, " bytes")));
  // A smaller chunk still fits beside the stalled stream.
  grpc::Status small;
  EXPECT_EQ(Indices(ReadAll(server.stub(), Request(16), &small, &retry_after)).size(), 500u);
  EXPECT_TRUE(small.ok()) << small.error_message();
  EXPECT_EQ(retry_after, "");
  EXPECT_EQ(service.StreamBufferBytesInUse(), one);
  // The stalled stream's reader goes away: its bytes come back, and the refused one now fits.
  stalled_context->TryCancel();
  EXPECT_FALSE(stalled->Finish().ok());
  ASSERT_TRUE(Eventually([&] { return service.CallsInFlight() == 0; }));
  EXPECT_EQ(service.StreamBufferBytesInUse(), 0u);
  grpc::Status again;
  EXPECT_EQ(Indices(ReadAll(server.stub(), Request(64), &again)).size(), 500u);
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST_F(ShardStreamReactorTest, ChunksAreCutToFitTheMessageLimit) {
  // A 4 KiB message limit: 4-byte indices plus 4-byte importance weights, at most 496 a chunk,
  // whatever max_chunk_size asks for.
  SamplerService small(&registry_, backend_.get(), 4096);
  testutil::ServiceServer server(&small);
  v1::StreamShardRequest request = Request(0);
  request.set_with_is_weights(true);
  grpc::Status s;
  std::vector<v1::ShardChunk> chunks = ReadAll(server.stub(), request, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  uint64_t total = 0;
  for (const v1::ShardChunk& c : chunks) {
    EXPECT_LE(c.ByteSizeLong(), 4096u);
    EXPECT_EQ(c.is_weights_size(), c.indices32_size());
    total += c.indices32_size();
  }
  EXPECT_EQ(chunks.size(), 2u);
  EXPECT_EQ(total, 500u);
}

TEST_F(ShardStreamReactorTest, ResumingAtEveryOffsetGivesExactlyTheRemainder) {
  grpc::Status s;
  const std::vector<uint32_t> shard = Indices(ReadAll(server_.stub(), Request(7), &s));
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(shard.size(), 500u);
  for (uint64_t start : {0, 1, 6, 7, 250, 499, 500}) {
    v1::StreamShardRequest request = Request(7);
    request.set_start_offset(start);
    std::vector<v1::ShardChunk> chunks = ReadAll(server_.stub(), request, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(Indices(chunks), std::vector<uint32_t>(shard.begin() + start, shard.end())) << start;
    ASSERT_FALSE(chunks.empty());  // Even an empty remainder says `last`.
    EXPECT_TRUE(chunks.back().last());
    EXPECT_EQ(chunks.front().offset(), start);
  }
}

TEST_F(ShardStreamReactorTest, AStreamWaitsWithoutAThreadForItsEpochsPlan) {
  // Epoch 1 is planned once both ranks ended epoch 0: the stream waits, counted as waiting.
  auto context = testutil::ServiceServer::Context();
  v1::StreamShardRequest request = Request(64);
  request.set_epoch(1);
  auto reader = server_.stub().StreamShard(context.get(), request);
  ASSERT_TRUE(Eventually([&] { return service_.CallsWaiting(kStreamShard) == 1; }));
  std::shared_ptr<Job> job = *registry_.Get("j");
  ASSERT_TRUE(job->EndEpoch(0, 0, 0).ok());
  ASSERT_TRUE(job->EndEpoch(0, 0, 1).ok());
  std::vector<v1::ShardChunk> chunks;
  v1::ShardChunk chunk;
  while (reader->Read(&chunk)) chunks.push_back(chunk);
  grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Indices(chunks).size(), 500u);
  EXPECT_EQ(chunks.front().epoch(), 1u);
  EXPECT_EQ(service_.CallsWaiting(kStreamShard), 0);
}

TEST_F(ShardStreamReactorTest, AWaitingStreamEndsAtItsDeadlineNamingWhatTheEpochWaitsFor) {
  auto context = testutil::ServiceServer::Context(absl::Milliseconds(300));
  v1::StreamShardRequest request = Request(64);
  request.set_epoch(1);
  auto reader = server_.stub().StreamShard(context.get(), request);
  v1::ShardChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(Eventually([&] { return service_.CallsInFlight() == 0; }));
  EXPECT_EQ(service_.CallsWaiting(kStreamShard), 0);
}

TEST_F(ShardStreamReactorTest, AWaitingStreamWhoseClientWentAwayWithdrawsItsWait) {
  auto context = testutil::ServiceServer::Context();
  v1::StreamShardRequest request = Request(64);
  request.set_epoch(1);
  auto reader = server_.stub().StreamShard(context.get(), request);
  ASSERT_TRUE(Eventually([&] { return service_.CallsWaiting(kStreamShard) == 1; }));
  context->TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(Eventually([&] { return service_.CallsInFlight() == 0; }));
  EXPECT_EQ(service_.CallsWaiting(kStreamShard), 0);
}

TEST_F(ShardStreamReactorTest, AReaderOfAClaimedRankNeedsTheClaim) {
  // The rule is the job's (Job::AcquireShard checks the claim); an observer is not concerned.
  std::shared_ptr<Job> job = *registry_.Get("j");
  absl::StatusOr<uint64_t> incarnation = job->ClaimRank(1, 2, false, [](const absl::Status&) {});
  ASSERT_TRUE(incarnation.ok()) << incarnation.status();
  grpc::Status s;
  EXPECT_TRUE(ReadAll(server_.stub(), Request(64), &s).empty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  v1::StreamShardRequest claimed = Request(64);
  claimed.set_incarnation(*incarnation);
  EXPECT_EQ(Indices(ReadAll(server_.stub(), claimed, &s)).size(), 500u);
  EXPECT_TRUE(s.ok()) << s.error_message();
  v1::StreamShardRequest observer = Request(64);
  observer.set_observe(true);
  EXPECT_EQ(Indices(ReadAll(server_.stub(), observer, &s)).size(), 500u);
  EXPECT_TRUE(s.ok()) << s.error_message();
  job->claims().Release(1, *incarnation);
  EXPECT_EQ(ReadAll(server_.stub(), claimed, &s).size(), 0u);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
}

// A REDUCIBLE_LOSS job of 1000 samples and 2 ranks, mix = 1 (uniform draws), with irreducible
// losses that differ per index in every bit pattern class (zero, subnormal, large).
class IrreducibleStreamTest : public ShardStreamReactorTest {
 protected:
  void SetUp() override {
    ShardStreamReactorTest::SetUp();
    v1::JobSpec spec = Spec(1000, 2);
    spec.mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
    spec.mutable_policy()->set_mix(1.0);
    ASSERT_TRUE(registry_.Create("rho", spec).ok());
    for (int i = 0; i < 1000; ++i) {
      uploaded_.push_back(i == 0 ? 0.0f : i == 1 ? 1e-40f : 0.001f * i + 1.0f / (i + 3));
    }
    ASSERT_TRUE((*registry_.Get("rho"))->UploadIrreducibleLosses(uploaded_).ok());
  }
  // Each streamed index with its irreducible loss, bit for bit what was uploaded for it.
  void ExpectUploaded(const std::vector<v1::ShardChunk>& chunks) {
    for (const v1::ShardChunk& c : chunks) {
      ASSERT_EQ(c.irreducible_losses_size(), c.indices32_size()) << "offset " << c.offset();
      for (int k = 0; k < c.indices32_size(); ++k) {
        EXPECT_EQ(absl::bit_cast<uint32_t>(c.irreducible_losses(k)),
                  absl::bit_cast<uint32_t>(uploaded_[c.indices32(k)]))
            << "index " << c.indices32(k) << " at shard position " << c.offset() + k;
      }
    }
  }
  std::vector<float> uploaded_;
};

TEST_F(IrreducibleStreamTest, EachIndexCarriesItsUploadedIrreducibleLossAcrossChunks) {
  for (uint32_t rank : {0u, 1u}) {
    v1::StreamShardRequest request = Request(37, "rho", rank);
    request.set_with_irreducible_losses(true);
    grpc::Status s;
    std::vector<v1::ShardChunk> chunks = ReadAll(server_.stub(), request, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(chunks.size(), 14u);  // 500 in chunks of 37.
    EXPECT_EQ(Indices(chunks).size(), 500u);
    ExpectUploaded(chunks);
    // The same indices as without them, and no importance weights unless asked for.
    request.set_with_irreducible_losses(false);
    std::vector<v1::ShardChunk> plain = ReadAll(server_.stub(), request, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(Indices(plain), Indices(chunks));
    for (const v1::ShardChunk& c : chunks) EXPECT_EQ(c.is_weights_size(), 0);
    for (const v1::ShardChunk& c : plain) EXPECT_EQ(c.irreducible_losses_size(), 0);
  }
}

TEST_F(IrreducibleStreamTest, AResumedStreamCarriesTheRemaindersLosses) {
  v1::StreamShardRequest request = Request(64, "rho");
  request.set_with_irreducible_losses(true);
  grpc::Status s;
  const std::vector<uint32_t> shard = Indices(ReadAll(server_.stub(), request, &s));
  ASSERT_EQ(shard.size(), 500u);
  for (uint64_t start : {1, 63, 64, 250, 499}) {
    request.set_start_offset(start);
    std::vector<v1::ShardChunk> chunks = ReadAll(server_.stub(), request, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(Indices(chunks), std::vector<uint32_t>(shard.begin() + start, shard.end()));
    ExpectUploaded(chunks);
  }
}

TEST_F(IrreducibleStreamTest, WithImportanceWeightsTooChunksStillFitTheMessageLimit) {
  // 4 KiB: 4-byte indices and two 4-byte floats each, at most 330 a chunk.
  SamplerService small(&registry_, backend_.get(), 4096);
  testutil::ServiceServer server(&small);
  v1::StreamShardRequest request = Request(0, "rho");
  request.set_with_is_weights(true);
  request.set_with_irreducible_losses(true);
  grpc::Status s;
  std::vector<v1::ShardChunk> chunks = ReadAll(server.stub(), request, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(chunks.size(), 2u);
  for (const v1::ShardChunk& c : chunks) {
    EXPECT_LE(c.ByteSizeLong(), 4096u);
    EXPECT_EQ(c.is_weights_size(), c.indices32_size());
    for (float w : c.is_weights()) EXPECT_EQ(w, 1.0f);  // mix = 1: uniform weights.
  }
  ExpectUploaded(chunks);
  EXPECT_EQ(ShardChunkBytes(64, false, 2), 64u * (8 + 2 * 12));
}

TEST_F(IrreducibleStreamTest, AJobWithoutIrreducibleLossesRefusesThemNamingJobAndField) {
  v1::StreamShardRequest request = Request(64);  // "j": loss policy NONE.
  request.set_with_irreducible_losses(true);
  grpc::Status s;
  EXPECT_TRUE(ReadAll(server_.stub(), request, &s).empty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("job 'j'"));
  EXPECT_THAT(s.error_message(), HasSubstr("with_irreducible_losses"));
  EXPECT_THAT(s.error_message(), HasSubstr("REDUCIBLE_LOSS"));
  // Nothing was streamed, nothing held.
  EXPECT_EQ((*registry_.Get("j"))->Status().ranks(1).indices_streamed(), 0u);
  EXPECT_EQ(service_.StreamBufferBytesInUse(), 0u);
}

}  // namespace
}  // namespace samplerd
