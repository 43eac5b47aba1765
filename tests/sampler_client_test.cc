#include "client/cpp/sampler_client.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

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

TEST(SamplerClientTest, BadOptionsAreRejected) {
  EXPECT_EQ(SamplerClient::Create("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.max_retries = -1;
  auto client = SamplerClient::Create("127.0.0.1:1", options);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("max_retries = -1"));
}

TEST(SamplerClientTest, ACallbackErrorStopsTheStreamAndIsReturned) {
  Options options;
  options.port = 0;
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

}  // namespace
}  // namespace samplerd
