// The streaming handlers driven without a network, through fake gRPC streams (as Reverb's
// FakeInsertStream): chunk sizes, a client that goes away mid-shard, a batch stream with a bad
// batch or an unparseable message in the middle, and the stream buffer budget.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/shard.h"
#include "server/job_registry.h"
#include "server/sampler_service.h"
#include "server/testing/fake_raw_reader.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// Records the chunks written; Write fails (the client went away) after `accept` chunks.
class FakeShardWriter : public grpc::ServerWriterInterface<v1::ShardChunk> {
 public:
  explicit FakeShardWriter(size_t accept) : accept_(accept) {}
  void SendInitialMetadata() override {}
  bool Write(const v1::ShardChunk& chunk, grpc::WriteOptions) override {
    if (chunks.size() >= accept_) return false;
    chunks.push_back(chunk);
    return true;
  }
  std::vector<v1::ShardChunk> chunks;

 private:
  const size_t accept_;
};

// Blocks every Write until released: a reader that stopped reading.
class StalledShardWriter : public grpc::ServerWriterInterface<v1::ShardChunk> {
 public:
  void SendInitialMetadata() override {}
  bool Write(const v1::ShardChunk&, grpc::WriteOptions) override {
    writing.Notify();
    release.WaitForNotification();
    return false;  // The client went away meanwhile.
  }
  absl::Notification writing;
  absl::Notification release;
};

std::vector<std::string> Serialized(const std::vector<v1::LossBatch>& batches) {
  std::vector<std::string> out;
  for (const v1::LossBatch& b : batches) out.push_back(b.SerializeAsString());
  return out;
}

class StreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobSpec spec;
    spec.set_num_samples(1000);
    spec.set_world_size(2);
    spec.mutable_policy()->set_loss(v1::LOSS);
    ASSERT_TRUE(registry_.Create("j", spec).ok());
  }
  v1::StreamShardRequest Request(uint32_t chunk) {
    v1::StreamShardRequest r;
    r.set_job("j");
    r.set_rank(1);
    r.set_world_size(2);
    r.set_max_chunk_size(chunk);
    return r;
  }
  // A loss for rank 0's shard position `position` of epoch 0 (the index served there).
  v1::LossBatch LossAt(uint64_t seq, uint64_t position) {
    auto lease = (*registry_.Get("j"))->AcquireShard(0, 0, 0, 2, absl::InfiniteFuture());
    EXPECT_TRUE(lease.ok()) << lease.status();
    v1::LossBatch batch;
    batch.set_job("j");
    batch.set_seq(seq);
    batch.add_indices((*lease->view.plan)[ShardToPlanPosition(1000, lease->shard, 0, position)]);
    batch.add_losses(0.5f);
    batch.add_positions(position);
    return batch;
  }
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  SamplerService service_{&registry_, backend_.get()};
};

TEST_F(StreamsTest, ChunksCoverTheShardInOrderAndTheLastSaysSo) {
  FakeShardWriter writer(1000);
  grpc::Status s = service_.StreamShardImpl(
      Request(64), absl::InfiniteFuture(), [] { return false; }, &writer);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(writer.chunks.size(), 8u);  // 500 indices in chunks of 64.
  uint64_t offset = 0;
  for (const v1::ShardChunk& c : writer.chunks) {
    EXPECT_EQ(c.offset(), offset);
    EXPECT_LE(c.indices32_size(), 64);
    EXPECT_EQ(c.indices64_size(), 0);  // N <= 2^32: packed 32-bit indices.
    EXPECT_EQ(c.shard_length(), 500u);
    EXPECT_EQ(c.last(), offset + c.indices32_size() == 500);
    offset += c.indices32_size();
  }
  EXPECT_EQ(offset, 500u);
}

