// Balanced accuracy (the mean of the per-class recalls) of a classifier's predictions: the
// measure the trainer example compares its runs by, since on imbalanced data plain accuracy
// rewards predicting the majority class.
#ifndef SAMPLERD_EXAMPLES_CPP_BALANCED_ACCURACY_H_
#define SAMPLERD_EXAMPLES_CPP_BALANCED_ACCURACY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace samplerd {
namespace examples {

struct ClassRecalls {
  // recall[c] = correct predictions of class c / samples of class c; NaN for a class with no
  // sample in `labels`.
  std::vector<double> recall;
  // Mean of the recalls of the classes present in `labels`.
  double balanced_accuracy = 0.0;
};

// INVALID_ARGUMENT naming the field for: num_classes < 1, predictions and labels of different
// lengths, no labels, a label or prediction >= num_classes (with its position and value).
absl::StatusOr<ClassRecalls> BalancedAccuracy(absl::Span<const uint32_t> predictions,
                                              absl::Span<const uint32_t> labels, int num_classes);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_BALANCED_ACCURACY_H_
