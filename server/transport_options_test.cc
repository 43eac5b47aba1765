#include "server/transport_options.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

TEST(TransportOptionsTest, TheDefaultsAreValid) {
  EXPECT_TRUE(ValidateTransportOptions(TransportOptions()).ok());
}

TEST(TransportOptionsTest, TheDefaultPingPolicyAcceptsTheDefaultClientsPings) {
  EXPECT_LE(TransportOptions().min_client_ping_interval,
            absl::Milliseconds(v1::CLIENT_KEEPALIVE_TIME_MS));
}

TEST(TransportOptionsTest, ANonPositiveDurationIsRefusedNamingTheField) {
  TransportOptions options;
  options.max_connection_idle = absl::ZeroDuration();
  absl::Status s = ValidateTransportOptions(options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_connection_idle = 0: must be > 0"));

  options = TransportOptions();
  options.keepalive_timeout = absl::Milliseconds(-5);
  s = ValidateTransportOptions(options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("keepalive_timeout = -5ms"));
}

TEST(TransportOptionsTest, APingIntervalAboveTheClientsKeepaliveIsRefused) {
  TransportOptions options;
  options.min_client_ping_interval = absl::Seconds(30);
  absl::Status s = ValidateTransportOptions(options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("min_client_ping_interval = 30s"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("keepalive time (10s)"));
}

TEST(TransportOptionsTest, IdleConnectionsMayBeKeptForever) {
  TransportOptions options;
  options.max_connection_idle = absl::InfiniteDuration();
  EXPECT_TRUE(ValidateTransportOptions(options).ok());
}

}  // namespace
}  // namespace samplerd
