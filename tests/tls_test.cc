// TLS, mutual TLS and bearer tokens between the C++ client and a real in-process server over
// real gRPC, with certificates made by openssl for each test (tests/make_test_certs.sh).
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_certs.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdminToken[] = "admin-0123456789abcdef0123456789";
constexpr char kTrainToken[] = "train-0123456789abcdef0123456789";

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testutil::MakeTestCerts(dir_.path()));
    unsetenv("SAMPLERD_CA");
    unsetenv("SAMPLERD_CLIENT_CERT");
    unsetenv("SAMPLERD_CLIENT_KEY");
    unsetenv("SAMPLERD_TOKEN");
  }

  std::string Cert(const std::string& name) { return testutil::CertPath(dir_.path(), name); }
  std::string Key(const std::string& name) { return testutil::KeyPath(dir_.path(), name); }

  // A TLS server with `server_cert` (from make_test_certs.sh); mutual TLS if `client_ca` is set.
  std::unique_ptr<Server> StartServer(const std::string& server_cert, const std::string& client_ca,
                                      const std::string& tokens_file = "") {
    Options options;
    options.port = 0;
    options.tls_cert = Cert(server_cert);
    options.tls_key = Key(server_cert);
    if (!client_ca.empty()) options.tls_client_ca = Cert(client_ca);
    options.auth_tokens_file = tokens_file;
    auto server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // Client options trusting `root_ca`, presenting `client` (if not empty); no retries, so that a
  // failed handshake fails the call at once.
  ClientOptions Trusting(const std::string& root_ca, const std::string& client = "") {
    ClientOptions options;
    options.max_retries = 0;
    options.timeout = absl::Seconds(10);
    options.root_certificates = Cert(root_ca);
    if (!client.empty()) {
      options.client_cert = Cert(client);
      options.client_key = Key(client);
    }
    return options;
  }

  // The status of a ListJobs from a client at `address` with `options`.
  absl::Status ListJobs(const std::string& address, const ClientOptions& options) {
    auto client = SamplerClient::Create(address, options);
    if (!client.ok()) return client.status();
    return (*client)->ListJobs().status();
  }

  testutil::TestDir dir_;
};

TEST_F(TlsTest, ATrustedServerIsReachedAndAnUntrustedOneIsNot) {
  auto server = StartServer("server", "");
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(ListJobs(server->address(), Trusting("ca")).ok());
  EXPECT_TRUE(ListJobs(absl::StrCat("localhost:", server->port()), Trusting("ca")).ok());
  // The server's certificate is not from the CA the client trusts.
  EXPECT_EQ(ListJobs(server->address(), Trusting("other_ca")).code(),
            absl::StatusCode::kUnavailable);
  // A plaintext client cannot talk to a TLS port.
  ClientOptions plaintext;
  plaintext.max_retries = 0;
  EXPECT_EQ(ListJobs(server->address(), plaintext).code(), absl::StatusCode::kUnavailable);

  auto impostor = StartServer("other_server", "");
  ASSERT_NE(impostor, nullptr);
  EXPECT_EQ(ListJobs(impostor->address(), Trusting("ca")).code(), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  auto server = StartServer("server", "ca");
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(ListJobs(server->address(), Trusting("ca", "client")).ok());
  // No client certificate, or one from a CA the server does not trust: the handshake fails.
  EXPECT_EQ(ListJobs(server->address(), Trusting("ca")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ListJobs(server->address(), Trusting("ca", "other_client")).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, TheClientSendsItsTokenFromOptionsOrTheEnvironment) {
  const std::string tokens = dir_.path() + "/tokens";
  testutil::WriteBytes(tokens, absl::StrCat(kAdminToken, " admin\n", kTrainToken, " jobs=train\n"));
  auto server = StartServer("server", "ca", tokens);
  ASSERT_NE(server, nullptr);
  ClientOptions options = Trusting("ca", "client");
  EXPECT_EQ(ListJobs(server->address(), options).code(), absl::StatusCode::kUnauthenticated);

  options.token = kTrainToken;
  auto train = *SamplerClient::Create(server->address(), options);
  v1::JobSpec spec;
  spec.set_num_samples(1000);
  spec.set_world_size(1);
  spec.mutable_policy()->set_base(v1::STATIC);
  // A job token creates and uses its own job...
  ASSERT_TRUE(train->CreateJob("train", spec).ok());
  absl::Status uploaded = train->UploadWeights("train", std::vector<float>(1000, 1.0f));
  ASSERT_TRUE(uploaded.ok()) << uploaded;
  auto shard = train->ReadShard("train", 0, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->size(), 1000u);
  v1::LossBatch batch;
  batch.set_job("train");
  batch.add_indices((*shard)[0]);
  batch.add_losses(0.5f);
  batch.add_positions(0);
  EXPECT_TRUE(train->ReportLosses({batch}).ok());
  EXPECT_TRUE(train->EndEpoch("train", 0, 0).ok());
  // ...but no other job, and no server-wide call; the denial names the job, never the token.
  absl::Status other = train->CreateJob("eval", spec).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(other.message()),
              AllOf(HasSubstr("job = \"eval\""), Not(HasSubstr(kTrainToken))));
  batch.set_job("eval");
  EXPECT_EQ(train->ReportLosses({batch}).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(train->ListJobs().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(train->DeleteJob("train").code(), absl::StatusCode::kPermissionDenied);

  // The admin token, from SAMPLERD_TOKEN when the option is empty.
  setenv("SAMPLERD_TOKEN", kAdminToken, 1);
  options.token.clear();
  auto admin = *SamplerClient::Create(server->address(), options);
  unsetenv("SAMPLERD_TOKEN");
  auto jobs = admin->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 1u);
  EXPECT_TRUE(admin->DeleteJob("train").ok());
}

TEST_F(TlsTest, BadClientSecuritySettingsAreNamed) {
  ClientOptions options = Trusting("ca", "client");
  options.client_key.clear();
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              HasSubstr("client_cert = \"" + Cert("client") + "\" without client_key"));
  options = Trusting("ca");
  options.root_certificates = dir_.path() + "/missing.pem";
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              HasSubstr("root_certificates = \"" + dir_.path() + "/missing.pem\": cannot open"));
  options = Trusting("ca");
  options.root_certificates = dir_.path() + "/tokens-not-pem";
  testutil::WriteBytes(options.root_certificates, "not a certificate");
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              HasSubstr("not PEM"));
  options = ClientOptions();
  options.token = "two words";
  EXPECT_THAT(std::string(SamplerClient::Create("127.0.0.1:1", options).status().message()),
              AllOf(HasSubstr("token: must be printable ASCII"), Not(HasSubstr("two words"))));
}

}  // namespace
}  // namespace samplerd
