// Whether this process can use a GPU, and if not, why: the startup check of a server asked for
// --backend=cuda (or auto). Plain C++ over the CUDA runtime (linked statically, so the answer
// comes from the driver actually installed, not from a libcudart found by chance).
#ifndef SAMPLERD_KERNELS_CUDA_GPU_PRESENCE_H_
#define SAMPLERD_KERNELS_CUDA_GPU_PRESENCE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace samplerd {
namespace gpu {

enum class GpuVerdict {
  kUsable,
  kNoDriver,      // No NVIDIA driver (libcuda) could be loaded.
  kDriverTooOld,  // A driver older than the CUDA runtime this binary was built with.
  kNoDevice,      // A driver, but no CUDA device visible (CUDA_VISIBLE_DEVICES, containers).
  kOutOfMemory,   // Device 0 has less free memory than asked for.
  kOtherError,    // Any other runtime error (the message names it).
};

struct GpuPresence {
  GpuVerdict verdict = GpuVerdict::kOtherError;
  // "NVIDIA H100 80GB HBM3 (device 0 of 1, 79.1 GiB free of 79.6 GiB, driver CUDA 13.0)" when
  // usable; otherwise what is missing, with the runtime's own error name and message, e.g.
  // "no NVIDIA driver: cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is
  // insufficient for CUDA runtime version (driver CUDA 0.0, runtime CUDA 13.0)".
  std::string message;

  bool usable() const { return verdict == GpuVerdict::kUsable; }
};

// Asks the runtime about device 0: present, driver new enough, at least `min_free_bytes` free.
// Creates the device's context (the first call costs up to a second). Thread-safe.
GpuPresence CheckGpu(uint64_t min_free_bytes = 0);

// The verdict for a failed runtime call (pure, for tests): `error` from `call`, the driver's
// CUDA version (cudaDriverGetVersion: 0 when no driver is installed) and the runtime's.
GpuPresence ClassifyGpuError(cudaError_t error, const char* call, int driver_version,
                             int runtime_version);

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_GPU_PRESENCE_H_
