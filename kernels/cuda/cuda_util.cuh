// Private helpers of the .cu files in kernels/cuda: error propagation, launch checks, scratch
// buffers from the stream-ordered allocator, grid sizes.
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_UTIL_CUH_
#define SAMPLERD_KERNELS_CUDA_CUDA_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

// Returns the error of `expr` (a cudaError_t) if it is not cudaSuccess.
#define SAMPLERD_CUDA_TRY(expr)                                           \
  do {                                                                    \
    const cudaError_t samplerd_cuda_error_ = (expr);                      \
    if (samplerd_cuda_error_ != cudaSuccess) return samplerd_cuda_error_; \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, no device), which
// cudaGetLastError also clears so that it is not reported again by an unrelated later call.
#define SAMPLERD_CUDA_TRY_LAUNCH() SAMPLERD_CUDA_TRY(cudaGetLastError())

namespace samplerd {
namespace gpu {
namespace internal {

// Scratch memory of `bytes` bytes, allocated and freed in stream order on `stream`. Check ok()
// (or the error of Allocate) before use. Freed in the destructor: a function may return early on
// an error and its scratch still goes back to the pool once the stream gets there.
class AsyncBuffer {
 public:
  AsyncBuffer() = default;
  AsyncBuffer(const AsyncBuffer&) = delete;
  AsyncBuffer& operator=(const AsyncBuffer&) = delete;
  ~AsyncBuffer() { Release(); }

  cudaError_t Allocate(size_t bytes, cudaStream_t stream) {
    Release();
    stream_ = stream;
    bytes_ = bytes;
    if (bytes == 0) return cudaSuccess;
    return cudaMallocAsync(&data_, bytes, stream);
  }
  void Release() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
    data_ = nullptr;
    bytes_ = 0;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Blocks for a grid-stride loop over n items: enough to fill the device several times over, never
// more than the items need (at least 1).
inline unsigned GridFor(uint64_t n, unsigned block) {
  constexpr uint64_t kMaxBlocks = 132 * 32;  // 32 blocks per multiprocessor of an H100.
  uint64_t blocks = (n + block - 1) / block;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

// The global index of this thread and the stride of a grid-stride loop, in 64 bits.
__device__ __forceinline__ uint64_t GlobalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridStride() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

}  // namespace internal
}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_UTIL_CUH_
