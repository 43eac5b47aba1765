// Server on its own: option checks, health checking (for "" and the named service, and while
// shutting down) and reflection answering standard tools, and a graceful shutdown (waiting streams
// end UNAVAILABLE and streams still writing are cancelled at once; other calls finish).
#include "server/server.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/testing/test_server_options.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

Options TestOptions() {
  Options options = testutil::LoopbackTestOptions();
  options.planner_threads = 2;
  options.grace_period = absl::Seconds(5);
  return options;
}

// Creates job "j" of `num_samples` samples and one rank through `stub`.
void CreateJob(v1::Sampler::Stub& stub, uint64_t num_samples) {
  grpc::ClientContext context;
  v1::CreateJobRequest request;
  request.set_name("j");
  request.mutable_spec()->set_num_samples(num_samples);
  request.mutable_spec()->set_world_size(1);
  v1::Job job;
  ASSERT_TRUE(stub.CreateJob(&context, request, &job).ok());
}

TEST(ServerTest, BadOptionsNameTheOption) {
  struct Case {
    void (*mutate)(Options*);
    absl::StatusCode code;
    std::string want;
  } cases[] = {
      {[](Options* o) { o->port = 70000; }, absl::StatusCode::kInvalidArgument, "port = 70000"},
      {[](Options* o) { o->backend = "tpu"; }, absl::StatusCode::kInvalidArgument,
       "backend = \"tpu\""},
      // --backend=cuda without a GPU: tests/python/test_backend_choice.py (it depends on the
      // machine; that test skips where a driver is installed).
      {[](Options* o) { o->cuda_device = -1; }, absl::StatusCode::kInvalidArgument,
       "cuda_device = -1: must be >= 0"},
      {[](Options* o) { o->max_jobs = 0; }, absl::StatusCode::kInvalidArgument, "max_jobs = 0"},
      {[](Options* o) { o->max_jobs = -3; }, absl::StatusCode::kInvalidArgument, "max_jobs = -3"},
      {[](Options* o) { o->max_samples_per_job = 0; }, absl::StatusCode::kInvalidArgument,
       "max_samples_per_job = 0"},
      {[](Options* o) { o->max_message_bytes = 100; }, absl::StatusCode::kInvalidArgument,
       "max_message_bytes = 100"},
      {[](Options* o) { o->max_server_threads = 2; }, absl::StatusCode::kInvalidArgument,
       "max_server_threads = 2"},
      {[](Options* o) {
         o->max_memory_bytes = uint64_t{1} << 30;
         o->max_stream_buffer_bytes = uint64_t{1} << 30;
       },
       absl::StatusCode::kInvalidArgument,
       "--max_stream_buffer_bytes = 1073741824 bytes (1.0 GiB) plus --max_transport_buffer_bytes = "
       "268435456 bytes (256.0 MiB), leaves nothing of --max_memory_bytes = 1073741824 bytes"},
      {[](Options* o) { o->planner_threads = -1; }, absl::StatusCode::kInvalidArgument,
       "planner_threads = -1"},
      {[](Options* o) { o->grace_period = absl::Seconds(-1); }, absl::StatusCode::kInvalidArgument,
       "grace_period = -1s"},
      {[](Options* o) { o->host = ""; }, absl::StatusCode::kInvalidArgument, "host"},
  };
  for (const Case& c : cases) {
    Options options = TestOptions();
    c.mutate(&options);
    auto server = Server::Create(options);
    EXPECT_EQ(server.status().code(), c.code) << c.want;
    EXPECT_THAT(std::string(server.status().message()), HasSubstr(c.want));
  }
}

TEST(ServerTest, PortZeroBindsAFreePortAndTwoServersCoexist) {
  auto a = Server::Create(TestOptions());
  auto b = Server::Create(TestOptions());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT((*a)->port(), 0);
  EXPECT_NE((*a)->port(), (*b)->port());
  EXPECT_EQ((*a)->address(), "127.0.0.1:" + std::to_string((*a)->port()));
  // The port is taken now: binding it again fails with UNAVAILABLE.
  Options taken = TestOptions();
  taken.port = (*a)->port();
  EXPECT_EQ(Server::Create(taken).status().code(), absl::StatusCode::kUnavailable);
}

// A unary call by method name with raw bytes (no generated stubs for the standard services).
grpc::Status RawUnary(grpc::Channel* channel, const std::string& method, const std::string& in,
                      std::string* out) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(in);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return status;
}

