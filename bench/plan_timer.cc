// Times one kind of plan with the CPU backend and prints a JSON line: median seconds over
// --repeats, and the peak memory the planning added beyond its input weights and output plan.
// Used by bench/compare_torch.py, which runs torch's WeightedRandomSampler on the same N.
//
//   bazel run //bench:plan_timer -- --n=10000000 --replacement=true
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/cpu_backend.h"

ABSL_FLAG(uint64_t, n, 10'000'000, "number of samples N");
ABSL_FLAG(uint64_t, m, 0, "samples per epoch M (0 = N)");
ABSL_FLAG(bool, replacement, false, "draw with replacement");
ABSL_FLAG(bool, weighted, true, "random weights (false: uniform)");
ABSL_FLAG(int, repeats, 5, "timed repetitions");
ABSL_FLAG(int, threads, 0, "backend threads (0 = all cores)");

namespace {

// Peak resident memory of this process (VmHWM). Not getrusage's ru_maxrss: Linux carries that
// over exec from the parent (e.g. a Python process holding torch and a 1e7-element list).
long PeakRssKb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const uint64_t n = absl::GetFlag(FLAGS_n);
  const uint64_t m = absl::GetFlag(FLAGS_m) == 0 ? n : absl::GetFlag(FLAGS_m);
  std::vector<float> weights;
  if (absl::GetFlag(FLAGS_weighted)) {
    weights.resize(n);
    uint64_t s = 1;
    for (float& w : weights) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      w = static_cast<float>(0.1 + (s >> 40) * (1.0 / (1ull << 24)));  // U(0.1, 1.1)
    }
  }
  auto backend = samplerd::NewCpuBackend(absl::GetFlag(FLAGS_threads));
  const samplerd::PlanSpec spec{n, m, 42, absl::GetFlag(FLAGS_replacement),
                                samplerd::SampleOrder::kWeightedRandom};
  std::shared_ptr<const samplerd::BackendWeights> backend_weights;
  if (!weights.empty()) {
    auto made = backend->MakeWeights(std::move(weights));
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    backend_weights = *std::move(made);
  }
  const long rss_before_kb = PeakRssKb();
  std::vector<double> seconds;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    auto plan = backend->PlanEpoch(spec, r, backend_weights.get());
    const auto stop = std::chrono::steady_clock::now();
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
      return 1;
    }
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  const long rss_after_kb = PeakRssKb();
  std::sort(seconds.begin(), seconds.end());
  // Peak growth during planning, less the plan itself (4 or 8 bytes per index).
  const double extra_bytes = static_cast<double>(rss_after_kb - rss_before_kb) * 1024.0 -
                             (samplerd::Plan::Narrow(n) ? 4.0 : 8.0) * static_cast<double>(m);
  std::printf(
      "{\"n\": %lu, \"m\": %lu, \"replacement\": %s, \"weighted\": %s, \"median_s\": %.6f, "
      "\"min_s\": %.6f, \"extra_bytes_per_sample\": %.2f}\n",
      (unsigned long)n, (unsigned long)m, spec.replacement ? "true" : "false",
      backend_weights == nullptr ? "false" : "true", seconds[seconds.size() / 2], seconds.front(),
      std::max(0.0, extra_bytes) / static_cast<double>(n));
  return 0;
}
