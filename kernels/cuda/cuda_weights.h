// CudaWeights: BackendWeights in device memory (N floats), made by the CUDA backend
// (cuda_backend.h) from host weights or from a recompute on the device. Immutable; its summary
// is computed on the device when it is made (gpu::SummarizeWeights: the CPU's bits).
//
// Thread-safe: concurrent readers (the planner, ToHost, importance weights) each use their own
// lane; the memory is freed when the last shared_ptr goes.
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_WEIGHTS_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_resources.h"

namespace samplerd {
namespace cuda {

class CudaWeights final : public BackendWeights, public std::enable_shared_from_this<CudaWeights> {
 public:
  // Copies `weights` (valid: the caller checked them with ValidateWeights) to the device.
  static absl::StatusOr<std::shared_ptr<CudaWeights>> Upload(
      std::shared_ptr<const CudaContext> context, const std::vector<float>& weights);

  // Takes `data`: n weights computed on `lane`'s stream (not necessarily complete yet), summarises
  // them on the same stream.
  static absl::StatusOr<std::shared_ptr<CudaWeights>> Adopt(
      std::shared_ptr<const CudaContext> context, DeviceBuffer data, uint64_t n, Lane& lane);

  uint64_t size() const override { return n_; }
  const WeightSummary& summary() const override { return summary_; }
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> ToHost() const override;

  // The n weights in device memory.
  const float* device_data() const { return data_.as<const float>(); }

 private:
  CudaWeights(std::shared_ptr<const CudaContext> context, DeviceBuffer data, uint64_t n,
              const WeightSummary& summary)
      : context_(std::move(context)), data_(std::move(data)), n_(n), summary_(summary) {}

  const std::shared_ptr<const CudaContext> context_;
  DeviceBuffer data_;
  const uint64_t n_;
  const WeightSummary summary_;
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_WEIGHTS_H_
