// The metadata-stage token check: Sampler calls need a valid token, other services none.
#include "server/auth/token_metadata_processor.h"

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTrain[] = "train-token-0123456789abcdef";

class TokenMetadataProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = dir_.path() + "/tokens";
    testutil::WriteBytes(path, absl::StrCat(kTrain, " jobs=train\n"));
    auto authorizer = Authorizer::Create(path);
    ASSERT_TRUE(authorizer.ok()) << authorizer.status();
    authorizer_ = *std::move(authorizer);
    refused_ = metrics_.AddCounter("refused", "Refused.")->WithLabels({});
    processor_ = std::make_unique<TokenMetadataProcessor>(authorizer_.get(), "samplerd.v1.Sampler",
                                                          refused_);
  }

  // Process() of a call to `path` with `authorization` (none if empty).
  grpc::Status Call(const std::string& path, const std::string& authorization) {
    grpc::AuthMetadataProcessor::InputMetadata metadata{{":path", path}};
    if (!authorization.empty()) metadata.emplace("authorization", authorization);
    grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
    return processor_->Process(metadata, nullptr, &consumed, &response);
  }

  testutil::TestDir dir_;
  metrics::Registry metrics_;
  std::shared_ptr<metrics::Counter> refused_;
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<TokenMetadataProcessor> processor_;
};

TEST_F(TokenMetadataProcessorTest, ASamplerCallWithoutAValidTokenIsRefused) {
  EXPECT_FALSE(processor_->IsBlocking());
  for (const std::string& authorization :
       {std::string(), std::string("Bearer not-a-token-0123456789"), std::string(kTrain)}) {
    const grpc::Status s = Call("/samplerd.v1.Sampler/CreateJob", authorization);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << authorization;
    EXPECT_THAT(s.error_message(), HasSubstr("--auth_tokens_file"));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("not-a-token")));
  }
  EXPECT_EQ(refused_->value(), 3);
}

TEST_F(TokenMetadataProcessorTest, AValidTokenPassesWhateverItsJobs) {
  // The job is the handler's check: a token for "train" passes here for any Sampler call.
  EXPECT_TRUE(Call("/samplerd.v1.Sampler/ListJobs", absl::StrCat("Bearer ", kTrain)).ok());
  EXPECT_TRUE(Call("/samplerd.v1.Sampler/StreamShard", absl::StrCat("Bearer ", kTrain)).ok());
  EXPECT_EQ(refused_->value(), 0);
}

TEST_F(TokenMetadataProcessorTest, OtherServicesNeedNoToken) {
  EXPECT_TRUE(Call("/grpc.health.v1.Health/Check", "").ok());
  EXPECT_TRUE(Call("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "").ok());
  // A look-alike service name is not the Sampler's.
  EXPECT_TRUE(Call("/samplerd.v1.SamplerX/CreateJob", "").ok());
  EXPECT_EQ(Call("/samplerd.v1.Sampler/", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused_->value(), 1);
}

}  // namespace
}  // namespace samplerd
