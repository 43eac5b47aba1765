// Inputs and hashes of the golden tests shared by the CPU backend's tests, the CUDA backend's and
// the GPU identity tests: reproducible weights, loss statistics that reach every branch of the
// recompute, and the recompute's golden hashes (one table: a change of the definition re-pins it
// once, for every backend). Plain C++ (no Abseil): the GPU machine builds identity_test with nvcc
// alone.
#ifndef SAMPLERD_KERNELS_TESTING_WEIGHT_CASES_H_
#define SAMPLERD_KERNELS_TESTING_WEIGHT_CASES_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/loss_stats.h"

namespace samplerd {
namespace testutil {

// n weights from a fixed LCG: 0 with probability zero_share, else uniform in [0.1, 4.1).
inline std::vector<float> RandomWeights(uint64_t n, uint64_t seed, double zero_share = 0.0) {
  std::vector<float> w(n);
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
    w[i] = u < zero_share ? 0.0f : static_cast<float>(0.1 + 4.0 * u);
  }
  return w;
}

// n weights of a pattern that the plan and weight definitions must get right, from a fixed
// seed: "random" (uniform in [0.001, 1.001)), "ties" (1, 2 or 3), "zeros" (about half 0, the
// rest in [0.5, 1.5); the last weight positive, so that some weight is) and "extreme" (powers
// of two from 2^-60 to 2^60: a ratio of 2^120, within kMaxWeightRatio).
inline std::vector<float> PatternWeights(const std::string& kind, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> w(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (kind == "random") {
      w[i] = unit(rng) + 1e-3f;
    } else if (kind == "ties") {
      w[i] = static_cast<float>(1 + rng() % 3);
    } else if (kind == "zeros") {
      w[i] = rng() % 2 == 0 ? 0.0f : unit(rng) + 0.5f;
    } else {  // "extreme"
      w[i] = std::ldexp(1.0f, static_cast<int>(rng() % 121) - 60);
    }
  }
  if (kind == "zeros" && n > 0) w[n - 1] = 1.0f;
  return w;
}

// Loss statistics that reach every branch of the recompute: never seen (count 0, last 0, an
// EMA left undefined: NaN), seen in the closed epoch (marker `closed_marker`) or in the one
// before it, EMAs of 0, -0, subnormal, ordinary and near the float maximum.
inline std::vector<SampleLossStats> VariedStats(uint64_t n, uint64_t seed,
                                                uint16_t closed_marker = EpochMarker(5)) {
  const uint16_t earlier = closed_marker == 1 ? 2 : static_cast<uint16_t>(closed_marker - 1);
  const std::vector<float> u = RandomWeights(n, seed, 0.0);  // [0.1, 4.1)
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(u[i] * 1000) % 16;
    SampleLossStats& s = stats[i];
    if (kind < 3) {
      s = {std::numeric_limits<float>::quiet_NaN(), 0, 0};
      continue;
    }
    s.count = static_cast<uint16_t>(1 + kind);
    s.last_epoch = kind % 2 ? closed_marker : earlier;
    switch (kind) {
      case 3:
        s.ema_loss = 0.0f;
        break;
      case 4:
        s.ema_loss = -0.0f;
        break;
      case 5:
        s.ema_loss = 1e-40f;
        break;
      case 6:
        s.ema_loss = u[i] * 1e30f;
        break;
      default:
        s.ema_loss = (u[i] - 0.1f) * (u[i] - 0.1f);
        break;
    }
  }
  return stats;
}

// FNV-1a over the little-endian bytes of the indices: the plan hash of the golden tests.
inline uint64_t Fnv1a(const std::vector<uint64_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t x : v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (x >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// FNV-1a over the IEEE bits of the weights: the weight hash of the golden tests.
inline uint64_t Fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    for (int b = 0; b < 4; ++b) {
      h ^= (bits >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Golden hashes (FNV-1a of the weights' bytes) of the recompute after epoch 5, with base weights
// RandomWeights(n, 11, 0.05) if with_base, current weights RandomWeights(n, 12, 0.05) with
// current[0] = 1, and statistics VariedStats(n, 13). kind: 0 none, 1 loss, 2 multiplicative
// (LossWeightKind's order).
struct RecomputeGolden {
  const char* name;
  int kind;
  double alpha, mix, clamp_lo, clamp_hi, eta;
  std::optional<double> prior;  // Unset: the mean EMA of the seen samples.
  bool with_base;  // Base weights (5% zeros); the current weights always have 5% zeros.
  uint64_t n;
  uint64_t hash;
};

inline const std::vector<RecomputeGolden>& RecomputeGoldens() {
  static const std::vector<RecomputeGolden> goldens = {
      {"loss alpha 1", 1, 1.0, 0.0, 0.1, 10, 1, {}, false, 1000, 0xabb432e72b298728ull},
      {"loss alpha 1 n 1", 1, 1.0, 0.0, 0.1, 10, 1, {}, false, 1, 0x2fa183a08531045aull},
      {"loss alpha 0.5 mix base",
       1,
       0.5,
       0.1,
       0.1,
       10,
       1,
       {},
       true,
       200'003,
       0x7aa066777b86cfdaull},
      {"loss alpha 8 prior narrow clamp", 1, 8.0, 0.0, 0.5, 2, 1, 0.3, false, 200'003,
       0xb2c435d4439ed1full},
      {"loss alpha 0 base", 1, 0.0, 0.3, 0.1, 10, 1, {}, true, 70'000, 0x4c80c33b1212b880ull},
      {"loss alpha 0.7 base prior 0", 1, 0.7, 0.0, 0.01, 100, 1, 0.0, true, 131'072,
       0xedf77e3210ffa388ull},
      {"multiplicative", 2, 1, 0, 0.1, 10, 1.0, {}, false, 200'003, 0xd98a68e29267816aull},
      {"multiplicative eta 100 base",
       2,
       1,
       0,
       0.2,
       5,
       100.0,
       {},
       true,
       65'537,
       0x46d2f9ac09ab687cull},
      {"none base", 0, 1, 0, 0.1, 10, 1, {}, true, 70'000, 0x20b62e518accd4full},
      {"none", 0, 1, 0, 0.1, 10, 1, {}, false, 1000, 0x7e4699ac296945c3ull},
  };
  return goldens;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_WEIGHT_CASES_H_
