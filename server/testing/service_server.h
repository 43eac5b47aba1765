// A SamplerService served by a real grpc::Server on a loopback port chosen by the system (port
// 0), for the tests of the service's reactors: they run exactly as in production (gRPC's
// callback threads, the WorkPool, flow control), without the rest of samplerd's Server.
#ifndef SAMPLERD_SERVER_TESTING_SERVICE_SERVER_H_
#define SAMPLERD_SERVER_TESTING_SERVICE_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "server/sampler_service.h"

namespace samplerd {
namespace testutil {

class ServiceServer {
 public:
  // Serves `service` (which must outlive this object) on 127.0.0.1.
  explicit ServiceServer(SamplerService* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Sampler::NewStub(channel_);
  }
  // Cancels the calls still open (a shard stream waiting for its plan, say).
  ~ServiceServer() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  v1::Sampler::Stub& stub() { return *stub_; }

  // A context whose call ends after `timeout`.
  static std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(20)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return context;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_SERVICE_SERVER_H_
