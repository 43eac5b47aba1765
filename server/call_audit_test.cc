// A real Server with bearer tokens, called over real gRPC; the log lines are caught with a glog
// sink.
#include "server/call_audit.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/server.h"
#include "server/testing/test_dir.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr char kTrain[] = "train-token-0123456789abcdef";  // Grants the job "train".

// The log lines with `event` written while it exists.
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }

  void send(google::LogSeverity, const char*, const char*, int, const struct ::tm*,
            const char* message, size_t length) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }

  std::vector<std::string> With(const std::string& event) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.rfind("event=" + event + " ", 0) == 0) found.push_back(line);
    }
    return found;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class CallAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokens = dir_.path() + "/tokens";
    testutil::WriteBytes(tokens, absl::StrCat(kAdmin, " admin\n", kTrain, " jobs=train\n"));
    Options options = testutil::LoopbackTestOptions();
    options.auth_tokens_file = tokens;
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Sampler::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  // A context sending `token` ("" for none).
  static std::unique_ptr<grpc::ClientContext> With(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return context;
  }

  grpc::StatusCode Create(const std::string& token, const std::string& name) {
    v1::CreateJobRequest request;
    request.set_name(name);
    request.mutable_spec()->set_num_samples(16);
    request.mutable_spec()->set_world_size(1);
    v1::Job job;
    return stub_->CreateJob(With(token).get(), request, &job).error_code();
  }

  testutil::TestDir dir_;
  LogLines log_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(CallAuditTest, RefusedCallsAreLoggedWithMethodJobPeerAndCodeNeverTheToken) {
  EXPECT_EQ(Create("", "train"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Create("unknown-token-0123456789abcdef", "train"), grpc::StatusCode::UNAUTHENTICATED);
  v1::GetJobRequest get;
  get.set_name("secret");
  v1::Job job;
  EXPECT_EQ(stub_->GetJob(With(kTrain).get(), get, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A client stream refused for its token before it sent anything, and one refused at its
  // first message (another job's).
  v1::LossReportSummary summary;
  {
    auto context = With("");
    auto writer = stub_->ReportLosses(context.get(), &summary);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto context = With(kTrain);
    auto writer = stub_->ReportLosses(context.get(), &summary);
    v1::LossBatch batch;
    batch.set_job("secret");
    writer->Write(batch);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }

  const std::vector<std::string> refused = log_.With("call_refused");
  ASSERT_EQ(refused.size(), 5u) << ::testing::PrintToString(refused);
  const std::string peer = " peer=ipv4:127.0.0.1:[0-9]+ client=- ";
  EXPECT_THAT(refused[0], MatchesRegex("event=call_refused method=/samplerd.v1.Sampler/CreateJob "
                                       "code=UNAUTHENTICATED" +
                                       peer + "job=train message=\"no bearer token: .*"));
  EXPECT_THAT(refused[1], MatchesRegex(".*CreateJob code=UNAUTHENTICATED" + peer +
                                       "job=train message=\"the bearer token is not one.*"));
  EXPECT_THAT(refused[2], MatchesRegex(".*method=/samplerd.v1.Sampler/GetJob "
                                       "code=PERMISSION_DENIED" +
                                       peer + "job=secret message=.*"));
  EXPECT_THAT(refused[3], MatchesRegex(".*ReportLosses code=UNAUTHENTICATED" + peer + "job=- .*"));
  EXPECT_THAT(refused[4],
              MatchesRegex(".*ReportLosses code=PERMISSION_DENIED" + peer + "job=secret .*"));
  for (const std::string& line : refused) {
    EXPECT_THAT(line, AllOf(Not(HasSubstr(kTrain)), Not(HasSubstr("unknown-token"))));
  }
}

TEST_F(CallAuditTest, EveryManagementCallLeavesAnAuditLine) {
  ASSERT_EQ(Create(kTrain, "train"), grpc::StatusCode::OK);
  v1::RewindJobRequest rewind;
  rewind.set_name("train");
  rewind.set_epoch(5);  // Not kept: FAILED_PRECONDITION, audited all the same.
  v1::Job job;
  EXPECT_EQ(stub_->RewindJob(With(kTrain).get(), rewind, &job).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::ResizeJobRequest resize;
  resize.set_name("train");
  resize.set_epoch(0);
  resize.set_world_size(2);
  EXPECT_TRUE(stub_->ResizeJob(With(kTrain).get(), resize, &job).ok());
  v1::DeleteJobRequest remove;
  remove.set_name("train");
  v1::DeleteJobResponse deleted;
  EXPECT_EQ(stub_->DeleteJob(With(kTrain).get(), remove, &deleted).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(stub_->DeleteJob(With(kAdmin).get(), remove, &deleted).ok());
  // Not management calls: no audit line.
  v1::GetJobRequest get;
  get.set_name("train");
  stub_->GetJob(With(kAdmin).get(), get, &job);

  const std::vector<std::string> audit = log_.With("audit");
  ASSERT_EQ(audit.size(), 5u) << ::testing::PrintToString(audit);
  const std::string peer = " peer=ipv4:127.0.0.1:[0-9]+ client=- ";
  EXPECT_THAT(audit[0], MatchesRegex("event=audit method=/samplerd.v1.Sampler/CreateJob code=OK" +
                                     peer + "job=train ms=[0-9]+"));
  EXPECT_THAT(audit[1], MatchesRegex(".*RewindJob code=FAILED_PRECONDITION" + peer +
                                     "job=train ms=[0-9]+ message=.*"));
  EXPECT_THAT(audit[2], MatchesRegex(".*ResizeJob code=OK" + peer + "job=train ms=[0-9]+"));
  EXPECT_THAT(audit[3], MatchesRegex(".*DeleteJob code=PERMISSION_DENIED" + peer + "job=train .*"));
  EXPECT_THAT(audit[4], MatchesRegex(".*DeleteJob code=OK" + peer + "job=train ms=[0-9]+"));
}

TEST(CallAuditStringFieldTest, FindsTheFieldWhereverItIsAndNothingInGarbage) {
  // Protobuf writes fields in number order, but a parser must take any order: the job (field 1)
  // after the arrays, as two concatenated messages encode it.
  v1::LossBatch head;
  head.set_epoch(3);
  for (int i = 0; i < 1000; ++i) head.add_indices(i);
  v1::LossBatch tail;
  tail.set_job("late");
  grpc::Slice slice(head.SerializeAsString() + tail.SerializeAsString());
  EXPECT_EQ(CallAuditInterceptorFactory::StringField(grpc::ByteBuffer(&slice, 1), 1), "late");
  grpc::Slice garbage(std::string("\xff\xff\xff\xff\x0f garbage"));
  EXPECT_EQ(CallAuditInterceptorFactory::StringField(grpc::ByteBuffer(&garbage, 1), 1), "");
  EXPECT_EQ(CallAuditInterceptorFactory::StringField(grpc::ByteBuffer(), 1), "");
}

// Protobuf's parser keeps the last occurrence of a singular field, and so does the server: the
// log must name that one, or a request naming a decoy first and its real job last (a long one,
// to be cut, or a short one) would be logged under the decoy.
TEST(CallAuditStringFieldTest, TakesTheLastOccurrenceAsTheServersParserDoes) {
  for (const std::string& decoy : {std::string("decoy"), std::string(300, 'd')}) {
    v1::DeleteJobRequest first, last;
    first.set_name(decoy);
    last.set_name("victim");
    grpc::Slice slice(first.SerializeAsString() + last.SerializeAsString());
    v1::DeleteJobRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(first.SerializeAsString() + last.SerializeAsString()));
    ASSERT_EQ(parsed.name(), "victim");
    EXPECT_EQ(CallAuditInterceptorFactory::StringField(grpc::ByteBuffer(&slice, 1), 1), "victim")
        << decoy.size();
  }
  // A long value is cut at 256 bytes.
  v1::DeleteJobRequest long_name;
  long_name.set_name(std::string(300, 'x'));
  grpc::Slice slice(long_name.SerializeAsString());
  EXPECT_EQ(CallAuditInterceptorFactory::StringField(grpc::ByteBuffer(&slice, 1), 1),
            std::string(256, 'x'));
}

}  // namespace
}  // namespace samplerd
