#include "examples/cpp/mlp_init.h"

#include <cmath>
#include <random>

namespace samplerd {
namespace examples {
namespace {

// Uniform in [-limit, limit) from std::mt19937_64 (whose output the standard fixes, unlike
// std::uniform_real_distribution's mapping).
void FillUniform(std::mt19937_64& engine, double limit, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(engine() >> 11) * 0x1.0p-53;
    out[i] = static_cast<float>((2.0 * u - 1.0) * limit);
  }
}

}  // namespace

std::vector<float> InitialParams(const MlpShape& shape, uint64_t seed) {
  std::vector<float> params(shape.param_count(), 0.0f);
  std::mt19937_64 engine(seed);
  FillUniform(engine, std::sqrt(6.0 / (shape.features + shape.hidden)), params.data() + shape.w1(),
              static_cast<size_t>(shape.features) * shape.hidden);
  FillUniform(engine, std::sqrt(6.0 / (shape.hidden + shape.classes)), params.data() + shape.w2(),
              static_cast<size_t>(shape.hidden) * shape.classes);
  return params;
}

}  // namespace examples
}  // namespace samplerd
