#include "kernels/cuda/gpu_presence.h"

#include <cstdio>
#include <string>

namespace samplerd {
namespace gpu {
namespace {

std::string CudaVersion(int version) {
  return "CUDA " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string Gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1u << 30));
  return text;
}

}  // namespace

GpuPresence ClassifyGpuError(cudaError_t error, const char* call, int driver_version,
                             int runtime_version) {
  GpuPresence p;
  const std::string detail = std::string(call) + ": " + cudaGetErrorName(error) + ": " +
                             cudaGetErrorString(error) + " (driver " + CudaVersion(driver_version) +
                             ", runtime " + CudaVersion(runtime_version) + ")";
  switch (error) {
    case cudaErrorInsufficientDriver:
      // The runtime says "insufficient" both when libcuda is missing and when it is too old;
      // the driver's version tells them apart (0: none loaded).
      p.verdict = driver_version == 0 ? GpuVerdict::kNoDriver : GpuVerdict::kDriverTooOld;
      p.message = (driver_version == 0 ? "no NVIDIA driver: " : "NVIDIA driver too old: ") + detail;
      break;
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
      p.verdict = GpuVerdict::kNoDevice;
      p.message = "no CUDA device: " + detail;
      break;
    case cudaErrorMemoryAllocation:
      p.verdict = GpuVerdict::kOutOfMemory;
      p.message = "GPU out of memory: " + detail;
      break;
    default:
      p.verdict = GpuVerdict::kOtherError;
      p.message = "GPU unusable: " + detail;
      break;
  }
  return p;
}

GpuPresence CheckGpu(uint64_t min_free_bytes) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);  // Leaves 0 when no driver is loaded.
  cudaRuntimeGetVersion(&runtime);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return ClassifyGpuError(e, "cudaGetDeviceCount", driver, runtime);
  }
  if (count == 0) return ClassifyGpuError(cudaErrorNoDevice, "cudaGetDeviceCount", driver, runtime);
  cudaDeviceProp prop;
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    return ClassifyGpuError(e, "cudaGetDeviceProperties", driver, runtime);
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess) {
    return ClassifyGpuError(e, "cudaSetDevice(0)", driver, runtime);
  }
  if (const cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return ClassifyGpuError(e, "cudaMemGetInfo", driver, runtime);
  }
  GpuPresence p;
  const std::string where = std::string(prop.name) + " (device 0 of " + std::to_string(count) +
                            ", " + Gib(free_bytes) + " free of " + Gib(total_bytes) + ", driver " +
                            CudaVersion(driver) + ")";
  if (free_bytes < min_free_bytes) {
    p.verdict = GpuVerdict::kOutOfMemory;
    p.message = "GPU out of memory: " + std::to_string(min_free_bytes) + " bytes needed, " +
                std::to_string(free_bytes) + " free on " + where;
    return p;
  }
  p.verdict = GpuVerdict::kUsable;
  p.message = where;
  return p;
}

}  // namespace gpu
}  // namespace samplerd
