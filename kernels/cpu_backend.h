// The CPU ComputeBackend (compute_backend.h): multithreaded, vectorised where the CPU allows,
// and bit-identical for any thread count and SIMD level (docs/SAMPLING.md).
#ifndef SAMPLERD_KERNELS_CPU_BACKEND_H_
#define SAMPLERD_KERNELS_CPU_BACKEND_H_

#include <memory>

#include "kernels/compute_backend.h"

namespace samplerd {

// The CPU backend with `num_threads` worker threads (0: hardware concurrency).
std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads = 0);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CPU_BACKEND_H_
