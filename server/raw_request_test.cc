#include "server/raw_request.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/samplerd.pb.h"
#include "server/testing/fake_raw_reader.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Batch(uint64_t seq) {
  v1::LossBatch batch;
  batch.set_job("j");
  batch.set_seq(seq);
  batch.add_indices(seq);
  batch.add_losses(1.0f);
  return batch.SerializeAsString();
}

TEST(ParseRequestTest, AValidMessageParses) {
  v1::GetJobRequest request;
  request.set_name("train");
  request.set_rank(3);
  v1::GetJobRequest parsed;
  ASSERT_TRUE(ParseRequest(Bytes(request.SerializeAsString()), &parsed).ok());
  EXPECT_EQ(parsed.name(), "train");
  EXPECT_EQ(parsed.rank(), 3u);
  // The empty message is a valid (all-default) request.
  EXPECT_TRUE(ParseRequest(Bytes(""), &parsed).ok());
  EXPECT_EQ(parsed.name(), "");
}

TEST(ParseRequestTest, MalformedBytesAreInvalidArgumentNamingTheType) {
  v1::LossBatch batch;
  // Field 1 as fixed32 (tag 0x0d) with only 2 of its 4 bytes.
  const absl::Status s = ParseRequest(Bytes(std::string("\x0d\x01\x02", 3)), &batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("samplerd.v1.LossBatch"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a valid protobuf encoding (3 bytes)"));
}

TEST(ParseRequestTest, AStringThatIsNotUtf8IsNamedWithItsValue) {
  v1::CreateJobRequest request;
  // name = "a\xff" by hand: the generated setter would refuse to serialize it.
  const std::string bytes(
      "\x0a\x02"
      "a\xff",
      4);
  const absl::Status s = ParseRequest(Bytes(bytes), &request);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("samplerd.v1.CreateJobRequest"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("name = \"a\\xff\" is not valid UTF-8"));
}

TEST(ParseRequestTest, NoMessageAtAll) {
  v1::GetJobRequest request;
  const absl::Status s = ParseRequest(grpc::ByteBuffer(), &request);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no message"));
}

TEST(RequestStreamReaderTest, AnUnparseableMessageEndsTheStreamNamingItsPosition) {
  FakeRawReader raw({Batch(1), std::string("\x0d\x01\x02", 3), Batch(2)});
  RequestStreamReader stream(&raw);
  v1::LossBatch batch;
  ASSERT_TRUE(stream.Next(&batch));
  EXPECT_EQ(batch.seq(), 1u);
  EXPECT_FALSE(stream.Next(&batch));
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(stream.status().message()),
              HasSubstr("message 2 of the stream could not be parsed as samplerd.v1.LossBatch"));
  EXPECT_EQ(stream.parsed(), 1);
  // Stays ended: batch 2 is not read.
  EXPECT_FALSE(stream.Next(&batch));
  EXPECT_EQ(raw.read(), 2u);
}

TEST(RequestStreamReaderTest, AWellFormedStreamEndsOk) {
  FakeRawReader raw({Batch(1), Batch(2), Batch(3)});
  RequestStreamReader stream(&raw);
  v1::LossBatch batch;
  uint64_t seqs = 0;
  while (stream.Next(&batch)) seqs += batch.seq();
  EXPECT_TRUE(stream.status().ok());
  EXPECT_EQ(stream.parsed(), 3);
  EXPECT_EQ(seqs, 6u);
}

}  // namespace
}  // namespace samplerd
