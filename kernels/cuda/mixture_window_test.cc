// The device window (mixture_window.h) against the CPU's (kernels/mixture/window.h), bit for bit:
// the filled entries and the shuffled window, for mixes with groups smaller than the window,
// several passes, and N = 10^12. Every test is skipped, with the reason, without a usable GPU.
#include "kernels/cuda/mixture_window.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gpu_presence.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace gpu {
namespace {

const GpuPresence& Presence() {
  static const GpuPresence* presence = new GpuPresence(CheckGpu());
  return *presence;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * sizeof(T) + 1),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

std::vector<uint64_t> ToHost(const uint64_t* device, uint64_t n) {
  std::vector<uint64_t> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(uint64_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

void CheckMix(const std::vector<uint64_t>& sizes, const std::vector<double>& weights, uint64_t m,
              int windows) {
  auto layout = mixture::GroupLayout::Create(sizes);
  ASSERT_TRUE(layout.ok());
  auto shares = mixture::SharesOf(weights);
  ASSERT_TRUE(shares.ok());
  auto apportioner = mixture::Apportioner::Create(sizes.size());
  ASSERT_TRUE(apportioner.ok());
  const uint32_t k_groups = layout->groups();
  std::vector<uint64_t> offsets(k_groups);
  for (uint32_t k = 0; k < k_groups; ++k) offsets[k] = layout->offset(k);
  std::vector<mixture::GroupCursor> cursors(k_groups);
  for (int epoch = 0; epoch < windows; ++epoch) {
    auto counts = apportioner->Next(*shares, m);
    ASSERT_TRUE(counts.ok());
    std::vector<uint64_t> prefix(k_groups + 1, 0);
    for (uint32_t k = 0; k < k_groups; ++k) prefix[k + 1] = prefix[k] + counts->counts[k];
    std::vector<uint64_t> filled(m);
    mixture::FillWindow(2, 3, *layout, cursors, counts->counts, absl::MakeSpan(filled));
    auto window = mixture::PlanWindow(2, 3, epoch, *layout, cursors, counts->counts);
    ASSERT_TRUE(window.ok());

    DeviceMixtureGroups groups;
    groups.groups = k_groups;
    uint64_t* d_offsets = ToDevice(offsets);
    uint64_t* d_sizes = ToDevice(sizes);
    mixture::GroupCursor* d_cursors = ToDevice(cursors);
    uint64_t* d_prefix = ToDevice(prefix);
    groups.offsets = d_offsets;
    groups.sizes = d_sizes;
    groups.cursors = d_cursors;
    groups.count_prefix = d_prefix;
    uint64_t* d_out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), m * sizeof(uint64_t)), cudaSuccess);
    ASSERT_EQ(FillMixtureWindow(3, groups, m, d_out, nullptr), cudaSuccess);
    EXPECT_EQ(ToHost(d_out, m), filled) << "epoch " << epoch;
    ASSERT_EQ(PlanMixtureWindow(3, epoch, groups, m, d_out, nullptr), cudaSuccess);
    EXPECT_EQ(ToHost(d_out, m), window->indices) << "epoch " << epoch;
    for (void* p :
         {static_cast<void*>(d_offsets), static_cast<void*>(d_sizes), static_cast<void*>(d_cursors),
          static_cast<void*>(d_prefix), static_cast<void*>(d_out)}) {
      cudaFree(p);
    }
    cursors = window->cursors;
  }
}

TEST(MixtureWindowTest, DeviceEqualsCpu) {
  if (!Presence().usable()) GTEST_SKIP() << "no usable GPU: " << Presence().message;
  CheckMix({1, 2, 3, 50}, {1.0, 1.0, 1.0, 1.0}, 16, 20);
  CheckMix({5, 200, 31, 8, 999, 2}, {1.0, 4.0, 2.0, 0.1, 8.0, 0.5}, 257, 10);
  CheckMix({1000, 17, 1, 333}, {0.5, 3.0, 0.25, 1.0}, 100000, 3);
  CheckMix(std::vector<uint64_t>(10000, 100000000), std::vector<double>(10000, 1.0), 1000000, 2);
}

TEST(MixtureWindowTest, RefusesBadArguments) {
  if (!Presence().usable()) GTEST_SKIP() << "no usable GPU: " << Presence().message;
  DeviceMixtureGroups none;
  uint64_t* out = nullptr;
  EXPECT_EQ(FillMixtureWindow(1, none, 4, out, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PlanMixtureWindow(1, 1, none, (uint64_t{1} << 34) + 1, out, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd
