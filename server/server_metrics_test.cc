// A real Server with its metrics endpoint on a free port, driven over real gRPC; the metrics are
// read over real HTTP (CivetWeb's client), as Prometheus reads them.
#include <civetweb.h>
#include <sys/stat.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/server.h"
#include "server/testing/test_dir.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// GET url (http://host:port/path); the body, or "" (with a test failure) on error.
std::string HttpGet(const std::string& url) {
  const std::string rest = url.substr(std::string("http://").size());
  const std::string host = rest.substr(0, rest.find(':'));
  const int port = std::stoi(rest.substr(rest.find(':') + 1));
  const std::string path = rest.substr(rest.find('/'));
  char error[256] = "";
  mg_connection* connection = mg_connect_client(host.c_str(), port, 0, error, sizeof(error));
  if (connection == nullptr) {
    ADD_FAILURE() << url << ": " << error;
    return "";
  }
  mg_printf(connection, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path.c_str(),
            host.c_str());
  std::string body;
  if (mg_get_response(connection, error, sizeof(error), 10000) < 0) {
    ADD_FAILURE() << url << ": " << error;
  } else {
    EXPECT_EQ(mg_get_response_info(connection)->status_code, 200);
    char buffer[4096];
    for (int n; (n = mg_read(connection, buffer, sizeof(buffer))) > 0;) body.append(buffer, n);
  }
  mg_close_connection(connection);
  return body;
}

class ServerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options = testutil::LoopbackTestOptions();
    options.metrics_port = 0;
    options.planner_threads = 2;
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Sampler::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  std::string Metrics() { return HttpGet(server_->metrics_url()); }

  grpc::Status CreateJob(const std::string& name, uint64_t n) {
    grpc::ClientContext context;
    v1::CreateJobRequest request;
    request.set_name(name);
    request.mutable_spec()->set_num_samples(n);
    request.mutable_spec()->set_world_size(1);
    v1::Job job;
    return stub_->CreateJob(&context, request, &job);
  }

  uint64_t StreamAll(const std::string& job, uint64_t epoch) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::StreamShardRequest request;
    request.set_job(job);
    request.set_epoch(epoch);
    request.set_world_size(1);
    auto reader = stub_->StreamShard(&context, request);
    v1::ShardChunk chunk;
    std::vector<uint64_t>& shard = shards_[{job, epoch}];
    shard.clear();
    while (reader->Read(&chunk)) {
      shard.insert(shard.end(), chunk.indices32().begin(), chunk.indices32().end());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return shard.size();
  }

  v1::LossReportSummary Report(const std::vector<v1::LossBatch>& batches) {
    grpc::ClientContext context;
    v1::LossReportSummary summary;
    auto writer = stub_->ReportLosses(&context, &summary);
    for (const v1::LossBatch& batch : batches) EXPECT_TRUE(writer->Write(batch));
    writer->WritesDone();
    EXPECT_TRUE(writer->Finish().ok());
    return summary;
  }

  // Losses for shard positions 0..size-1 of (job, epoch), as StreamAll received them.
  v1::LossBatch Batch(const std::string& job, uint64_t epoch, uint64_t seq, int size) {
    const std::vector<uint64_t>& shard = shards_[{job, epoch}];
    v1::LossBatch batch;
    batch.set_job(job);
    batch.set_epoch(epoch);
    batch.set_seq(seq);
    for (int i = 0; i < size && i < static_cast<int>(shard.size()); ++i) {
      batch.add_indices(shard[i]);
      batch.add_losses(0.5f);
      batch.add_positions(i);
    }
    return batch;
  }

  grpc::Status EndEpoch(const std::string& job, uint64_t epoch) {
    grpc::ClientContext context;
    v1::EndEpochRequest request;
    request.set_job(job);
    request.set_epoch(epoch);
    v1::EndEpochResponse response;
    return stub_->EndEpoch(&context, request, &response);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> shards_;  // By (job, epoch).
};

