#include "kernels/cuda/cuda_status.h"

#include <string>

#include "gtest/gtest.h"

namespace samplerd {
namespace cuda {
namespace {

TEST(CudaStatusTest, OutOfMemoryIsResourceExhaustedWithTheRuntimesWords) {
  const absl::Status s =
      CudaStatus(cudaErrorMemoryAllocation, "cudaMallocAsync of 4000000000 bytes for the weights");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "cuda: cudaMallocAsync of 4000000000 bytes for the weights: "
            "cudaErrorMemoryAllocation: out of memory");
}

// "No usable GPU" is the caller's precondition for a trainer, an internal failure for the
// server (the backend's default).
TEST(CudaStatusTest, NoUsableGpuIsWhatTheCallerSays) {
  for (const cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorNotSupported,
                              cudaErrorInitializationError, cudaErrorDevicesUnavailable}) {
    const absl::Status s = CudaStatus(e, "cudaGetDeviceCount", NoGpuIs::kFailedPrecondition);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(std::string(s.message()).rfind("cuda: cudaGetDeviceCount: ", 0), 0u) << s;
    EXPECT_EQ(CudaStatus(e, "Shuffle").code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x", NoGpuIs::kFailedPrecondition).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CudaStatusTest, OtherErrorsAreInternalAndSuccessIsOk) {
  const absl::Status s = CudaStatus(cudaErrorLaunchFailure, "Shuffle");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(s.message()).rfind("cuda: Shuffle: cudaErrorLaunchFailure: ", 0), 0u)
      << s.message();
  EXPECT_TRUE(CudaStatus(cudaSuccess, "anything").ok());
}

absl::Status ReturnsEarly(cudaError_t e, bool* reached_end) {
  SAMPLERD_RETURN_IF_CUDA_ERROR(e, "step");
  *reached_end = true;
  return absl::OkStatus();
}

TEST(CudaStatusTest, TheMacroReturnsOnlyOnError) {
  bool reached = false;
  EXPECT_EQ(ReturnsEarly(cudaErrorInvalidValue, &reached).code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(ReturnsEarly(cudaSuccess, &reached).ok());
  EXPECT_TRUE(reached);
}

}  // namespace
}  // namespace cuda
}  // namespace samplerd
