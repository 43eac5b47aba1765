#include "proto/retry_signal.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace samplerd {
namespace {

// The payload's type URL: private to this file (only the trailer leaves the server).
constexpr absl::string_view kPayloadUrl = "type.samplerd/retry-after-ms";
constexpr int64_t kMaxMs = (int64_t{1} << 31) - 1;

std::optional<absl::Duration> ParseMs(absl::string_view text) {
  int64_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms < 0 || ms > kMaxMs) return std::nullopt;
  return absl::Milliseconds(ms);
}

}  // namespace

absl::Status WithRetryAfter(absl::Status status, absl::Duration after) {
  const int64_t ms = std::min(std::max<int64_t>(absl::ToInt64Milliseconds(after), 0), kMaxMs);
  status.SetPayload(kPayloadUrl, absl::Cord(absl::StrCat(ms)));
  return status;
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayloadUrl);  // absl::optional<absl::Cord>.
  if (!payload.has_value()) return std::nullopt;
  return ParseMs(std::string(*payload));
}

void AddRetryAfterTrailer(const absl::Status& status, grpc::ServerContextBase* context) {
  if (std::optional<absl::Duration> after = RetryAfter(status)) {
    context->AddTrailingMetadata(kRetryAfterMsKey, absl::StrCat(absl::ToInt64Milliseconds(*after)));
  }
}

std::optional<absl::Duration> RetryAfterFromTrailers(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers) {
  auto it = trailers.find(kRetryAfterMsKey);
  if (it == trailers.end()) return std::nullopt;
  return ParseMs(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace samplerd
