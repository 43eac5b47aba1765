// LoopServerTest: the gtest fixture of the trainer-library tests that run EpochLoops against a
// real in-process samplerd over real gRPC (loopback, port 0): a server started per test, one
// SamplerClient to it, and helpers to create a loss-policy job and a loop. A test suite that
// needs other server options overrides ServerOptions().
#ifndef SAMPLERD_TESTS_LOOP_SERVER_TEST_BASE_H_
#define SAMPLERD_TESTS_LOOP_SERVER_TEST_BASE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server_options.h"

namespace samplerd {

class LoopServerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSamples = 6000;

  // The server's options (default: testutil::LoopbackTestOptions()).
  virtual Options ServerOptions() const { return testutil::LoopbackTestOptions(); }

  void SetUp() override {
    auto server = Server::Create(ServerOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = SamplerClient::Create(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // A job of kSamples samples, world_size ranks, seed 11, the loss policy.
  void CreateJob(const std::string& name, uint32_t world_size) {
    v1::JobSpec spec;
    spec.set_num_samples(kSamples);
    spec.set_world_size(world_size);
    spec.set_seed(11);
    spec.mutable_policy()->set_loss(v1::LOSS);
    auto job = client_->CreateJob(name, spec);
    ASSERT_TRUE(job.ok()) << job.status();
  }

  // A loop of `rank`, or null (with a test failure) when EpochLoop::Create refuses it.
  std::unique_ptr<EpochLoop> NewLoop(const std::string& job, uint32_t rank, uint32_t world_size,
                                     EpochLoopOptions options = {}) {
    auto loop = EpochLoop::Create(client_, job, rank, world_size, options);
    EXPECT_TRUE(loop.ok()) << loop.status();
    return loop.ok() ? *std::move(loop) : nullptr;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<SamplerClient> client_;
};

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_LOOP_SERVER_TEST_BASE_H_
