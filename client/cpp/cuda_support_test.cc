#include "client/cpp/cuda_support.h"

#include <cstring>
#include <utility>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(CudaStatusTest, NamesTheCallAndTheRuntimeError) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  const absl::Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(8 bytes)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc(8 bytes): cudaErrorMemoryAllocation"),
            absl::string_view::npos)
      << oom;
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(), absl::StatusCode::kInternal);
}

TEST(GpuAvailableTest, AnswersWithTheRuntimesReason) {
  const absl::Status s = GpuAvailable();
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(s.message().empty());
    GTEST_SKIP() << "no GPU: " << s.message();
  }
  // A GPU is present: pinned memory works and moves with its owner.
  cuda::PinnedBuffer buffer;
  ASSERT_TRUE(buffer.Allocate(4096, cudaHostAllocDefault, "the test", kTrainerNoGpu).ok());
  std::memset(buffer.data(), 7, buffer.bytes());
  cuda::PinnedBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.bytes(), 4096u);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(moved.as<unsigned char>()[4095], 7);
}

}  // namespace
}  // namespace samplerd
