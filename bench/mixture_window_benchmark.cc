// The boundary of a mixture job (kernels/mixture/): N = groups x group_size samples, one window
// of M. Times, median of --reps: SharesOf (the weights to shares), Apportioner::Next (the
// counts), FillWindow (the groups' pass orders) and PlanWindow (fill + shuffle: the window), the
// shuffle alone (PlanWindow's shuffle of 8-byte entries with entries that cost nothing: where the
// rest of the window's time goes), and the anchor measured in the same run: the CPU backend's
// uniform plan of M samples without replacement and M = N (the shuffle of today's plans alone),
// with the ratio. Peak RSS (VmHWM) after the windows (PlanWindow), before the fill alone (which
// allocates M entries of its own) and the anchor run. Then the window as a server computes it,
// through a compute backend (ComputeBackend::PlanMixtureWindow, the same windows as PlanWindow's:
// checked equal): the CPU backend on `threads` threads, or with `backend` = cuda the CUDA
// backend (its time includes the O(K) upload and the copy of the window to the host), whose
// anchor is PlanWindow on the CPU above, in the same run.
//
//   bazel run -c opt //bench:mixture_window_benchmark -- [groups] [group_size] [M] [threads]
//       [reps] [backend]
//   (defaults: 10000 100000000 10000000 2 5 cpu: N = 10^12 in 10^4 groups, M = 10^7)
// Exit status 2 (printing why) when `backend` is cuda and no GPU is usable.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/internal/shuffle.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// An order-sensitive checksum of a window (to compare two windows without keeping both).
uint64_t Checksum(const std::vector<uint64_t>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t x : v) h = (h ^ x) * 0x100000001b3ull;
  return h;
}

// A field of /proc/self/status in MiB (VmHWM: peak RSS, VmRSS: now).
double StatusMiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atof(line.c_str() + field.size() + 1) / 1024;
  }
  return -1;
}

