#include "proto/loss_pairs.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

// An index as a trainer wrote it: device indices are int64, so a negative one reads as a huge
// uint64 here; show both.
std::string IndexText(uint64_t index) {
  if (index <= static_cast<uint64_t>(INT64_MAX)) return absl::StrCat(index);
  return absl::StrCat(index, " (", static_cast<int64_t>(index), " as int64)");
}

// Whether every pair may be valid: false for any bad pair, and for good ones only if
// num_samples > 2^63 (beyond any job), which the exact search then clears. Branch-free, in
// blocks of a fixed size that GCC vectorises at -O2 (whose cost model leaves loops of unknown
// length scalar): ~3x faster than a max and float compares at 512 pairs, the cost of every
// LossReporter::Report and of the server's batch check.
bool MayBeValid(const uint64_t* indices, const float* losses, size_t n, uint64_t num_samples) {
  // The top bit of index | (num_samples - 1 - index) is set if index >= num_samples: for an
  // index < 2^63 and num_samples <= 2^63 the difference wraps to >= 2^63, and an index >= 2^63
  // sets it itself (num_samples 0 wraps too: every index is outside).
  uint64_t outside = 0;
  // A float is finite and >= 0 iff its bits are below 0x7f800000 (sign clear, exponent not all
  // ones), or it is -0.0 (0x80000000); NaN, infinities and negatives are not.
  uint32_t bad_loss = 0;
  const auto check = [&](size_t k) {
    outside |= indices[k] | (num_samples - 1 - indices[k]);
    uint32_t bits;
    std::memcpy(&bits, &losses[k], sizeof bits);
    bad_loss |=
        static_cast<uint32_t>(bits >= 0x7f800000u) & static_cast<uint32_t>(bits != 0x80000000u);
  };
  constexpr size_t kBlock = 16;
  size_t k = 0;
  for (; k + kBlock <= n; k += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) check(k + j);
  }
  for (; k < n; ++k) check(k);
  return (outside >> 63) == 0 && bad_loss == 0;
}

}  // namespace

absl::Status ValidateLossPairs(absl::Span<const uint64_t> indices, absl::Span<const float> losses,
                               uint64_t num_samples) {
  if (indices.size() != losses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices: ", indices.size(), " entries but losses: ", losses.size()));
  }
  if (MayBeValid(indices.data(), losses.data(), indices.size(), num_samples)) {
    return absl::OkStatus();
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k] >= num_samples) {
      return absl::InvalidArgumentError(absl::StrCat("indices[", k, "] = ", IndexText(indices[k]),
                                                     " is outside [0, num_samples = ", num_samples,
                                                     ")"));
    }
    if (!(std::isfinite(losses[k]) && losses[k] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("losses[", k, "] = ", losses[k], ": losses must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace samplerd
