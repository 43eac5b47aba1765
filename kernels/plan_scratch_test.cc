// ComputeBackend::PlanScratchBytes of the CPU backend against what PlanEpoch really takes.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/large_array.h"
#include "kernels/testing/backend_state.h"
#include "kernels/testing/peak_memory.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace {

constexpr uint64_t kN = uint64_t{1} << 22;
// Thread stacks, malloc arenas and page-table slack of a plan's worker threads.
constexpr uint64_t kSlack = uint64_t{8} << 20;

struct Case {
  std::string name;
  PlanSpec spec;
  bool weighted;
};

std::vector<Case> Cases() {
  auto spec = [](uint64_t m, bool replacement, SampleOrder order = SampleOrder::kWeightedRandom) {
    return PlanSpec{kN, m, 7, replacement, order};
  };
  return {
      {"weighted, with replacement", spec(kN, true), true},
      {"uniform, with replacement, M = 1000", spec(1000, true), false},
      {"uniform, with replacement, M = 4N", spec(4 * kN, true), false},
      {"weighted, without replacement, M = N / 2", spec(kN / 2, false), true},
      {"uniform, without replacement, M = N / 64", spec(kN / 64, false), false},
      {"weighted, without replacement, M = N - 1", spec(kN - 1, false), true},
      {"without replacement, M = N", spec(kN, false), true},
      {"sequential", spec(kN, false, SampleOrder::kSequential), false},
  };
}

// The estimate is an upper bound of the resident growth (the plan and the scratch), and not a
// gross overstatement of it either (a budget must not turn away jobs that fit).
TEST(PlanScratchBytesTest, BoundsWhatPlanEpochReallyTakes) {
  if (const char* why = testutil::ResidentMemoryNotTheProgramsBecause(); *why != '\0') {
    GTEST_SKIP() << why;
  }
  auto backend = NewCpuBackend(2);
  // Positive weights: every path plans (M = N - 1 without replacement needs M positive ones).
  const std::shared_ptr<const BackendWeights> backend_weights =
      testutil::WeightsOf(*backend, testutil::RandomWeights(kN, 3));
  // The backend's own vector (ToHost: no copy), which PlanEpoch reads.
  const std::vector<float>& weights = **backend_weights->ToHost();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const uint64_t plan_bytes = LargeArrayBytes(c.spec.samples_per_epoch * sizeof(uint32_t));
    const uint64_t scratch = backend->PlanScratchBytes(c.spec, c.weighted);
    auto touch_weights = [&] {
      volatile float sum = 0;
      for (uint64_t i = 0; i < kN; i += 1024) sum = sum + weights[i];
    };
    const testutil::PeakGrowth growth = testutil::PeakResidentGrowth(touch_weights, [&] {
      auto plan = backend->PlanEpoch(c.spec, 1, c.weighted ? backend_weights.get() : nullptr);
      if (!plan.ok() || plan->size() != c.spec.samples_per_epoch) _exit(1);
    });
    if (!growth.supported) GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
    ASSERT_EQ(growth.exit_code, 0) << "the measured code failed";
    std::printf("%s: growth %.1f MiB, plan %.1f MiB + scratch %.1f MiB\n", c.name.c_str(),
                growth.bytes / 1048576.0, plan_bytes / 1048576.0, scratch / 1048576.0);
    EXPECT_LE(growth.bytes, plan_bytes + scratch + kSlack)
        << "plan " << plan_bytes << " + scratch " << scratch;
    EXPECT_GE(growth.bytes + kSlack, (plan_bytes + scratch) / 2)
        << "plan " << plan_bytes << " + scratch " << scratch;
  }
}

TEST(PlanScratchBytesTest, UniformDrawsWithReplacementNeedNoPerSampleScratch) {
  auto backend = NewCpuBackend(4);
  const PlanSpec huge{uint64_t{1} << 40, 1000, 0, true, SampleOrder::kWeightedRandom};
  EXPECT_EQ(backend->PlanScratchBytes(huge, /*weighted=*/false), 0u);
  // A weighted draw needs its table: ~8 bytes per sample (prefix sums, no guide beyond 2^32).
  EXPECT_GE(backend->PlanScratchBytes(huge, /*weighted=*/true), uint64_t{8} << 40);
  // Absurd sizes saturate instead of wrapping around.
  const PlanSpec absurd{~uint64_t{0}, ~uint64_t{0}, 0, true, SampleOrder::kWeightedRandom};
  EXPECT_EQ(backend->PlanScratchBytes(absurd, true), ~uint64_t{0});
}

}  // namespace
}  // namespace samplerd
