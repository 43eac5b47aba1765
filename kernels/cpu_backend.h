// The CPU ComputeBackend (compute_backend.h): multithreaded, vectorised where the CPU allows,
// and bit-identical for any thread count and SIMD level (docs/SAMPLING.md). A mixture job's
// window is mixture::PlanWindowInto (kernels/mixture/window.h) on the backend's threads.
//
// Its state lives in host memory: weights as a shared std::vector<float> (ToHost hands out that
// vector, no copy) with their summary computed when they are made; loss statistics as a
// LossTable (loss_table.h). It takes back the objects any CPU backend made (they are all host
// memory), and refuses another backend's with INVALID_ARGUMENT.
#ifndef SAMPLERD_KERNELS_CPU_BACKEND_H_
#define SAMPLERD_KERNELS_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/compute_backend.h"

namespace samplerd {

// The CPU backend with `num_threads` worker threads (0: hardware concurrency).
std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads = 0);

// The CPU backend's weight recompute on host arrays: what its RecomputeWeights runs on the
// vectors its objects hold, for callers that hold plain vectors (tests, benchmarks, comparisons
// with another backend), on `num_threads` threads (0: hardware concurrency).
//   base:    N base weights, or empty for uniform.
//   current: W_e, N entries, or empty for all ones. Only the multiplicative policy reads it.
//   stats:   N loss statistics.
//   out:     N entries, W_{e+1} (mean 1); may alias `current`. With LossWeightKind::kNone: the
//            base weights (ones for uniform).
//   irreducible: REDUCIBLE_LOSS's N irreducible losses (checked here: ValidateIrreducibleLosses);
//            empty for the other policies.
// Unlike weights made by a backend, base and current are not known to be valid here: their
// values are checked too. INVALID_ARGUMENT, with `out` unchanged, for out.size() == 0, a base,
// current or stats of another size than `out` ("base: 2 values for num_samples 3"), a weight
// not finite and >= 0 ("base[1] = -2"), a bad EMA ("stats[2].ema_loss = -1"), or an all-zero
// base (or current, for the multiplicative policy).
absl::Status RecomputeWeightsOnHost(int num_threads, const WeightPolicyParams& policy,
                                    uint64_t closed_epoch, absl::Span<const float> base,
                                    absl::Span<const float> current,
                                    absl::Span<const SampleLossStats> stats, absl::Span<float> out,
                                    absl::Span<const float> irreducible = {});

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CPU_BACKEND_H_
