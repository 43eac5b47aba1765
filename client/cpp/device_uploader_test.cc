#include "client/cpp/device_uploader.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "client/cpp/cuda_support.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(DeviceUploaderTest, BadSlotsAreRejectedBeforeAnyCudaCall) {
  EXPECT_EQ(DeviceUploader::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceUploaderTest, WithoutAGpuCreateSaysWhy) {
  if (GpuAvailable().ok()) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<std::unique_ptr<DeviceUploader>> uploader = DeviceUploader::Create();
  EXPECT_EQ(uploader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(uploader.status().message(), GpuAvailable().message());
}

// More uploads than slots, each from a host buffer overwritten right after the call returns
// (what the staging is for), of growing sizes (slots reallocated), on a non-blocking stream:
// the device must hold every upload's values as they were at the call.
TEST(DeviceUploaderTest, EveryUploadArrivesAsItWasWhenEnqueued) {
  if (absl::Status gpu = GpuAvailable(); !gpu.ok()) GTEST_SKIP() << gpu.message();
  auto uploader = DeviceUploader::Create(2);
  ASSERT_TRUE(uploader.ok()) << uploader.status();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr int kUploads = 9;
  std::vector<int64_t*> device(kUploads);
  std::vector<size_t> sizes(kUploads);
  std::vector<int64_t> host;
  for (int u = 0; u < kUploads; ++u) {
    sizes[u] = size_t{1000} << (u % 5);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device[u]), sizes[u] * sizeof(int64_t)),
              cudaSuccess);
    host.resize(sizes[u]);
    std::iota(host.begin(), host.end(), int64_t{u} << 32);
    ASSERT_TRUE(
        (*uploader)->Upload(host.data(), sizes[u] * sizeof(int64_t), device[u], stream).ok());
    std::fill(host.begin(), host.end(), -1);  // Reused at once, as a reader's queue is.
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int u = 0; u < kUploads; ++u) {
    std::vector<int64_t> back(sizes[u]);
    ASSERT_EQ(
        cudaMemcpy(back.data(), device[u], sizes[u] * sizeof(int64_t), cudaMemcpyDeviceToHost),
        cudaSuccess);
    for (size_t i = 0; i < sizes[u]; ++i) {
      ASSERT_EQ(back[i], (int64_t{u} << 32) + static_cast<int64_t>(i)) << "upload " << u;
    }
    cudaFree(device[u]);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace samplerd
