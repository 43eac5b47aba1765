#include "proto/status_util.h"

#include <string>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(StatusUtilTest, CodesAndMessagesSurviveTheRoundTrip) {
  const absl::Status cases[] = {
      absl::InvalidArgumentError("losses[3] = nan: losses must be finite and >= 0"),
      absl::NotFoundError("job = \"x\" does not exist"),
      absl::AlreadyExistsError("a"),
      absl::FailedPreconditionError("b"),
      absl::ResourceExhaustedError("c"),
      absl::DeadlineExceededError("d"),
      absl::UnavailableError("e"),
      absl::CancelledError("f"),
      absl::InternalError("g"),
      absl::UnimplementedError("h"),
  };
  for (const absl::Status& s : cases) {
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(s.code()));
    EXPECT_EQ(g.error_message(), s.message());
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusUtilTest, LongMessagesAreCapped) {
  const std::string huge(100000, 'x');
  const grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError(huge));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message().size(), kMaxErrorMessageBytes);
  EXPECT_EQ(g.error_message().substr(kMaxErrorMessageBytes - 3), "...");
  const std::string exact(kMaxErrorMessageBytes, 'y');
  EXPECT_EQ(ToGrpcStatus(absl::InternalError(exact)).error_message(), exact);
}

TEST(StatusUtilTest, CappingNeverSplitsAUtf8Character) {
  // "é" is two bytes, so a cut after kMaxErrorMessageBytes - 3 = 1021 bytes splits one.
  std::string message;
  for (int i = 0; i < 1000; ++i) message += "\xC3\xA9";
  const std::string capped = ToGrpcStatus(absl::InvalidArgumentError(message)).error_message();
  ASSERT_LE(capped.size(), kMaxErrorMessageBytes);
  ASSERT_GE(capped.size(), kMaxErrorMessageBytes - 4);
  const std::string body = capped.substr(0, capped.size() - 3);
  EXPECT_EQ(body.size() % 2, 0u);  // Whole two-byte characters only.
  EXPECT_EQ(body, message.substr(0, body.size()));
  EXPECT_EQ(capped.substr(capped.size() - 3), "...");
}

}  // namespace
}  // namespace samplerd