int Main(int argc, char** argv) {
  const uint64_t groups = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10000;
  const uint64_t group_size = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 100000000;
  const uint64_t m = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 10000000;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  const std::string backend_name = argc > 6 ? argv[6] : "cpu";
  std::printf("N = %llu in %llu groups of %llu, M = %llu, %d threads, %d reps, backend %s\n",
              static_cast<unsigned long long>(groups * group_size),
              static_cast<unsigned long long>(groups), static_cast<unsigned long long>(group_size),
              static_cast<unsigned long long>(m), threads, reps, backend_name.c_str());
  std::unique_ptr<ComputeBackend> window_backend;
  if (backend_name == "cuda") {
    absl::StatusOr<std::unique_ptr<ComputeBackend>> cuda = NewCudaBackend({});
    if (!cuda.ok()) {
      std::printf("no usable GPU: %s\n", cuda.status().ToString().c_str());
      return 2;
    }
    window_backend = *std::move(cuda);
  } else if (backend_name == "cpu") {
    window_backend = NewCpuBackend(threads);
  } else {
    std::fprintf(stderr, "backend: '%s', expected cpu or cuda\n", backend_name.c_str());
    return 1;
  }

  auto layout = mixture::GroupLayout::Create(std::vector<uint64_t>(groups, group_size));
  CHECK_OK_OR_DIE(layout.status());
  std::vector<double> weights(groups);
  for (uint64_t k = 0; k < groups; ++k) weights[k] = 1.0 + static_cast<double>(k % 97) / 7;
  auto apportioner = mixture::Apportioner::Create(groups);
  CHECK_OK_OR_DIE(apportioner.status());
  std::vector<mixture::GroupCursor> cursors(groups);
  std::vector<double> t_shares, t_counts, t_fill, t_window, t_shuffle, t_anchor, t_backend;
  std::vector<std::vector<uint64_t>> all_counts;  // Per rep, for the fill alone afterwards.
  std::vector<uint64_t> window_hashes;            // Per rep, for the backend's windows.
  for (int rep = 0; rep < reps; ++rep) {
    auto start = std::chrono::steady_clock::now();
    auto shares = mixture::SharesOf(weights);
    CHECK_OK_OR_DIE(shares.status());
    t_shares.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    auto counts = apportioner->Next(*shares, m);
    CHECK_OK_OR_DIE(counts.status());
    t_counts.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    auto window = mixture::PlanWindow(threads, 1, rep, *layout, cursors, counts->counts);
    CHECK_OK_OR_DIE(window.status());
    t_window.push_back(Seconds(start));
    cursors = window->cursors;
    all_counts.push_back(counts->counts);
    window_hashes.push_back(Checksum(window->indices));
  }
  // Before the fill alone allocates its M entries: the peak of planning windows.
  const double peak_mixture = StatusMiB("VmHWM");
  std::vector<mixture::GroupCursor> fill_cursors(groups);
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<uint64_t> entries(m);
    const auto start = std::chrono::steady_clock::now();
    mixture::FillWindow(threads, 1, *layout, fill_cursors, all_counts[rep],
                        absl::MakeSpan(entries));
    t_fill.push_back(Seconds(start));
    for (uint64_t k = 0; k < groups; ++k) {
      fill_cursors[k] = mixture::AdvanceCursor(fill_cursors[k], group_size, all_counts[rep][k]);
    }
  }

  for (int rep = 0; rep < reps; ++rep) {
    std::vector<uint64_t> shuffled(m);
    const internal::InputBlockFn identity = [](uint64_t k, uint64_t count, uint64_t* values) {
      for (uint64_t i = 0; i < count; ++i) values[i] = k + i;
    };
    const auto start = std::chrono::steady_clock::now();
    internal::ShuffleGenerated(threads, 1, rep, identity, absl::MakeSpan(shuffled));
    t_shuffle.push_back(Seconds(start));
  }

  auto backend = NewCpuBackend(threads);
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    auto plan = backend->PlanEpoch({m, m, 1, false, SampleOrder::kWeightedRandom}, rep, nullptr);
    CHECK_OK_OR_DIE(plan.status());
    t_anchor.push_back(Seconds(start));
  }
  // The backend's windows: the same (counts, cursors) rep by rep as PlanWindow's above.
  std::vector<mixture::GroupCursor> backend_cursors(groups);
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<uint64_t> out(m);
    const auto start = std::chrono::steady_clock::now();
    auto next = window_backend->PlanMixtureWindow(1, rep, *layout, backend_cursors, all_counts[rep],
                                                  absl::MakeSpan(out));
    CHECK_OK_OR_DIE(next.status());
    t_backend.push_back(Seconds(start));
    if (Checksum(out) != window_hashes[rep]) {
      std::printf("FAIL: the %s backend's window %d differs from PlanWindow's\n",
                  backend_name.c_str(), rep);
      return 1;
    }
    backend_cursors = *std::move(next);
  }
  const double boundary =
      bench::Median(t_shares) + bench::Median(t_counts) + bench::Median(t_window);
  std::printf("SharesOf (K = %llu)             %8.4f s\n", static_cast<unsigned long long>(groups),
              bench::Median(t_shares));
  std::printf("Apportioner::Next               %8.4f s\n", bench::Median(t_counts));
  std::printf("FillWindow                      %8.4f s\n", bench::Median(t_fill));
  std::printf("PlanWindow (fill + shuffle)     %8.4f s\n", bench::Median(t_window));
  std::printf("  of which the shuffle (8-byte)   %8.4f s  (alone, entries free)\n",
              bench::Median(t_shuffle));
  std::printf("boundary (shares+counts+window) %8.4f s\n", boundary);
  std::printf("anchor: uniform plan M = N = M  %8.4f s  (window / anchor = %.2fx)\n",
              bench::Median(t_anchor), bench::Median(t_window) / bench::Median(t_anchor));
  std::printf(
      "backend %-4s PlanMixtureWindow   %8.4f s  (equal to PlanWindow's; / PlanWindow "
      "= %.2fx)\n",
      backend_name.c_str(), bench::Median(t_backend),
      bench::Median(t_backend) / bench::Median(t_window));
  std::printf(
      "peak RSS after the windows (before the fill alone) %.1f MiB (one window: 8 B x M = "
      "%.1f MiB)\n",
      peak_mixture, 8.0 * m / 1048576);
  return 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Main(argc, argv); }
