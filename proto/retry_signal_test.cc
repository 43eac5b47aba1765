#include "proto/retry_signal.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

using Trailers = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(RetrySignalTest, AMarkedStatusKeepsItsCodeAndMessageAndCarriesTheDelay) {
  const absl::Status plain = absl::ResourceExhaustedError("stream buffer budget: ...");
  EXPECT_FALSE(RetryAfter(plain).has_value());
  const absl::Status marked = WithRetryAfter(plain, absl::Milliseconds(250));
  EXPECT_EQ(marked.code(), plain.code());
  EXPECT_EQ(marked.message(), plain.message());
  ASSERT_TRUE(RetryAfter(marked).has_value());
  EXPECT_EQ(*RetryAfter(marked), absl::Milliseconds(250));
  EXPECT_EQ(*RetryAfter(WithRetryAfter(plain, -absl::Seconds(1))), absl::ZeroDuration());
}

TEST(RetrySignalTest, TheClientReadsAWholeNumberOfMillisecondsAndNothingElse) {
  const std::string key = kRetryAfterMsKey;
  const std::string good = "100", negative = "-5", words = "later", huge = "4294967296";
  const std::string other_key = "samplerd-something";
  EXPECT_FALSE(RetryAfterFromTrailers(Trailers{}).has_value());
  EXPECT_FALSE(RetryAfterFromTrailers(Trailers{{other_key, good}}).has_value());
  ASSERT_TRUE(RetryAfterFromTrailers(Trailers{{key, good}}).has_value());
  EXPECT_EQ(*RetryAfterFromTrailers(Trailers{{key, good}}), absl::Milliseconds(100));
  EXPECT_FALSE(RetryAfterFromTrailers(Trailers{{key, negative}}).has_value());
  EXPECT_FALSE(RetryAfterFromTrailers(Trailers{{key, words}}).has_value());
  EXPECT_FALSE(RetryAfterFromTrailers(Trailers{{key, huge}}).has_value());
}

}  // namespace
}  // namespace samplerd
