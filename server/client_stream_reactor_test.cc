// The client-streaming methods' reactor (ReportLosses, UploadWeights) through a real gRPC server
// (server/testing/service_server.h): a batch stream with a bad batch in the middle, the summary's
// counts, a batch of a rank claimed by another process, and an upload that fails applies nothing.
// (A message that does not parse mid-stream: tests/unparseable_request_test.cc.)
#include "server/client_stream_reactor.h"

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/client_streams.h"
#include "server/job_registry.h"
#include "server/sampler_service.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"
#include "server/testing/service_server.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

class ClientStreamReactorTest : public ::testing::Test {
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
    const std::vector<uint64_t> shard = testutil::ShardOf(**registry_.Get("j"), *backend_, 0, 0);
    return testutil::MessageOf(
        "j", testutil::BatchAt(0, 0, seq, shard, {position}, [](uint64_t) { return 0.5f; }));
  }
  // Sends `batches` in one ReportLosses call.
  grpc::Status Report(const std::vector<v1::LossBatch>& batches, v1::LossReportSummary* summary) {
    auto context = testutil::ServiceServer::Context();
    auto writer = server_.stub().ReportLosses(context.get(), summary);
    for (const v1::LossBatch& b : batches) {
      if (!writer->Write(b)) break;  // The server ended the call; Finish says how.
    }
    writer->WritesDone();
    return writer->Finish();
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  JobRegistry registry_{JobRegistry::Limits(), backend_.get()};
  SamplerService service_{&registry_, backend_.get()};
  testutil::ServiceServer server_{&service_};
};

TEST_F(ClientStreamReactorTest, ABadBatchFailsTheStreamAfterTheGoodOnesWereApplied) {
  v1::LossBatch good = LossAt(1, 3), bad = LossAt(2, 4);
  bad.set_indices(0, 5000);
  v1::LossReportSummary summary;
  grpc::Status s = Report({good, bad}, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("batch seq = 2"));
  EXPECT_THAT(s.error_message(), HasSubstr("indices[0] = 5000"));
  EXPECT_THAT(s.error_message(), HasSubstr("earlier batches of this stream were applied"));
  EXPECT_EQ((*registry_.Get("j"))->Status().samples_seen(), 1u);
}

TEST_F(ClientStreamReactorTest, SummaryCountsEveryBatchIncludingDuplicates) {
  const v1::LossBatch batch = LossAt(1, 3);
  v1::LossReportSummary summary;
  grpc::Status s = Report({batch, batch, batch}, &summary);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.batches(), 3u);
  EXPECT_EQ(summary.accepted(), 1u);
  EXPECT_EQ(summary.duplicates(), 2u);
}

TEST_F(ClientStreamReactorTest, ABatchOfARankClaimedByAnotherProcessIsRefused) {
  // The rule is the job's (Job::ReportLosses checks the claim): nothing of the batch applied.
  v1::LossBatch batch = LossAt(1, 3);
  std::shared_ptr<Job> job = *registry_.Get("j");
  absl::StatusOr<uint64_t> incarnation = job->ClaimRank(0, 2, false, [](const absl::Status&) {});
  ASSERT_TRUE(incarnation.ok()) << incarnation.status();
  v1::LossReportSummary summary;
  grpc::Status s = Report({batch}, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("batch seq = 1 of rank 0"));
  EXPECT_EQ(job->Status().samples_seen(), 0u);
  batch.set_incarnation(*incarnation);
  s = Report({batch}, &summary);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.accepted(), 1u);
  job->claims().Release(0, *incarnation);
}

TEST_F(ClientStreamReactorTest, AnUploadAppliesNothingUnlessAllOfItArrivesInOrder) {
  auto upload = [&](const std::vector<v1::UploadWeightsChunk>& chunks) {
    auto context = testutil::ServiceServer::Context();
    v1::UploadSummary summary;
    auto writer = server_.stub().UploadWeights(context.get(), &summary);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    return std::make_pair(s, summary.received());
  };
  v1::UploadWeightsChunk first, gap;
  first.set_job("static");
  for (int i = 0; i < 600; ++i) first.add_weights(1.0f);
  gap = first;
  gap.set_offset(700);  // Not contiguous.
  auto [refused, none] = upload({first, gap});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("offset = 700"));
  EXPECT_FALSE((*registry_.Get("static"))->Describe().plan_ready());
  v1::UploadWeightsChunk rest = first;
  rest.set_offset(600);
  rest.mutable_weights()->Truncate(400);
  auto [ok, received] = upload({first, rest});
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(received, 1000u);
  EXPECT_TRUE((*registry_.Get("static"))->Describe().plan_ready());
}

}  // namespace
}  // namespace samplerd
