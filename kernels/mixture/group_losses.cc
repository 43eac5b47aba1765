#include "kernels/mixture/group_losses.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/exact_sum.h"
#include "kernels/mixture/window_math.h"

namespace samplerd {
namespace mixture {
namespace {

constexpr double kFixedUnit = 4294967296.0;  // 2^32: q(x) = floor(x 2^32).

}  // namespace

absl::Status GroupLosses::Check(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                                absl::Span<const float> losses) {
  if (indices.size() != losses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("losses: ", losses.size(), " losses for ", indices.size(), " indices"));
  }
  // Every pair is checked before any is added: nothing changes on error.
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= layout.total()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", i, "] = ", indices[i], ": not below the job's ", layout.total(), " samples"));
    }
    const double x = losses[i];
    if (!std::isfinite(x) || x < 0 || x >= kMaxGroupLoss) {
      return absl::InvalidArgumentError(
          absl::StrCat("losses[", i, "] = ", x, " (index ", indices[i],
                       "): a mixture job's losses are finite, >= 0 and below 2^32"));
    }
  }
  return absl::OkStatus();
}

absl::Status GroupLosses::Add(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                              absl::Span<const float> losses) {
  if (absl::Status s = Check(layout, indices, losses); !s.ok()) return s;
  AddChecked(layout, indices, losses);
  return absl::OkStatus();
}

void GroupLosses::AddChecked(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                             absl::Span<const float> losses) {
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint32_t k = layout.GroupOf(indices[i]);
    // x 2^32 is exact (a power-of-two scaling) and below 2^64; the conversion truncates.
    sums_[k] += static_cast<uint64_t>(static_cast<double>(losses[i]) * kFixedUnit);
    ++counts_[k];
  }
}

void GroupLosses::Merge(const GroupLosses& other) {
  for (uint32_t k = 0; k < groups(); ++k) {
    counts_[k] += other.counts_[k];
    sums_[k] += other.sums_[k];
  }
}

double GroupLosses::Mean(uint32_t k) const {
  return exact_sum::RoundToDouble(sums_[k]) / kFixedUnit / static_cast<double>(counts_[k]);
}

}  // namespace mixture
}  // namespace samplerd
