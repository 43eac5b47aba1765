// The model's initial parameters (mlp.h layout), made on the host from a seed: every rank makes
// the same ones, so DDP needs no broadcast, and both runs of the comparison start alike.
#ifndef SAMPLERD_EXAMPLES_CPP_MLP_INIT_H_
#define SAMPLERD_EXAMPLES_CPP_MLP_INIT_H_

#include <cstdint>
#include <vector>

#include "examples/cpp/mlp.h"

namespace samplerd {
namespace examples {

// Weights uniform in +-sqrt(6 / (fan_in + fan_out)) (Glorot), biases zero; param_count() values.
std::vector<float> InitialParams(const MlpShape& shape, uint64_t seed);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_MLP_INIT_H_
