// The trainer example's synthetic, class-imbalanced classification data: one Gaussian blob per
// class in `features` dimensions, the class sizes falling geometrically from `majority` (class 0)
// to majority / imbalance (the last class). Host code, deterministic for a seed.
#ifndef SAMPLERD_EXAMPLES_CPP_SYNTHETIC_DATA_H_
#define SAMPLERD_EXAMPLES_CPP_SYNTHETIC_DATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace samplerd {
namespace examples {

struct DatasetSpec {
  int features = 32;
  int classes = 4;             // 2 to kMaxClasses (mlp.h).
  uint64_t majority = 100000;  // Samples of class 0.
  double imbalance = 100.0;    // Class 0 over the last class, >= 1.
  // Distance of each class mean from the origin; the noise has unit variance per feature, so
  // smaller means more overlap between the classes (a harder task).
  double separation = 2.0;
  // Seed of the class means: a training and a test set made from one spec share them.
  uint64_t seed = 7;
};

struct Dataset {
  int features = 0;
  int classes = 0;
  std::vector<float> x;     // size() x features, row-major.
  std::vector<uint32_t> y;  // Labels in [0, classes).
  std::vector<uint64_t> class_counts;

  uint64_t size() const { return y.size(); }
};

// The training set's class sizes: round(majority * imbalance^(-c / (classes - 1))), at least 1.
// INVALID_ARGUMENT naming the field and value for classes outside [2, kMaxClasses],
// features < 1, majority < 1, imbalance < 1 (or not finite), separation <= 0 (or not finite).
absl::StatusOr<std::vector<uint64_t>> ImbalancedClassCounts(const DatasetSpec& spec);

// `counts[c]` samples of class c, for each c (counts.size() == spec.classes), rows grouped by
// class. The class means come from spec.seed, the noise from `noise_seed` (use different ones
// for the training and the test set). Errors as ImbalancedClassCounts, and INVALID_ARGUMENT for
// counts of the wrong size.
absl::StatusOr<Dataset> MakeDataset(const DatasetSpec& spec, const std::vector<uint64_t>& counts,
                                    uint64_t noise_seed);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_SYNTHETIC_DATA_H_
