// The client-streaming methods' Streams on their own, fed raw messages as the reactor feeds
// them (no gRPC call): LossStream applies each batch as it arrives and names the one that fails,
// an unparseable message ends it naming its position, a job the caller's token does not grant is
// PERMISSION_DENIED; an UploadStream applies nothing unless all of it arrived in order. (Through
// the reactor and a real gRPC server: client_stream_reactor_test.cc.)
#include "server/client_streams.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/auth/authorizer.h"
#include "server/auth/token_table.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/raw_request.h"
#include "server/service_metrics.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Raw(const google::protobuf::Message& message) {
  grpc::ByteBuffer raw;
  EXPECT_TRUE(SerializeResponse(message, &raw).ok());
  return raw;
}

class ClientStreamsTest : public ::testing::Test {
 protected:
  // A job of 1000 samples on 2 ranks with the loss policy; with `upload`, over base weights that
  // are uploaded (no plan before they are).
  void Create(const std::string& name, bool upload) {
    v1::JobSpec spec;
    spec.set_num_samples(1000);
    spec.set_world_size(2);
    spec.mutable_policy()->set_loss(v1::LOSS);
    if (upload) spec.mutable_policy()->set_base(v1::STATIC);
    ASSERT_TRUE(registry_.Create(name, spec).ok());
  }
  // A batch of one loss of job "j": rank 0's shard position `position` of epoch 0.
  v1::LossBatch LossAt(uint64_t seq, uint64_t position) {
    const std::vector<uint64_t> shard = testutil::ShardOf(**registry_.Get("j"), *backend_, 0, 0);
    return testutil::MessageOf(
        "j", testutil::BatchAt(0, 0, seq, shard, {position}, [](uint64_t) { return 0.5f; }));
  }
  uint64_t SamplesSeen(const std::string& job) {
    return (*registry_.Get(job))->Status().samples_seen();
  }
  bool PlanReady(const std::string& job) { return (*registry_.Get(job))->Describe().plan_ready(); }
  // An UploadWeights stream of `chunks`: the status a message ended it with, else End's.
  grpc::Status Upload(const std::vector<v1::UploadWeightsChunk>& chunks,
                      v1::UploadSummary* summary) {
    WeightsUpload upload = MakeWeightsUpload(&registry_, Caller::Unrestricted(), summary);
    for (const v1::UploadWeightsChunk& chunk : chunks) {
      if (std::optional<grpc::Status> ended = upload.Add(Raw(chunk))) return *ended;
    }
    return upload.End();
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  ServiceMetrics metrics_{nullptr};
};

TEST_F(ClientStreamsTest, ALossStreamAppliesEachBatchAsItArrivesAndNamesTheOneThatFails) {
  Create("j", false);
  v1::LossReportSummary summary;
  LossStream stream(&registry_, &metrics_, Caller::Unrestricted(), &summary);
  const v1::LossBatch good = LossAt(1, 3);
  EXPECT_EQ(stream.Add(Raw(good)), std::nullopt);
  EXPECT_EQ(stream.Add(Raw(good)), std::nullopt);  // A duplicate: counted, not applied again.
  EXPECT_EQ(SamplesSeen("j"), 1u);
  v1::LossBatch bad = LossAt(2, 4);
  bad.set_indices(0, 5000);
  std::optional<grpc::Status> ended = stream.Add(Raw(bad));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended->error_message(), HasSubstr("batch seq = 2 of rank 0"));
  EXPECT_THAT(ended->error_message(), HasSubstr("indices[0] = 5000"));
  EXPECT_THAT(ended->error_message(), HasSubstr("earlier batches of this stream were applied"));
  EXPECT_EQ(SamplesSeen("j"), 1u);
  EXPECT_EQ(summary.batches(), 2u);
  EXPECT_EQ(summary.accepted(), 1u);
  EXPECT_EQ(summary.duplicates(), 1u);
}

TEST_F(ClientStreamsTest, AnUnparseableMessageEndsTheLossStreamNamingItsPosition) {
  Create("j", false);
  v1::LossReportSummary summary;
  LossStream stream(&registry_, &metrics_, Caller::Unrestricted(), &summary);
  EXPECT_EQ(stream.Add(Raw(LossAt(1, 3))), std::nullopt);
  const std::string garbage = "\xff\xff\xff";
  grpc::Slice slice(garbage);
  std::optional<grpc::Status> ended = stream.Add(grpc::ByteBuffer(&slice, 1));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended->error_message(), HasSubstr("message 2 of the stream"));
  EXPECT_THAT(ended->error_message(), HasSubstr("batches before it applied: 1"));
  EXPECT_EQ(SamplesSeen("j"), 1u);
}

TEST_F(ClientStreamsTest, ABatchOfAJobTheTokenDoesNotGrantIsPermissionDenied) {
  Create("j", false);
  auto grant = std::make_shared<TokenGrant>();
  grant->jobs.insert("another");
  v1::LossReportSummary summary;
  LossStream stream(&registry_, &metrics_, Caller(grant), &summary);
  std::optional<grpc::Status> ended = stream.Add(Raw(LossAt(1, 3)));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::PERMISSION_DENIED) << ended->error_message();
  EXPECT_EQ(SamplesSeen("j"), 0u);
}

TEST_F(ClientStreamsTest, AnUploadAppliesNothingUnlessAllOfItArrivesInOrder) {
  Create("static", true);
  v1::UploadWeightsChunk first;
  first.set_job("static");
  for (int i = 0; i < 600; ++i) first.add_weights(1.0f);
  v1::UploadWeightsChunk gap = first, too_many = first, rest = first;
  gap.set_offset(700);  // Not contiguous.
  too_many.set_offset(600);
  rest.set_offset(600);
  rest.mutable_weights()->Truncate(400);
  v1::UploadSummary summary;
  const grpc::Status refused = Upload({first, gap}, &summary);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("offset = 700"));
  EXPECT_THAT(refused.error_message(), HasSubstr("expected 600"));
  EXPECT_THAT(Upload({first, too_many}, &summary).error_message(),
              HasSubstr("weights: 1200 values for num_samples 1000"));
  EXPECT_THAT(Upload({}, &summary).error_message(), HasSubstr("weights: empty upload stream"));
  EXPECT_FALSE(PlanReady("static"));
  const grpc::Status done = Upload({first, rest}, &summary);
  ASSERT_TRUE(done.ok()) << done.error_message();
  EXPECT_EQ(summary.received(), 1000u);
  EXPECT_TRUE(PlanReady("static"));
}

}  // namespace
}  // namespace samplerd
