#include "kernels/cuda/cuda_weights.h"

#include <utility>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_weights.h"

namespace samplerd {
namespace cuda {

absl::StatusOr<std::shared_ptr<CudaWeights>> CudaWeights::Upload(
    std::shared_ptr<const CudaContext> context, const std::vector<float>& weights) {
  SAMPLERD_RETURN_IF_ERROR(context->Enter());
  absl::StatusOr<CudaContext::LaneLease> lane = context->AcquireLane();
  if (!lane.ok()) return lane.status();
  const uint64_t n = weights.size();
  DeviceBuffer data;
  SAMPLERD_RETURN_IF_ERROR(data.Allocate(n * sizeof(float), (*lane)->stream(), "the weights"));
  SAMPLERD_RETURN_IF_ERROR(
      (*lane)->CopyToDevice(data.as<void>(), weights.data(), n * sizeof(float), "the weights"));
  return Adopt(std::move(context), std::move(data), n, **lane);
}

absl::StatusOr<std::shared_ptr<CudaWeights>> CudaWeights::Adopt(
    std::shared_ptr<const CudaContext> context, DeviceBuffer data, uint64_t n, Lane& lane) {
  gpu::WeightSummaryValues values;
  // Synchronises the stream to read the result: the weights are complete after it.
  SAMPLERD_RETURN_IF_CUDA_ERROR(
      gpu::SummarizeWeights(data.as<const float>(), n, &values, lane.stream()), "SummarizeWeights");
  // The stream goes back to its pool; the weights outlive this call.
  data.set_free_stream(cudaStreamPerThread);
  WeightSummary summary;
  summary.min = values.min;
  summary.max = values.max;
  summary.mean = values.mean;
  summary.effective_sample_size = values.effective_sample_size;
  summary.zero_count = values.zero_count;
  return std::shared_ptr<CudaWeights>(
      new CudaWeights(std::move(context), std::move(data), n, summary));
}

absl::StatusOr<std::shared_ptr<const std::vector<float>>> CudaWeights::ToHost() const {
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::to_host);
  SAMPLERD_RETURN_IF_ERROR(context_->Enter());
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  auto host = std::make_shared<std::vector<float>>(n_);
  SAMPLERD_RETURN_IF_ERROR(
      (*lane)->CopyToHost(host->data(), device_data(), n_ * sizeof(float), "the weights"));
  return std::shared_ptr<const std::vector<float>>(std::move(host));
}

}  // namespace cuda
}  // namespace samplerd
