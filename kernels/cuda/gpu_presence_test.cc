#include "kernels/cuda/gpu_presence.h"

#include <string>

#include "gtest/gtest.h"

namespace samplerd {
namespace gpu {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ClassifyGpuErrorTest, NamesWhatIsMissing) {
  const GpuPresence none =
      ClassifyGpuError(cudaErrorInsufficientDriver, "cudaGetDeviceCount", 0, 13000);
  EXPECT_EQ(none.verdict, GpuVerdict::kNoDriver);
  EXPECT_TRUE(Contains(none.message, "no NVIDIA driver")) << none.message;
  EXPECT_TRUE(Contains(none.message, "cudaGetDeviceCount: cudaErrorInsufficientDriver"))
      << none.message;

  const GpuPresence old = ClassifyGpuError(cudaErrorInsufficientDriver, "x", 12020, 13000);
  EXPECT_EQ(old.verdict, GpuVerdict::kDriverTooOld);
  EXPECT_TRUE(Contains(old.message, "driver CUDA 12.2, runtime CUDA 13.0")) << old.message;

  EXPECT_EQ(ClassifyGpuError(cudaErrorNoDevice, "x", 13000, 13000).verdict, GpuVerdict::kNoDevice);
  EXPECT_EQ(ClassifyGpuError(cudaErrorMemoryAllocation, "x", 13000, 13000).verdict,
            GpuVerdict::kOutOfMemory);
  EXPECT_EQ(ClassifyGpuError(cudaErrorLaunchFailure, "x", 13000, 13000).verdict,
            GpuVerdict::kOtherError);
}

// On a machine without a driver (CI, the build machines) the answer is "no NVIDIA driver"; on
// the GPU machine, usable, and asking for more memory than any GPU has is "out of memory".
TEST(CheckGpuTest, AnswersForThisMachine) {
  int driver = 0;
  cudaDriverGetVersion(&driver);
  const GpuPresence p = CheckGpu();
  if (driver == 0) {
    EXPECT_EQ(p.verdict, GpuVerdict::kNoDriver) << p.message;
    EXPECT_TRUE(Contains(p.message, "cudaErrorInsufficientDriver")) << p.message;
    return;
  }
  if (!p.usable()) GTEST_SKIP() << "a driver but no usable GPU: " << p.message;
  const GpuPresence too_much = CheckGpu(uint64_t{1} << 50);
  EXPECT_EQ(too_much.verdict, GpuVerdict::kOutOfMemory) << too_much.message;
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd
