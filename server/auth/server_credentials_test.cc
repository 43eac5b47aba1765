#include "server/auth/server_credentials.h"

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/test_certs.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::CertPath;
using testutil::KeyPath;

class ServerCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(testutil::MakeTestCerts(dir_.path())); }

  // The error of MakeServerCredentials(security): must be INVALID_ARGUMENT.
  std::string ErrorOf(const TransportSecurity& security) {
    auto credentials = MakeServerCredentials(security);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(credentials.status().message());
  }

  std::string Cert(const std::string& name) { return CertPath(dir_.path(), name); }
  std::string Key(const std::string& name) { return KeyPath(dir_.path(), name); }

  testutil::TestDir dir_;
};

TEST_F(ServerCredentialsTest, TlsMutualTlsAndPlaintextWhenAskedFor) {
  EXPECT_TRUE(MakeServerCredentials({false, Cert("server"), Key("server"), ""}).ok());
  EXPECT_TRUE(MakeServerCredentials({false, Cert("server"), Key("server"), Cert("ca")}).ok());
  EXPECT_TRUE(MakeServerCredentials({true, "", "", ""}).ok());
}

// Dates out of range are a warning, not an error (the clients decide); the dates are returned
// for the expiry metric. The certificates are made by openssl with those dates.
TEST_F(ServerCredentialsTest, ReturnsTheLeafCertificatesDatesEvenWhenOutOfRange) {
  CertificateValidity validity;
  ASSERT_TRUE(
      MakeServerCredentials({false, Cert("expired_server"), Key("expired_server"), ""}, &validity)
          .ok());
  EXPECT_EQ(validity.not_before, absl::FromCivil(absl::CivilDay(2020, 1, 1), absl::UTCTimeZone()));
  EXPECT_EQ(validity.not_after, absl::FromCivil(absl::CivilDay(2020, 2, 1), absl::UTCTimeZone()));
  ASSERT_TRUE(
      MakeServerCredentials({false, Cert("future_server"), Key("future_server"), ""}, &validity)
          .ok());
  EXPECT_EQ(validity.not_before, absl::FromCivil(absl::CivilDay(2099, 1, 1), absl::UTCTimeZone()));
  ASSERT_TRUE(MakeServerCredentials({false, Cert("server"), Key("server"), ""}, &validity).ok());
  EXPECT_LT(validity.not_before, absl::Now());
  EXPECT_GT(validity.not_after, absl::Now());
}

TEST_F(ServerCredentialsTest, NeitherOrBothModesAreRefusedNamingTheFlags) {
  EXPECT_THAT(ErrorOf({}), HasSubstr("pass --tls_cert and --tls_key"));
  EXPECT_THAT(ErrorOf({}), HasSubstr("--plaintext"));
  EXPECT_THAT(ErrorOf({false, "", "", Cert("ca")}), HasSubstr("tls_client_ca needs"));
  EXPECT_THAT(ErrorOf({true, Cert("server"), Key("server"), ""}),
              HasSubstr("plaintext = true together with tls_cert"));
  EXPECT_THAT(ErrorOf({true, "", "", Cert("ca")}), HasSubstr("plaintext = true together"));
}

TEST_F(ServerCredentialsTest, EachBadFileIsNamedWithItsFlagAndPath) {
  EXPECT_THAT(ErrorOf({false, Cert("server"), "", ""}),
              HasSubstr("tls_cert = \"" + Cert("server") + "\": given without tls_key"));
  EXPECT_THAT(ErrorOf({false, "", Key("server"), ""}),
              HasSubstr("tls_key = \"" + Key("server") + "\": given without tls_cert"));
  const std::string missing = dir_.path() + "/missing.pem";
  EXPECT_THAT(ErrorOf({false, missing, Key("server"), ""}),
              HasSubstr("tls_cert = \"" + missing + "\": open"));
  EXPECT_THAT(ErrorOf({false, Cert("server"), missing, ""}),
              HasSubstr("tls_key = \"" + missing + "\": open"));
  EXPECT_THAT(ErrorOf({false, Key("server"), Key("server"), ""}),
              HasSubstr("tls_cert = \"" + Key("server") + "\": holds no PEM certificate"));
  EXPECT_THAT(ErrorOf({false, Cert("server"), Cert("server"), ""}),
              HasSubstr("tls_key = \"" + Cert("server") + "\": holds no unencrypted PEM"));
  EXPECT_THAT(ErrorOf({false, Cert("server"), Key("client"), ""}),
              HasSubstr("is not the private key of tls_cert = \"" + Cert("server") + "\""));
  EXPECT_THAT(ErrorOf({false, Cert("server"), Key("server"), Key("ca")}),
              HasSubstr("tls_client_ca = \"" + Key("ca") + "\": holds no PEM certificate"));
  EXPECT_THAT(ErrorOf({false, Cert("server"), Key("server"), missing}),
              HasSubstr("tls_client_ca = \"" + missing + "\": open"));
  // A truncated certificate (a half-copied file) is not a certificate.
  const std::string cut = dir_.path() + "/cut.pem";
  const std::string pem = testutil::ReadBytes(Cert("server"));
  testutil::WriteBytes(cut, pem.substr(0, pem.size() / 2));
  EXPECT_THAT(ErrorOf({false, cut, Key("server"), ""}), HasSubstr("holds no PEM certificate"));
}

}  // namespace
}  // namespace samplerd
