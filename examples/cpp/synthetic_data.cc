#include "examples/cpp/synthetic_data.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "examples/cpp/mlp.h"

namespace samplerd {
namespace examples {
namespace {

// Standard normal draws by Box-Muller over std::mt19937_64, whose output the standard fixes
// (std::normal_distribution's algorithm is left to the library, so its values could differ
// between the build machine and the GPU machine's toolchain).
class Normal {
 public:
  explicit Normal(uint64_t seed) : engine_(seed) {}

  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1]: log(u1) is finite.
    const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * M_PI * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

absl::Status ValidateSpec(const DatasetSpec& spec) {
  if (spec.classes < 2 || spec.classes > kMaxClasses) {
    return absl::InvalidArgumentError(
        absl::StrCat("classes must be in [2, ", kMaxClasses, "], got ", spec.classes));
  }
  if (spec.features < 1) {
    return absl::InvalidArgumentError(absl::StrCat("features must be >= 1, got ", spec.features));
  }
  if (spec.majority < 1) {
    return absl::InvalidArgumentError(absl::StrCat("majority must be >= 1, got ", spec.majority));
  }
  if (!std::isfinite(spec.imbalance) || spec.imbalance < 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("imbalance must be a finite number >= 1, got ", spec.imbalance));
  }
  if (!std::isfinite(spec.separation) || spec.separation <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("separation must be a finite number > 0, got ", spec.separation));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ImbalancedClassCounts(const DatasetSpec& spec) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  std::vector<uint64_t> counts(spec.classes);
  for (int c = 0; c < spec.classes; ++c) {
    const double share = std::pow(spec.imbalance, -static_cast<double>(c) / (spec.classes - 1));
    counts[c] = std::max<uint64_t>(1, std::llround(static_cast<double>(spec.majority) * share));
  }
  return counts;
}

absl::StatusOr<Dataset> MakeDataset(const DatasetSpec& spec, const std::vector<uint64_t>& counts,
                                    uint64_t noise_seed) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (counts.size() != static_cast<size_t>(spec.classes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("counts has ", counts.size(), " entries, expected classes = ", spec.classes));
  }
  // Class means: Gaussian directions scaled to length `separation`.
  Normal mean_rng(spec.seed);
  std::vector<double> means(static_cast<size_t>(spec.classes) * spec.features);
  for (int c = 0; c < spec.classes; ++c) {
    double norm2 = 0.0;
    for (int f = 0; f < spec.features; ++f) {
      const double v = mean_rng.Next();
      means[c * spec.features + f] = v;
      norm2 += v * v;
    }
    const double scale = spec.separation / std::sqrt(norm2);
    for (int f = 0; f < spec.features; ++f) means[c * spec.features + f] *= scale;
  }

  Dataset data;
  data.features = spec.features;
  data.classes = spec.classes;
  data.class_counts = counts;
  uint64_t total = 0;
  for (uint64_t n : counts) total += n;
  data.x.reserve(total * spec.features);
  data.y.reserve(total);
  Normal noise(noise_seed);
  for (int c = 0; c < spec.classes; ++c) {
    for (uint64_t i = 0; i < counts[c]; ++i) {
      for (int f = 0; f < spec.features; ++f) {
        data.x.push_back(static_cast<float>(means[c * spec.features + f] + noise.Next()));
      }
      data.y.push_back(static_cast<uint32_t>(c));
    }
  }
  return data;
}

}  // namespace examples
}  // namespace samplerd
