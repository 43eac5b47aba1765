#include "server/stream_budget.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/retry_signal.h"

namespace samplerd {

StreamBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

StreamBudget::Reservation& StreamBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StreamBudget::Reservation::~Reservation() { Release(); }

void StreamBudget::Reservation::Release() {
  if (budget_ != nullptr) budget_->Give(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<StreamBudget::Reservation> StreamBudget::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  // in_use_ <= limit_ always, so the subtraction cannot wrap.
  if (bytes > limit_) {  // Never fits, whatever the other calls do: no "retry later".
    return absl::ResourceExhaustedError(absl::StrCat(
        "stream buffer budget: this stream needs ", bytes,
        " bytes for its chunks, more than the ", limit_,
        " bytes that all open StreamShard calls together may hold (--max_stream_buffer_bytes); "
        "ask for a smaller max_chunk_size"));
  }
  if (bytes > limit_ - in_use_) {
    return WithRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat(
            "stream buffer budget: this stream needs ", bytes, " bytes for its chunks, but ",
            in_use_, " of the ", limit_,
            " bytes that all open StreamShard calls may hold (--max_stream_buffer_bytes) are in "
            "use; retry later, or ask for a smaller max_chunk_size")),
        kStreamBudgetRetryAfter);
  }
  in_use_ += bytes;
  return Reservation(this, bytes);
}

uint64_t StreamBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

void StreamBudget::Give(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_ -= bytes;
}

}  // namespace samplerd
