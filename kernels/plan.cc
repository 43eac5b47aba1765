#include "kernels/plan.h"

#include "absl/strings/str_cat.h"
#include "kernels/plan_math.h"

namespace samplerd {

absl::Status ValidatePlanSpec(const PlanSpec& spec) {
  if (spec.num_samples == 0) return absl::InvalidArgumentError("num_samples = 0: must be >= 1");
  if (spec.samples_per_epoch == 0) {
    return absl::InvalidArgumentError("samples_per_epoch = 0: must be >= 1");
  }
  if (!spec.replacement && spec.samples_per_epoch > spec.num_samples) {
    return absl::InvalidArgumentError(absl::StrCat("samples_per_epoch = ", spec.samples_per_epoch,
                                                   " exceeds num_samples = ", spec.num_samples,
                                                   " without replacement"));
  }
  if (!spec.replacement && spec.order == SampleOrder::kWeightedRandom &&
      spec.samples_per_epoch > plan_math::kMaxShuffleInputs) {
    // The shuffle's swap counters (bucket * 2^40 + t / 4) leave 24 bits for the bucket.
    return absl::InvalidArgumentError(absl::StrCat(
        "samples_per_epoch = ", spec.samples_per_epoch, " without replacement: must be <= ",
        plan_math::kMaxShuffleInputs, " (2^34, the largest shuffle of docs/SAMPLING.md)"));
  }
  if (spec.order == SampleOrder::kSequential &&
      (spec.replacement || spec.samples_per_epoch != spec.num_samples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order = SEQUENTIAL needs replacement = false and samples_per_epoch = num_samples; got "
        "replacement = ",
        spec.replacement ? "true" : "false", ", samples_per_epoch = ", spec.samples_per_epoch));
  }
  return absl::OkStatus();
}

}  // namespace samplerd