TEST_F(ServerMetricsTest, ExportsRpcsJobsAndLossOutcomes) {
  EXPECT_THAT(server_->metrics_url(), HasSubstr("http://127.0.0.1:"));
  ASSERT_TRUE(CreateJob("j", 100).ok());
  EXPECT_EQ(StreamAll("j", 0), 100u);
  // 10 accepted, then the same batch again: 10 duplicates.
  v1::LossReportSummary summary = Report({Batch("j", 0, 1, 10), Batch("j", 0, 1, 10)});
  EXPECT_EQ(summary.accepted(), 10u);
  EXPECT_EQ(summary.duplicates(), 10u);
  ASSERT_TRUE(EndEpoch("j", 0).ok());
  EXPECT_EQ(StreamAll("j", 1), 100u);  // Waits for epoch 1's plan.
  // A late batch of epoch 0: 5 stale.
  EXPECT_EQ(Report({Batch("j", 0, 2, 5)}).stale(), 5u);
  ASSERT_TRUE(EndEpoch("j", 1).ok());
  // A failing call, counted by its code.
  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_name("missing");
    v1::Job job;
    EXPECT_EQ(stub_->GetJob(&context, request, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Epoch 2 is being planned, or served: wait until it is served.
  std::string text;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20); absl::Now() < deadline;) {
    text = Metrics();
    if (text.find("samplerd_job_plan_ready{job_name=\"j\"} 1\n") != std::string::npos &&
        text.find("samplerd_job_epoch{job_name=\"j\"} 2\n") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(text, HasSubstr("samplerd_job_epoch{job_name=\"j\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_job_ranks_ended{job_name=\"j\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_job_world_size{job_name=\"j\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_jobs 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_indices_streamed_total{job_name=\"j\"} 200\n"));
  EXPECT_THAT(text,
              HasSubstr("samplerd_loss_pairs_total{job_name=\"j\",outcome=\"accepted\"} 10\n"));
  EXPECT_THAT(text,
              HasSubstr("samplerd_loss_pairs_total{job_name=\"j\",outcome=\"duplicate\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_loss_pairs_total{job_name=\"j\",outcome=\"stale\"} 5\n"));
  const std::string sampler = "service=\"samplerd.v1.Sampler\"";
  EXPECT_THAT(
      text, HasSubstr("samplerd_rpcs_total{" + sampler + ",method=\"CreateJob\",code=\"OK\"} 1\n"));
  EXPECT_THAT(
      text, HasSubstr("samplerd_rpcs_total{" + sampler + ",method=\"EndEpoch\",code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_rpcs_total{" + sampler +
                              ",method=\"GetJob\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_rpcs_total{" + sampler +
                              ",method=\"ReportLosses\",code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_rpcs_total{" + sampler +
                              ",method=\"StreamShard\",code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_rpc_duration_seconds_count{" + sampler +
                              ",method=\"StreamShard\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_build_info{version=\""));
  EXPECT_THAT(text, HasSubstr("samplerd_job_memory_estimate_bytes{job_name=\"j\"} "));
  EXPECT_THAT(text, HasSubstr("samplerd_stream_buffer_bytes 0\n"));
  // The process-wide families are served too (planning ran at least three times here).
  EXPECT_THAT(text, HasSubstr("# TYPE samplerd_epoch_plan_seconds histogram\n"));
  EXPECT_THAT(text, Not(HasSubstr("samplerd_epoch_plan_seconds_count 0\n")));

  // A deleted job's series go.
  {
    grpc::ClientContext context;
    v1::DeleteJobRequest request;
    request.set_name("j");
    v1::DeleteJobResponse response;
    ASSERT_TRUE(stub_->DeleteJob(&context, request, &response).ok());
  }
  text = Metrics();
  EXPECT_THAT(text, Not(HasSubstr("job_name=\"j\"")));
  EXPECT_THAT(text, HasSubstr("samplerd_jobs 0\n"));
}

// A mixture job's group weights: one series per group of its 16 heaviest (bounded whatever K),
// the weights in force; a job that is not a mixture job has none.
TEST_F(ServerMetricsTest, MixtureGroupWeightsOfTheHeaviestGroupsOnly) {
  ASSERT_TRUE(CreateJob("plain", 10).ok());
  grpc::ClientContext context;
  v1::CreateJobRequest request;
  request.set_name("mix");
  request.mutable_spec()->set_world_size(1);
  request.mutable_spec()->set_samples_per_epoch(40);
  for (int k = 0; k < 20; ++k) {
    request.mutable_spec()->mutable_mixture()->add_group_sizes(5);
    // Weights 1..20 of total 210: group 19 the heaviest, groups 0-3 out of the top 16.
    request.mutable_spec()->mutable_mixture()->add_group_weights(k + 1);
  }
  v1::Job job;
  ASSERT_TRUE(stub_->CreateJob(&context, request, &job).ok());
  const std::string text = Metrics();
  int series = 0;
  for (size_t at = 0; (at = text.find("samplerd_mixture_group_weight{", at)) != std::string::npos;
       ++at) {
    ++series;
  }
  EXPECT_EQ(series, 16);
  EXPECT_THAT(text, HasSubstr("samplerd_mixture_group_weight{job_name=\"mix\",group=\"19\"} "
                              "0.0952380952"));
  EXPECT_THAT(text, HasSubstr("samplerd_mixture_group_weight{job_name=\"mix\",group=\"4\"} "));
  EXPECT_THAT(text, Not(HasSubstr("group=\"3\"")));
  EXPECT_THAT(text, Not(HasSubstr("samplerd_mixture_group_weight{job_name=\"plain\"")));
}

TEST_F(ServerMetricsTest, UnknownMethodsDoNotCreateSeries) {
  grpc::GenericStub generic(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    grpc::Slice empty(std::string(""));
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status status;
    absl::Notification done;
    generic.UnaryCall(&context, absl::StrCat("/evil.Service", i, "/Method", i), grpc::StubOptions(),
                      &request, &response, [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string text = Metrics();
  EXPECT_THAT(text, Not(HasSubstr("evil")));
  EXPECT_THAT(text, HasSubstr("samplerd_rpcs_total{service=\"other\",method=\"other\","
                              "code=\"UNIMPLEMENTED\"} 3\n"));
}

TEST(ServerMetricsOptionsTest, BadMetricsPortIsRefusedAndNoneMeansNoUrl) {
  Options options = testutil::LoopbackTestOptions();
  options.metrics_port = -2;
  auto refused = Server::Create(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("metrics_port = -2"));
  options.metrics_port = -1;
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok());
  EXPECT_EQ((*server)->metrics_url(), "");
}

// The metrics name every job: by default they listen on loopback whatever --host is, and
// another address needs a token (docs/OPERATIONS.md).
TEST(ServerMetricsOptionsTest, MetricsListenOnLoopbackUnlessATokenGuardsThem) {
  testutil::TestDir dir;
  Options options = testutil::LoopbackTestOptions();
  options.host = "0.0.0.0";
  options.metrics_port = 0;
  {
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_THAT((*server)->metrics_url(), ::testing::StartsWith("http://127.0.0.1:"));
  }
  // Only a loopback address (or localhost) goes without a token; a name merely starting like
  // one may resolve anywhere.
  for (const char* host : {"0.0.0.0", "127.attacker.example", "127.0.0.1.example", "10.1.2.3"}) {
    options.metrics_host = host;
    auto refused = Server::Create(options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr(absl::StrCat("metrics_host = \"", host, "\" is not loopback")));
  }
  options.metrics_host = "0.0.0.0";
  auto refused = Server::Create(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr("metrics_host = \"0.0.0.0\" is not loopback"),
                    HasSubstr("--metrics_token_file")));
  options.metrics_token_file = dir.path() + "/absent";
  refused = Server::Create(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("metrics_token_file: "));
  options.metrics_token_file = dir.path() + "/metrics-token";
  testutil::WriteBytes(options.metrics_token_file, "metrics-token-0123456789abcdef\n");
  // As the tokens file: one that others may write is refused (they could put in their own).
  ASSERT_EQ(::chmod(options.metrics_token_file.c_str(), 0666), 0);
  refused = Server::Create(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr(absl::StrCat("metrics_token_file = \"", options.metrics_token_file,
                                           "\": writable by every user (mode 0666)")),
                    HasSubstr("chmod go-w")));
  ASSERT_EQ(::chmod(options.metrics_token_file.c_str(), 0600), 0);
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->metrics_url(), ::testing::StartsWith("http://0.0.0.0:"));
}

}  // namespace
}  // namespace samplerd
