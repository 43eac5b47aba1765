// ShardChunks on its own, free of gRPC's call objects: the chunks of one StreamShard call over a
// real job and the CPU backend -- the shard covered in order, chunks cut to the message limit,
// the stream budget reserved for the call's life, a start offset past the shard, the progress
// recorded as each chunk is written. (Through the reactor and a real gRPC server:
// shard_stream_reactor_test.cc.)
#include "server/shard_chunks.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/service_metrics.h"
#include "server/stream_budget.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

class ShardChunksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 1000 samples, 2 ranks: shards of 500.
    v1::JobSpec spec;
    spec.set_num_samples(1000);
    spec.set_world_size(2);
    ASSERT_TRUE(registry_.Create("j", spec).ok());
    job_ = *registry_.Get("j");
  }
  static v1::StreamShardRequest Request(uint32_t max_chunk, uint64_t start = 0) {
    v1::StreamShardRequest r;
    r.set_job("j");
    r.set_rank(1);
    r.set_world_size(2);
    r.set_max_chunk_size(max_chunk);
    r.set_start_offset(start);
    return r;
  }
  // ShardChunks::Start of rank 1's shard of epoch 0, reserving from `budget`.
  absl::StatusOr<std::unique_ptr<ShardChunks>> Start(const v1::StreamShardRequest& request,
                                                     StreamBudget* budget,
                                                     int max_message_bytes = 64 << 20) {
    absl::StatusOr<ShardLease> lease = job_->AcquireShard(0, 0, request.rank(), 2);
    if (!lease.ok()) return lease.status();
    return ShardChunks::Start(request, job_, *std::move(lease), max_message_bytes, budget,
                              &metrics_);
  }
  // Every chunk, each one Written() after it is made; their indices appended to `indices`.
  static std::vector<v1::ShardChunk> All(ComputeBackend* backend, ShardChunks& chunks,
                                         std::vector<uint32_t>* indices) {
    std::vector<v1::ShardChunk> out;
    do {
      v1::ShardChunk chunk;
      EXPECT_TRUE(chunks.Next(backend, &chunk).ok());
      EXPECT_TRUE(chunks.Written().ok());
      indices->insert(indices->end(), chunk.indices32().begin(), chunk.indices32().end());
      out.push_back(std::move(chunk));
    } while (!chunks.done());
    return out;
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  std::shared_ptr<Job> job_;
  StreamBudget budget_{1 << 20};
  ServiceMetrics metrics_{nullptr};
};

TEST_F(ShardChunksTest, ChunksCoverTheShardInOrderAndWrittenRecordsTheProgress) {
  absl::StatusOr<std::unique_ptr<ShardChunks>> chunks = Start(Request(64), &budget_);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(budget_.in_use(), ShardChunkBytes(64, false, false));  // The largest chunk's bytes.
  uint64_t offset = 0;
  int made = 0;
  while (!(*chunks)->done()) {
    v1::ShardChunk chunk;
    ASSERT_TRUE((*chunks)->Next(backend_.get(), &chunk).ok());
    EXPECT_EQ(chunk.offset(), offset);
    EXPECT_EQ(chunk.shard_length(), 500u);
    EXPECT_EQ(chunk.last(), offset + chunk.indices32_size() == 500);
    offset += chunk.indices32_size();
    // Recorded only once written.
    EXPECT_EQ(job_->Status().ranks(1).indices_streamed(), offset - chunk.indices32_size());
    ASSERT_TRUE((*chunks)->Written().ok());
    EXPECT_EQ(job_->Status().ranks(1).indices_streamed(), offset);
    ++made;
  }
  EXPECT_EQ(made, 8);  // 500 in chunks of 64.
  EXPECT_EQ(offset, 500u);
  chunks->reset();
  EXPECT_EQ(budget_.in_use(), 0u);  // Given back with the call.
}

TEST_F(ShardChunksTest, AStartOffsetGivesTheRemainderAndOnePastTheShardIsRefused) {
  absl::StatusOr<std::unique_ptr<ShardChunks>> whole = Start(Request(0), &budget_);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<uint32_t> shard;
  All(backend_.get(), **whole, &shard);
  ASSERT_EQ(shard.size(), 500u);
  for (uint64_t start : {1, 250, 499, 500}) {
    absl::StatusOr<std::unique_ptr<ShardChunks>> rest = Start(Request(7, start), &budget_);
    ASSERT_TRUE(rest.ok()) << rest.status();
    std::vector<uint32_t> remainder;
    const std::vector<v1::ShardChunk> chunks = All(backend_.get(), **rest, &remainder);
    EXPECT_EQ(remainder, std::vector<uint32_t>(shard.begin() + start, shard.end()));
    EXPECT_TRUE(chunks.back().last());  // Even an empty remainder says so.
  }
  absl::StatusOr<std::unique_ptr<ShardChunks>> past = Start(Request(7, 501), &budget_);
  EXPECT_TRUE(absl::IsInvalidArgument(past.status()));
  EXPECT_THAT(past.status().message(),
              HasSubstr("start_offset = 501 is past the shard length 500 of rank 1"));
}

TEST_F(ShardChunksTest, ChunksAreCutToFitTheMessageLimit) {
  // 4-byte indices and 4-byte importance weights (8 bytes an index) in 4 KiB messages.
  v1::StreamShardRequest request = Request(0);
  request.set_with_is_weights(true);
  absl::StatusOr<std::unique_ptr<ShardChunks>> chunks = Start(request, &budget_, 4096);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  std::vector<uint32_t> indices;
  const std::vector<v1::ShardChunk> all = All(backend_.get(), **chunks, &indices);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(indices.size(), 500u);
  // As full as it can be: one more index would not fit beside the header bytes.
  const uint64_t full = all[0].indices32_size();
  EXPECT_LE(full * 8 + kShardChunkHeaderBytes, 4096u);
  EXPECT_GT((full + 1) * 8 + kShardChunkHeaderBytes, 4096u);
  for (const v1::ShardChunk& c : all) {
    EXPECT_LE(c.ByteSizeLong(), 4096u);
    ASSERT_EQ(c.is_weights_size(), c.indices32_size());
    for (float w : c.is_weights()) EXPECT_EQ(w, 1.0f);  // A uniform job: every weight 1.
  }
}

TEST_F(ShardChunksTest, TheBudgetRefusesACallThatDoesNotFitUntilAnotherEnds) {
  const uint64_t one = ShardChunkBytes(64, false, false);
  ASSERT_EQ(one, 64u * 16);  // 8 extracted + 4 in the message + 4 in gRPC's copy, per index.
  StreamBudget budget(one + one / 2);
  absl::StatusOr<std::unique_ptr<ShardChunks>> first = Start(Request(64), &budget);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<ShardChunks>> second = Start(Request(64), &budget);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("--max_stream_buffer_bytes"));
  first->reset();
  EXPECT_TRUE(Start(Request(64), &budget).ok());
}

TEST(CheckStreamShardRequestTest, AChunkSizeOverTheMaximumIsRefusedNamingIt) {
  v1::StreamShardRequest request;
  request.set_max_chunk_size(v1::MAX_SHARD_CHUNK_SIZE);
  EXPECT_TRUE(CheckStreamShardRequest(request).ok());
  request.set_max_chunk_size(v1::MAX_SHARD_CHUNK_SIZE + 1);
  const absl::Status s = CheckStreamShardRequest(request);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("max_chunk_size = ",
                                                  v1::MAX_SHARD_CHUNK_SIZE + 1, ": must be <= ")));
}

}  // namespace
}  // namespace samplerd
