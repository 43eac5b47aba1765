#include "examples/cpp/balanced_accuracy.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace samplerd {
namespace examples {

absl::StatusOr<ClassRecalls> BalancedAccuracy(absl::Span<const uint32_t> predictions,
                                              absl::Span<const uint32_t> labels, int num_classes) {
  if (num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_classes must be >= 1, got ", num_classes));
  }
  if (predictions.size() != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("predictions has ", predictions.size(),
                                                   " entries but labels has ", labels.size()));
  }
  if (labels.empty()) return absl::InvalidArgumentError("labels is empty");
  std::vector<uint64_t> total(num_classes, 0), correct(num_classes, 0);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= static_cast<uint32_t>(num_classes)) {
      return absl::InvalidArgumentError(absl::StrCat("labels[", i, "] = ", labels[i],
                                                     " is not below num_classes = ", num_classes));
    }
    if (predictions[i] >= static_cast<uint32_t>(num_classes)) {
      return absl::InvalidArgumentError(absl::StrCat("predictions[", i, "] = ", predictions[i],
                                                     " is not below num_classes = ", num_classes));
    }
    ++total[labels[i]];
    if (predictions[i] == labels[i]) ++correct[labels[i]];
  }
  ClassRecalls result;
  result.recall.resize(num_classes);
  double sum = 0.0;
  int present = 0;
  for (int c = 0; c < num_classes; ++c) {
    if (total[c] == 0) {
      result.recall[c] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    result.recall[c] = static_cast<double>(correct[c]) / static_cast<double>(total[c]);
    sum += result.recall[c];
    ++present;
  }
  result.balanced_accuracy = sum / present;
  return result;
}

}  // namespace examples
}  // namespace samplerd