TEST_F(StreamsTest, AClientThatGoesAwayStopsTheStream) {
  FakeShardWriter writer(2);
  grpc::Status s = service_.StreamShardImpl(
      Request(64), absl::InfiniteFuture(), [] { return false; }, &writer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(writer.chunks.size(), 2u);  // Nothing buffered past the failed write.
  auto job = registry_.Get("j");
  EXPECT_EQ((*job)->Status().ranks(1).indices_streamed(), 128u);
}

TEST_F(StreamsTest, ABadBatchFailsTheStreamAfterTheGoodOnesWereApplied) {
  v1::LossBatch good = LossAt(1, 3), bad = LossAt(2, 4);
  bad.set_indices(0, 5000);
  FakeRawReader reader(Serialized({good, bad}));
  v1::LossReportSummary summary;
  grpc::Status s = service_.ReportLossesImpl(&reader, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("batch seq = 2"));
  EXPECT_THAT(s.error_message(), HasSubstr("indices[0] = 5000"));
  EXPECT_EQ(summary.accepted(), 1u);
  EXPECT_EQ((*registry_.Get("j"))->Status().samples_seen(), 1u);
}

TEST_F(StreamsTest, AnUnparseableMessageFailsTheStreamNamingItsPosition) {
  v1::LossBatch first = LossAt(1, 3), second = LossAt(2, 4);
  // Field 1 as fixed32 with 2 of its 4 bytes: not a LossBatch.
  FakeRawReader reader(
      {first.SerializeAsString(), std::string("\x0d\x01\x02", 3), second.SerializeAsString()});
  v1::LossReportSummary summary;
  grpc::Status s = service_.ReportLossesImpl(&reader, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("message 2 of the stream could not be parsed"));
  EXPECT_THAT(s.error_message(), HasSubstr("batches before it applied: 1"));
  EXPECT_EQ(summary.batches(), 1u);
  // Batch 1 applied, batch 2 never read.
  EXPECT_EQ((*registry_.Get("j"))->Status().samples_seen(), 1u);
}

TEST_F(StreamsTest, SummaryCountsEveryBatchIncludingDuplicates) {
  const v1::LossBatch batch = LossAt(1, 3);
  FakeRawReader reader(Serialized({batch, batch, batch}));
  v1::LossReportSummary summary;
  ASSERT_TRUE(service_.ReportLossesImpl(&reader, &summary).ok());
  EXPECT_EQ(summary.batches(), 3u);
  EXPECT_EQ(summary.accepted(), 1u);
  EXPECT_EQ(summary.duplicates(), 2u);
}

TEST_F(StreamsTest, StalledStreamsHoldTheBufferBudgetAndTheNextOneIsRefused) {
  // Room for one stream of 64-index chunks (16 bytes an index) and not two.
  const uint64_t one = SamplerService::ChunkBytes(64, false, false);
  ASSERT_EQ(one, 64u * 16);
  SamplerService service(&registry_, backend_.get(), 64 << 20, one + one / 2);
  StalledShardWriter stalled;
  grpc::Status first;
  std::thread reader([&] {
    first = service.StreamShardImpl(
        Request(64), absl::InfiniteFuture(), [] { return false; }, &stalled);
  });
  stalled.writing.WaitForNotification();
  EXPECT_EQ(service.StreamBufferBytesInUse(), one);
  FakeShardWriter writer(1000);
  grpc::Status second = service.StreamShardImpl(
      Request(64), absl::InfiniteFuture(), [] { return false; }, &writer);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(), HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_THAT(second.error_message(), HasSubstr(absl::StrCat("needs ", one, " bytes")));
  EXPECT_TRUE(writer.chunks.empty());
  // A smaller chunk still fits beside the stalled stream.
  FakeShardWriter small(1000);
  EXPECT_TRUE(service
                  .StreamShardImpl(
                      Request(16), absl::InfiniteFuture(), [] { return false; }, &small)
                  .ok());
  stalled.release.Notify();
  reader.join();
  EXPECT_EQ(first.error_code(), grpc::StatusCode::UNAVAILABLE);
  // The stalled stream gave its bytes back: the refused one now fits.
  EXPECT_EQ(service.StreamBufferBytesInUse(), 0u);
  FakeShardWriter again(1000);
  EXPECT_TRUE(service
                  .StreamShardImpl(
                      Request(64), absl::InfiniteFuture(), [] { return false; }, &again)
                  .ok());
}

TEST_F(StreamsTest, ChunksAreCutToFitTheMessageLimit) {
  // A 4 KiB message limit: 4-byte indices plus 4-byte importance weights, at most 496 a chunk,
  // whatever max_chunk_size asks for.
  SamplerService small(&registry_, backend_.get(), 4096);
  v1::StreamShardRequest request = Request(0);
  request.set_with_is_weights(true);
  FakeShardWriter writer(1000);
  ASSERT_TRUE(small
                  .StreamShardImpl(
                      request, absl::InfiniteFuture(), [] { return false; }, &writer)
                  .ok());
  uint64_t total = 0;
  for (const v1::ShardChunk& c : writer.chunks) {
    EXPECT_LE(c.ByteSizeLong(), 4096u);
    EXPECT_EQ(c.is_weights_size(), c.indices32_size());
    total += c.indices32_size();
  }
  EXPECT_EQ(writer.chunks.size(), 2u);
  EXPECT_EQ(total, 500u);
}

TEST_F(StreamsTest, ResumingAtEveryOffsetGivesExactlyTheRemainder) {
  FakeShardWriter full(1000);
  ASSERT_TRUE(service_
                  .StreamShardImpl(
                      Request(7), absl::InfiniteFuture(), [] { return false; }, &full)
                  .ok());
  std::vector<uint32_t> shard;
  for (const auto& c : full.chunks)
    shard.insert(shard.end(), c.indices32().begin(), c.indices32().end());
  ASSERT_EQ(shard.size(), 500u);
  for (uint64_t start : {0, 1, 6, 7, 250, 499, 500}) {
    v1::StreamShardRequest request = Request(7);
    request.set_start_offset(start);
    FakeShardWriter writer(1000);
    ASSERT_TRUE(service_
                    .StreamShardImpl(
                        request, absl::InfiniteFuture(), [] { return false; }, &writer)
                    .ok());
    std::vector<uint32_t> rest;
    for (const auto& c : writer.chunks)
      rest.insert(rest.end(), c.indices32().begin(), c.indices32().end());
    EXPECT_EQ(rest, std::vector<uint32_t>(shard.begin() + start, shard.end())) << start;
    ASSERT_FALSE(writer.chunks.empty());  // Even an empty remainder says `last`.
    EXPECT_TRUE(writer.chunks.back().last());
    EXPECT_EQ(writer.chunks.front().offset(), start);
  }
}

}  // namespace
}  // namespace samplerd
