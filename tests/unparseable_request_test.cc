// Requests that are not valid protobuf, sent as raw bytes over a real channel to a real server
// (a generic stub: generated stubs cannot send bad bytes). Each gets INVALID_ARGUMENT with a
// message naming the request type and the reason, and in a client stream the message's position;
// nothing after the bad message is applied (proto/samplerd.proto, "Requests that are not valid
// protobuf").
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// Field 1 as fixed32 (tag 0x0d) with only 2 of its 4 bytes: no message of the API parses it.
const std::string kGarbage("\x0d\x01\x02", 3);

void* Tag(intptr_t i) { return reinterpret_cast<void*>(i); }

// One call of `method` ("/samplerd.v1.Sampler/GetJob") sending `messages` as they are and
// collecting the raw responses. Works for every kind of RPC: on the wire each is a stream of
// request messages and a stream of responses.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::vector<std::string>& messages,
                     std::vector<std::string>* responses = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(Tag(1));
  cq.Next(&tag, &ok);
  for (const std::string& message : messages) {
    if (!ok) break;  // The server ended the call; Finish says how.
    grpc::Slice slice(message);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, Tag(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(Tag(3));
    cq.Next(&tag, &ok);
  }
  for (;;) {
    grpc::ByteBuffer response;
    call->Read(&response, Tag(4));
    if (!cq.Next(&tag, &ok) || !ok) break;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (responses != nullptr) responses->push_back(bytes);
  }
  grpc::Status status;
  call->Finish(&status, Tag(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class UnparseableRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options = testutil::LoopbackTestOptions();
    options.planner_threads = 1;
    options.grace_period = absl::Milliseconds(200);
    options.max_message_bytes = 1 << 16;
    server_ = *Server::Create(options);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Sampler::NewStub(channel_);
    // "j": 100 samples, one rank, loss policy. "st": static weights, not uploaded yet.
    v1::CreateJobRequest create;
    create.set_name("j");
    create.mutable_spec()->set_num_samples(100);
    create.mutable_spec()->set_world_size(1);
    create.mutable_spec()->mutable_policy()->set_loss(v1::LOSS);
    v1::Job job;
    ASSERT_TRUE(
        Unary([&](grpc::ClientContext* c) { return stub_->CreateJob(c, create, &job); }).ok());
    create.set_name("st");
    create.mutable_spec()->mutable_policy()->set_base(v1::STATIC);
    ASSERT_TRUE(
        Unary([&](grpc::ClientContext* c) { return stub_->CreateJob(c, create, &job); }).ok());
  }

  template <typename F>
  grpc::Status Unary(F f) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return f(&context);
  }

  v1::JobStatus Status(const std::string& name) {
    v1::GetJobStatusRequest request;
    request.set_name(name);
    v1::JobStatus status;
    EXPECT_TRUE(Unary([&](grpc::ClientContext* c) {
                  return stub_->GetJobStatus(c, request, &status);
                }).ok());
    return status;
  }

  // A loss for the index served at shard position `position` of "j" (one rank, epoch 0).
  std::string Batch(uint64_t seq, uint64_t position) {
    if (shard_.empty()) {
      v1::StreamShardRequest request;
      request.set_job("j");
      request.set_world_size(1);
      EXPECT_TRUE(Unary([&](grpc::ClientContext* c) {
                    auto reader = stub_->StreamShard(c, request);
                    v1::ShardChunk chunk;
                    while (reader->Read(&chunk)) {
                      shard_.insert(shard_.end(), chunk.indices32().begin(),
                                    chunk.indices32().end());
                    }
                    return reader->Finish();
                  }).ok());
    }
    v1::LossBatch batch;
    batch.set_job("j");
    batch.set_seq(seq);
    batch.add_indices(shard_.at(position));
    batch.add_losses(1.0f);
    batch.add_positions(position);
    return batch.SerializeAsString();
  }

  std::vector<uint64_t> shard_;  // Of "j", read at the first Batch.

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(UnparseableRequestTest, ALossStreamFailsAtTheBadMessageAndAppliesNothingAfterIt) {
  const grpc::Status s =
      RawCall(channel_, "/samplerd.v1.Sampler/ReportLosses", {Batch(1, 1), kGarbage, Batch(2, 2)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("message 2 of the stream could not be parsed as samplerd.v1.LossBatch"));
  EXPECT_THAT(s.error_message(), HasSubstr("batches before it applied: 1"));
  const v1::JobStatus status = Status("j");
  EXPECT_EQ(status.samples_seen(), 1u);  // Batch 1 only.
  ASSERT_EQ(status.ranks_size(), 1);
  EXPECT_EQ(status.ranks(0).losses_accepted(), 1u);
}

TEST_F(UnparseableRequestTest, AGoodLossStreamCountsEveryBatch) {
  std::vector<std::string> responses;
  ASSERT_TRUE(RawCall(channel_, "/samplerd.v1.Sampler/ReportLosses",
                      {Batch(1, 1), Batch(2, 2), Batch(2, 2)}, &responses)
                  .ok());
  ASSERT_EQ(responses.size(), 1u);
  v1::LossReportSummary summary;
  ASSERT_TRUE(summary.ParseFromString(responses[0]));
  EXPECT_EQ(summary.batches(), 3u);
  EXPECT_EQ(summary.accepted(), 2u);
  EXPECT_EQ(summary.duplicates(), 1u);
}

TEST_F(UnparseableRequestTest, AnUploadWithABadChunkFailsAndAppliesNothing) {
  v1::UploadWeightsChunk chunk;
  chunk.set_job("st");
  for (int i = 0; i < 100; ++i) chunk.add_weights(1.0f);
  grpc::Status s = RawCall(channel_, "/samplerd.v1.Sampler/UploadWeights",
                           {chunk.SerializeAsString(), kGarbage});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("message 2 of the stream could not be parsed as "
                                           "samplerd.v1.UploadWeightsChunk"));
  EXPECT_THAT(s.error_message(), HasSubstr("nothing of the upload was applied"));
  EXPECT_FALSE(Status("st").job().plan_ready());  // The complete first chunk was not applied.

  s = RawCall(channel_, "/samplerd.v1.Sampler/UploadLabels", {kGarbage});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("message 1 of the stream could not be parsed as "
                                           "samplerd.v1.UploadLabelsChunk"));
}

