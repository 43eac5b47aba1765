#include "kernels/cuda/cuda_context.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

absl::Status Lane::Create() {
  SAMPLERD_RETURN_IF_ERROR(stream_.Create("a lane"));
  SAMPLERD_RETURN_IF_ERROR(staged_[0].Create("a lane's staging"));
  SAMPLERD_RETURN_IF_ERROR(staged_[1].Create("a lane's staging"));
  return absl::OkStatus();
}

absl::Status Lane::Synchronize(absl::string_view what) {
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_.get()), what);
  return absl::OkStatus();
}

absl::Status Lane::EnsureStaging() {
  for (PinnedBuffer& buffer : staging_) {
    if (buffer.bytes() == 0) {
      SAMPLERD_RETURN_IF_ERROR(
          buffer.Allocate(kStagingBytes, cudaHostAllocDefault, "host transfer staging"));
    }
  }
  return absl::OkStatus();
}

absl::Status Lane::CopyToHost(void* dst, const void* src, uint64_t bytes, absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  SAMPLERD_RETURN_IF_ERROR(EnsureStaging());
  const uint64_t chunks = (bytes + kStagingBytes - 1) / kStagingBytes;
  auto chunk_bytes = [&](uint64_t k) { return std::min(kStagingBytes, bytes - k * kStagingBytes); };
  // Chunk k goes through staging_[k % 2]: its DMA runs while the host copies chunk k - 1 out.
  auto enqueue = [&](uint64_t k) -> absl::Status {
    const int b = static_cast<int>(k % 2);
    SAMPLERD_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(staging_[b].as<char>(), static_cast<const char*>(src) + k * kStagingBytes,
                        chunk_bytes(k), cudaMemcpyDeviceToHost, stream_.get()),
        absl::StrCat("cudaMemcpyAsync to the host for ", what));
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaEventRecord(staged_[b].get(), stream_.get()),
                                  "cudaEventRecord");
    return absl::OkStatus();
  };
  auto drain = [&](uint64_t k) -> absl::Status {
    const int b = static_cast<int>(k % 2);
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(staged_[b].get()),
                                  absl::StrCat("copying ", what, " to the host"));
    std::memcpy(static_cast<char*>(dst) + k * kStagingBytes, staging_[b].as<char>(),
                chunk_bytes(k));
    return absl::OkStatus();
  };
  SAMPLERD_RETURN_IF_ERROR(enqueue(0));
  for (uint64_t k = 1; k < chunks; ++k) {
    SAMPLERD_RETURN_IF_ERROR(enqueue(k));
    SAMPLERD_RETURN_IF_ERROR(drain(k - 1));
  }
  return drain(chunks - 1);
}

absl::Status Lane::CopyToDevice(void* dst, const void* src, uint64_t bytes,
                                absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  SAMPLERD_RETURN_IF_ERROR(EnsureStaging());
  for (uint64_t k = 0, offset = 0; offset < bytes; ++k, offset += kStagingBytes) {
    const int b = static_cast<int>(k % 2);
    const uint64_t n = std::min(kStagingBytes, bytes - offset);
    // staging_[b] is free once the DMA of chunk k - 2 finished (an event never recorded counts
    // as complete).
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(staged_[b].get()),
                                  absl::StrCat("copying ", what, " to the device"));
    std::memcpy(staging_[b].as<char>(), static_cast<const char*>(src) + offset, n);
    SAMPLERD_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(static_cast<char*>(dst) + offset, staging_[b].as<char>(), n,
                        cudaMemcpyHostToDevice, stream_.get()),
        absl::StrCat("cudaMemcpyAsync to the device for ", what));
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaEventRecord(staged_[b].get(), stream_.get()),
                                  "cudaEventRecord");
  }
  return Synchronize(absl::StrCat("copying ", what, " to the device"));
}

absl::StatusOr<std::shared_ptr<CudaContext>> CudaContext::Create(int device) {
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  int pools_supported = 0;
  SAMPLERD_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device),
      "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
  if (!pools_supported) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: device ", device,
                     " has no stream-ordered memory pools (cudaMallocAsync), which the CUDA "
                     "backend needs"));
  }
  cudaMemPool_t pool = nullptr;
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaDeviceGetDefaultMemPool(&pool, device),
                                "cudaDeviceGetDefaultMemPool");
  return std::shared_ptr<CudaContext>(new CudaContext(device, pool));
}

absl::Status CudaContext::Enter() const {
  int current = -1;
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_) {
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_),
                                  absl::StrCat("cudaSetDevice(", device_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaContext::LaneLease> CudaContext::AcquireLane() const {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Lane> lane = std::move(idle_.back());
      idle_.pop_back();
      return LaneLease(this, std::move(lane));
    }
  }
  // A new lane's stream and events belong to the current device: make it the backend's, whatever
  // device the calling thread had current.
  SAMPLERD_RETURN_IF_ERROR(Enter());
  auto lane = std::make_unique<Lane>();
  SAMPLERD_RETURN_IF_ERROR(lane->Create());
  return LaneLease(this, std::move(lane));
}

CudaContext::LaneLease::~LaneLease() {
  if (lane_ == nullptr) return;  // Moved from.
  // A lane goes back only idle and healthy; after an error its stream is dropped (the error
  // was returned by the call that met it).
  if (lane_->Synchronize("lane release").ok()) context_->Release(std::move(lane_));
}

void CudaContext::Release(std::unique_ptr<Lane> lane) const {
  {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleLanes) {
      idle_.push_back(std::move(lane));
      return;
    }
  }
  // A surplus lane is destroyed after the lock is released: freeing its pinned buffers
  // synchronises the device, which AcquireLane callers must not wait for.
  lane.reset();
}

uint64_t CudaContext::PoolAttribute(cudaMemPoolAttr attribute) const {
  uint64_t value = 0;
  // A measurement only: a failure reads as 0 rather than failing the operation measured.
  if (cudaMemPoolGetAttribute(pool_, attribute, &value) != cudaSuccess) return 0;
  return value;
}

CudaContext::OperationScope::OperationScope(const CudaContext* context,
                                            uint64_t CudaMemoryPeaks::*peak)
    : context_(context), peak_(peak) {
  if (context_->open_scopes_.fetch_add(1) == 0) {
    uint64_t zero = 0;  // "Only 0 may be set": the mark restarts from the memory in use now.
    cudaMemPoolSetAttribute(context_->pool_, cudaMemPoolAttrUsedMemHigh, &zero);
  }
}

CudaContext::OperationScope::~OperationScope() {
  const uint64_t high = context_->PoolAttribute(cudaMemPoolAttrUsedMemHigh);
  {
    absl::MutexLock lock(&context_->peaks_mu_);
    uint64_t& peak = context_->peaks_.*peak_;
    peak = std::max(peak, high);
  }
  context_->open_scopes_.fetch_sub(1);
}

CudaMemoryPeaks CudaContext::Peaks(bool reset) const {
  absl::MutexLock lock(&peaks_mu_);
  CudaMemoryPeaks peaks = peaks_;
  peaks.in_use = PoolAttribute(cudaMemPoolAttrUsedMemCurrent);
  if (reset) peaks_ = CudaMemoryPeaks();
  return peaks;
}

}  // namespace cuda
}  // namespace samplerd
