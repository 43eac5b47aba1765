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

#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/shard.h"
#include "server/auth/authorizer.h"
#include "server/auth/token_table.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/raw_request.h"
#include "server/service_metrics.h"

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
  void SetUp() override {
    v1::JobSpec spec;
    spec.set_num_samples(1000);
    spec.set_world_size(2);
    spec.mutable_policy()->set_loss(v1::LOSS);
    ASSERT_TRUE(registry_.Create("j", spec).ok());
    spec.mutable_policy()->set_base(v1::STATIC);
    ASSERT_TRUE(registry_.Create("static", spec).ok());
  }
  // A loss for rank 0's shard position `position` of epoch 0 (the index served there).
  v1::LossBatch LossAt(uint64_t seq, uint64_t position) {
    auto lease = (*registry_.Get("j"))->AcquireShard(0, 0, 0, 2);
    EXPECT_TRUE(lease.ok()) << lease.status();
    v1::LossBatch batch;
    batch.set_job("j");
    batch.set_seq(seq);
    batch.add_indices((*lease->view.plan)[ShardToPlanPosition(1000, lease->shard, 0, position)]);
    batch.add_losses(0.5f);
    batch.add_positions(position);
    return batch;
  }
  uint64_t SamplesSeen(const std::string& job) {
    return (*registry_.Get(job))->Status().samples_seen();
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  ServiceMetrics metrics_{nullptr};
};

TEST_F(ClientStreamsTest, ALossStreamAppliesEachBatchAsItArrivesAndNamesTheOneThatFails) {
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
  auto grant = std::make_shared<TokenGrant>();
  grant->jobs.insert("static");
  v1::LossReportSummary summary;
  LossStream stream(&registry_, &metrics_, Caller(grant), &summary);
  std::optional<grpc::Status> ended = stream.Add(Raw(LossAt(1, 3)));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::PERMISSION_DENIED) << ended->error_message();
  EXPECT_EQ(SamplesSeen("j"), 0u);
}

TEST_F(ClientStreamsTest, AnUploadAppliesNothingUnlessAllOfItArrivesInOrder) {
  v1::UploadWeightsChunk first;
  first.set_job("static");
  for (int i = 0; i < 600; ++i) first.add_weights(1.0f);
  {
    v1::UploadSummary summary;
    WeightsUpload upload = MakeWeightsUpload(&registry_, Caller::Unrestricted(), &summary);
    EXPECT_EQ(upload.Add(Raw(first)), std::nullopt);
    v1::UploadWeightsChunk gap = first;
    gap.set_offset(700);
    std::optional<grpc::Status> ended = upload.Add(Raw(gap));
    ASSERT_TRUE(ended.has_value());
    EXPECT_EQ(ended->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(ended->error_message(), HasSubstr("offset = 700"));
    EXPECT_THAT(ended->error_message(), HasSubstr("expected 600"));
  }
  EXPECT_FALSE((*registry_.Get("static"))->Describe().plan_ready());
  {
    v1::UploadSummary summary;
    WeightsUpload upload = MakeWeightsUpload(&registry_, Caller::Unrestricted(), &summary);
    EXPECT_EQ(upload.Add(Raw(first)), std::nullopt);
    v1::UploadWeightsChunk too_many = first;
    too_many.set_offset(600);
    std::optional<grpc::Status> ended = upload.Add(Raw(too_many));
    ASSERT_TRUE(ended.has_value());
    EXPECT_THAT(ended->error_message(), HasSubstr("weights: 1200 values for num_samples 1000"));
  }
  {
    v1::UploadSummary summary;
    WeightsUpload upload = MakeWeightsUpload(&registry_, Caller::Unrestricted(), &summary);
    EXPECT_THAT(upload.End().error_message(), HasSubstr("weights: empty upload stream"));
  }
  EXPECT_FALSE((*registry_.Get("static"))->Describe().plan_ready());
  v1::UploadSummary summary;
  WeightsUpload upload = MakeWeightsUpload(&registry_, Caller::Unrestricted(), &summary);
  v1::UploadWeightsChunk rest = first;
  rest.set_offset(600);
  rest.mutable_weights()->Truncate(400);
  EXPECT_EQ(upload.Add(Raw(first)), std::nullopt);
  EXPECT_EQ(upload.Add(Raw(rest)), std::nullopt);
  const grpc::Status done = upload.End();
  ASSERT_TRUE(done.ok()) << done.error_message();
  EXPECT_EQ(summary.received(), 1000u);
  EXPECT_TRUE((*registry_.Get("static"))->Describe().plan_ready());
}

}  // namespace
}  // namespace samplerd
