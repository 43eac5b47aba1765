#include "server/mixture_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_weights.h"

namespace samplerd {
namespace {

// The kernels' errors name `sizes[k]`, `weights[k]`, `reference_losses[k]`: as fields of the
// spec.
absl::Status InSpec(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MixtureConfig>> MakeMixtureConfig(const v1::MixtureSpec& spec,
                                                                       uint64_t num_samples) {
  const std::vector<uint64_t> sizes(spec.group_sizes().begin(), spec.group_sizes().end());
  absl::StatusOr<mixture::GroupLayout> layout = mixture::GroupLayout::Create(sizes);
  if (!layout.ok()) return InSpec("spec.mixture.group_", layout.status());
  if (num_samples != 0 && num_samples != layout->total()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_samples = ", num_samples, ": the ", layout->groups(),
                     " groups of spec.mixture.group_sizes hold ", layout->total(),
                     " samples (give their sum, or 0)"));
  }
  const uint64_t k_groups = layout->groups();
  std::vector<double> given(spec.group_weights().begin(), spec.group_weights().end());
  if (given.empty()) {  // Proportional to the sizes: every sample equally likely.
    given.assign(sizes.begin(), sizes.end());
  }
  absl::StatusOr<std::vector<double>> weights = mixture::NormalizeWeights(given, k_groups);
  if (!weights.ok()) return InSpec("spec.mixture.group_", weights.status());
  absl::StatusOr<std::vector<uint64_t>> shares = mixture::SharesOf(*weights);
  if (!shares.ok()) return InSpec("spec.mixture.group_", shares.status());
  std::vector<double> reference(spec.reference_losses().begin(), spec.reference_losses().end());
  if (!reference.empty()) {
    if (absl::Status s = mixture::ValidateReferenceLosses(reference, k_groups); !s.ok()) {
      return InSpec("spec.mixture.", s);
    }
  }
  return std::make_shared<const MixtureConfig>(MixtureConfig{
      *std::move(layout), *std::move(weights), *std::move(shares), std::move(reference)});
}

}  // namespace samplerd