// grpc.health.v1.Health/Check for `service`: the status it answers (1 SERVING, 2 NOT_SERVING),
// or -1 with the error in `error`.
int HealthStatus(grpc::Channel* channel, const std::string& service, grpc::Status* error) {
  // HealthCheckRequest{service = 1}; the answer HealthCheckResponse{status = 1} is 08 <status>.
  std::string request;
  if (!service.empty())
    request = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  std::string response;
  *error = RawUnary(channel, "/grpc.health.v1.Health/Check", request, &response);
  if (!error->ok()) return -1;
  return response.size() == 2 && response[0] == '\x08' ? response[1] : -1;
}

TEST(ServerTest, HealthCheckingAndReflectionAnswer) {
  auto server = Server::Create(TestOptions());
  ASSERT_TRUE(server.ok());
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  std::string health;
  // grpc.health.v1.HealthCheckRequest{service: ""} is empty; the answer {status: SERVING} is 08 01.
  ASSERT_TRUE(RawUnary(channel.get(), "/grpc.health.v1.Health/Check", "", &health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2));
  // The named service too (Kubernetes probes with `service:`, grpc_health_probe -service).
  grpc::Status error;
  EXPECT_EQ(HealthStatus(channel.get(), "samplerd.v1.Sampler", &error), 1) << error.error_message();
  // Any other name is unknown.
  EXPECT_EQ(HealthStatus(channel.get(), "samplerd.v1.Nope", &error), -1);
  EXPECT_EQ(error.error_code(), grpc::StatusCode::NOT_FOUND);

  // Reflection: ServerReflectionRequest{list_services: ""} (field 7) over the bidi stream.
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1), response;
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string listed;
  for (const grpc::Slice& s : slices)
    listed.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(listed, HasSubstr("samplerd.v1.Sampler"));
  EXPECT_THAT(listed, HasSubstr("grpc.health.v1.Health"));
  call->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status finish;
  call->Finish(&finish, reinterpret_cast<void*>(5));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(finish.ok()) << finish.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(ServerTest, HealthIsNotServingForEveryServiceDuringTheGracePeriod) {
  Options options = TestOptions();
  options.grace_period = absl::Seconds(30);
  auto created = Server::Create(options);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Server> server = *std::move(created);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  ASSERT_NO_FATAL_FAILURE(CreateJob(*stub, 100));
  // A loss report still open (its client has not finished writing): Shutdown waits for it, so
  // the server stays in its grace period, still answering calls.
  grpc::ClientContext report_context;
  v1::LossReportSummary summary;
  auto report = stub->ReportLosses(&report_context, &summary);
  v1::LossBatch batch;  // A valid batch: the index served at rank 0's position 0.
  batch.set_job("j");
  {
    grpc::ClientContext context;
    v1::StreamShardRequest request;
    request.set_job("j");
    request.set_world_size(1);
    auto reader = stub->StreamShard(&context, request);
    v1::ShardChunk chunk;
    ASSERT_TRUE(reader->Read(&chunk) && chunk.indices32_size() > 0);
    batch.add_indices(chunk.indices32(0));
    context.TryCancel();
  }
  batch.add_losses(1.0f);
  batch.add_positions(0);
  ASSERT_TRUE(report->Write(batch));
  absl::SleepFor(absl::Milliseconds(200));  // The handler is running.

  const absl::Time start = absl::Now();
  std::thread stopper([&] { server->Shutdown(); });
  grpc::Status error;
  int plain = 0, named = 0;
  while (absl::Now() - start < absl::Seconds(10)) {
    plain = HealthStatus(channel.get(), "", &error);
    ASSERT_TRUE(error.ok()) << "health must answer during the grace period: "
                            << error.error_message();
    named = HealthStatus(channel.get(), "samplerd.v1.Sampler", &error);
    ASSERT_TRUE(error.ok()) << error.error_message();
    if (plain == 2 && named == 2) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(plain, 2) << "\"\" is not NOT_SERVING while shutting down";
  EXPECT_EQ(named, 2) << "samplerd.v1.Sampler is not NOT_SERVING while shutting down";
  // Still in the grace period: the report is in flight and the shutdown has not returned.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The report ends; its batch was applied; the shutdown completes.
  report->WritesDone();
  EXPECT_TRUE(report->Finish().ok());
  EXPECT_EQ(summary.accepted(), 1u);
  stopper.join();
  server->Wait();
}

TEST(ServerTest, AnIdleConnectedClientDoesNotHoldShutdown) {
  Options options = TestOptions();
  options.grace_period = absl::Seconds(20);
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok());
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(stub->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  const absl::Time start = absl::Now();
  (*server)->Shutdown();
  (*server)->Wait();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ServerTest, ShutdownWakesWaitersAndEndsWritingStreams) {
  // Far longer than the bounds below, so that "done when the calls were" and "waited out the
  // grace period" stay apart however loaded the test machine is.
  Options options = TestOptions();
  options.grace_period = absl::Seconds(30);
  auto created = Server::Create(options);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Server> server = *std::move(created);
  auto stub = v1::Sampler::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  const uint64_t n = 2'000'000;  // 8 MB of indices for rank 0: far beyond the flow-control window.
  {
    grpc::ClientContext context;
    v1::CreateJobRequest request;
    request.set_name("j");
    request.mutable_spec()->set_num_samples(n);
    request.mutable_spec()->set_world_size(2);
    v1::Job job;
    ASSERT_TRUE(stub->CreateJob(&context, request, &job).ok());
  }
  // A rank waiting for epoch 1 (the barrier is never reached).
  grpc::Status waiter_status;
  absl::Notification waiter_done;
  std::thread waiter([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::StreamShardRequest request;
    request.set_job("j");
    request.set_epoch(1);
    request.set_world_size(2);
    auto reader = stub->StreamShard(&context, request);
    v1::ShardChunk chunk;
    while (reader->Read(&chunk)) {
    }
    waiter_status = reader->Finish();
    waiter_done.Notify();
  });
  // A rank in the middle of its epoch-0 shard: a small fixed flow-control window (no BDP growth)
  // keeps the server blocked in Write, so the stream is really in flight at Shutdown.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024);
  auto slow = v1::Sampler::NewStub(
      grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::StreamShardRequest request;
  request.set_job("j");
  request.set_world_size(2);
  request.set_max_chunk_size(4096);
  auto reader = slow->StreamShard(&context, request);
  v1::ShardChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  uint64_t received = chunk.indices32_size();
  absl::SleepFor(absl::Milliseconds(200));  // The waiter is parked on the server.

  const absl::Time start = absl::Now();
  std::thread stopper([&] { server->Shutdown(); });
  ASSERT_TRUE(waiter_done.WaitForNotificationWithTimeout(absl::Seconds(15)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the waiter was not woken";
  EXPECT_EQ(waiter_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << waiter_status.error_message();
  // The writing stream, blocked in Write while its reader held back, is ended (a client reopens
  // it at its next position on the restarted server): let finish, a stream paced by a trainer
  // held the shutdown for the whole grace period while its loss reports were refused.
  EXPECT_LT(received, n / 4);
  // Shutdown wakes the waiters before it ends the writing streams: read on only once it has
  // returned, which it does at once only if it ended this stream without the reader's help (a
  // reader that resumed at the waiter's wake-up could drain the stream first on a slow machine).
  stopper.join();
  // Done at once: well before the 30 s grace period, though clients stay connected.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  while (reader->Read(&chunk)) received += chunk.indices32_size();
  const grpc::Status finished = reader->Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::CANCELLED) << finished.error_message();
  EXPECT_LT(received, n / 2);
  waiter.join();
  server->Wait();
  // Nothing is served any more.
  grpc::ClientContext late;
  late.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ListJobsResponse jobs;
  EXPECT_FALSE(stub->ListJobs(&late, v1::ListJobsRequest(), &jobs).ok());
}

TEST(ServerTest, ASecondShutdownReturnsOnlyWhenTheServerHasStopped) {
  Options options = TestOptions();
  options.grace_period = absl::Seconds(3);
  auto created = Server::Create(options);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Server> server = *std::move(created);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  ASSERT_NO_FATAL_FAILURE(CreateJob(*stub, 100));
  // A loss report whose client never finishes writing: its handler waits in Read, so the first
  // Shutdown waits out the grace period.
  grpc::ClientContext stalled;
  v1::LossReportSummary summary;
  auto report = stub->ReportLosses(&stalled, &summary);
  absl::SleepFor(absl::Milliseconds(200));  // The handler is running.

  std::thread first([&] { server->Shutdown(); });
  // The first Shutdown has begun once health checking says NOT_SERVING (2).
  std::string health;
  while (health != std::string("\x08\x02", 2)) {
    health.clear();
    ASSERT_TRUE(RawUnary(channel.get(), "/grpc.health.v1.Health/Check", "", &health).ok());
  }
  server->Shutdown();
  // Done means done: nothing is served any more.
  grpc::ClientContext late;
  late.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ListJobsResponse jobs;
  EXPECT_FALSE(stub->ListJobs(&late, v1::ListJobsRequest(), &jobs).ok())
      << "the second Shutdown returned while the server was still serving";
  first.join();
  stalled.TryCancel();
}

}  // namespace
}  // namespace samplerd
