#include "proto/loss_pairs.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
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

}  // namespace

absl::Status ValidateLossPairs(absl::Span<const uint64_t> indices, absl::Span<const float> losses,
                               uint64_t num_samples) {
  if (indices.size() != losses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices: ", indices.size(), " entries but losses: ", losses.size()));
  }
  uint64_t max_index = 0;
  for (uint64_t index : indices) max_index = std::max(max_index, index);
  bool bad_loss = false;
  // NaN fails both comparisons; -0.0 passes (finite and >= 0).
  for (float loss : losses) bad_loss |= !(loss >= 0.0f && loss <= FLT_MAX);
  if ((indices.empty() || max_index < num_samples) && !bad_loss) return absl::OkStatus();
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