TEST_F(UnparseableRequestTest, UnaryAndServerStreamingRequestsNameTheirType) {
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"CreateJob", "samplerd.v1.CreateJobRequest"},
      {"GetJob", "samplerd.v1.GetJobRequest"},
      {"ListJobs", "samplerd.v1.ListJobsRequest"},
      {"DeleteJob", "samplerd.v1.DeleteJobRequest"},
      {"StreamShard", "samplerd.v1.StreamShardRequest"},
      {"EndEpoch", "samplerd.v1.EndEpochRequest"},
      {"GetJobStatus", "samplerd.v1.GetJobStatusRequest"},
  };
  for (const auto& [method, type] : methods) {
    SCOPED_TRACE(method);
    const grpc::Status s = RawCall(channel_, "/samplerd.v1.Sampler/" + method, {kGarbage});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("could not be parsed as " + type));
    EXPECT_THAT(s.error_message(), HasSubstr("not a valid protobuf encoding"));
  }
}

TEST_F(UnparseableRequestTest, ANameThatIsNotUtf8IsInvalidArgumentNamingTheField) {
  v1::CreateJobRequest request;
  request.mutable_spec()->set_num_samples(10);
  request.mutable_spec()->set_world_size(1);
  // name = "a\xff", field 1, appended by hand: the generated setter would not serialize it.
  const std::string bytes = request.SerializeAsString() + std::string(
                                                              "\x0a\x02"
                                                              "a\xff",
                                                              4);
  const grpc::Status s = RawCall(channel_, "/samplerd.v1.Sampler/CreateJob", {bytes});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("samplerd.v1.CreateJobRequest"));
  EXPECT_THAT(s.error_message(), HasSubstr("name = \"a\\xff\" is not valid UTF-8"));
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(Unary([&](grpc::ClientContext* c) {
                return stub_->ListJobs(c, v1::ListJobsRequest(), &jobs);
              }).ok());
  EXPECT_EQ(jobs.jobs_size(), 2);  // Nothing was created.
}

// What gRPC answers itself, before samplerd sees the message (as the .proto says).
TEST_F(UnparseableRequestTest, WhatGrpcAnswersBeforeSamplerdSeesTheMessage) {
  grpc::Status s =
      RawCall(channel_, "/samplerd.v1.Sampler/GetJob", {std::string((1 << 16) + 1, '\x0d')});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("larger than max"));
  s = RawCall(channel_, "/samplerd.v1.Sampler/NoSuchMethod", {""});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

TEST_F(UnparseableRequestTest, AValidRawRequestStillWorks) {
  v1::GetJobRequest request;
  request.set_name("j");
  request.set_rank(0);
  std::vector<std::string> responses;
  ASSERT_TRUE(
      RawCall(channel_, "/samplerd.v1.Sampler/GetJob", {request.SerializeAsString()}, &responses)
          .ok());
  ASSERT_EQ(responses.size(), 1u);
  v1::Job job;
  ASSERT_TRUE(job.ParseFromString(responses[0]));
  EXPECT_EQ(job.name(), "j");
  EXPECT_EQ(job.shard_length(), 100u);
}

}  // namespace
}  // namespace samplerd
