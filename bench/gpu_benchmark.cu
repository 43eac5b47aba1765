// GPU benchmark of the plan and weight kernels (kernels/cuda/device_plan.h, device_weights.h) on
// one device: medians over CUDA events, items per second, and the achieved bandwidth next to a
// device-to-device copy measured in the same run. Run by tools/gpu/check.sh (stage 4) from the
// bundle of tools/gpu/make_bundle.sh; torch's anchors come from bench/torch_anchors.py in the same
// run. Without a usable GPU it says why and exits with status 2 (as the trainer does).
//
// Prints one line per measurement, "RESULT <operation> <N> <M> <median ms> <items/s> <GB/s>
// <fraction of the copy bandwidth>", where GB/s counts the bytes the operation cannot avoid
// (weights read once where it reads them, the plan written once): the floor of docs/CONTRIBUTING.md (GPU code).
// Flags: --sizes=10000000,100000000,1000000000  --reps=N (default 10; 5 at N >= 1e9)
//        --ops=recompute_loss,no_replacement_M=N  only these operations (and the copy, the anchor):
//        what tools/gpu/check.sh profiles one at a time under ncu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/gpu_presence.h"
#include "kernels/det_math.h"
#include "kernels/loss_stats.h"
#include "kernels/philox.h"

namespace samplerd {
namespace gpu {
namespace {

#define BENCH_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(e_), \
                   cudaGetErrorString(e_));                                                        \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// Weights in [0.5, 1.5), random, made on the device (no 4 GB upload).
__global__ void FillWeights(float* w, uint64_t n) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    w[i] =
        static_cast<float>(0.5 + det::UniformOpen01(RandomBits64(99, 0, RandomStream::kDraw, i)));
  }
}

// Loss statistics of a job in its second epoch, made on the device: 1/8 never seen (count 0, an
// undefined EMA), the others seen with EMAs in (0, 4), half of them in the closed epoch 5.
__global__ void FillStats(DeviceLossStats stats, uint64_t n) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = RandomBits64(98, 0, RandomStream::kDraw, i);
    const uint32_t kind = r & 15;
    SampleLossStats s;
    if (kind < 2) {
      s.ema_loss = __int_as_float(0x7fc00000);
    } else {
      s.ema_loss = static_cast<float>(4 * det::UniformOpen01(r));
      s.count = static_cast<uint16_t>(kind);
      s.last_epoch = EpochMarker(kind & 1 ? 5 : 4);
    }
    stats.ema[i] = s.ema_loss;
    stats.meta[i] = LossStatsMeta(s);
    if (s.count > 0) {  // The bits start 0 (cudaMemset); seen and defined alike here.
      atomicOr(stats.seen + i / 32, 1u << (i % 32));
      atomicOr(stats.defined + i / 32, 1u << (i % 32));
    }
  }
}

// Median milliseconds of `reps` runs of fn (after one warm-up run), timed with events.
double MedianMs(int reps, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  fn();
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(start));
    fn();
    BENCH_CUDA(cudaEventRecord(stop));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double copy_gbps = 0;
std::vector<std::string> only_ops;  // --ops: empty for every operation.

// The operations, by the names of their RESULT lines.
constexpr const char* kOps[] = {"sequential",
                                "no_replacement_M=N",
                                "selection_only_M=N/10_weighted",
                                "no_replacement_M=N/10_weighted",
                                "replacement_M=N_uniform",
                                "weight_scan",
                                "replacement_M=N_weighted",
                                "replacement_draws_only_M=N",
                                "recompute_loss_base",
                                "recompute_loss",
                                "recompute_multiplicative",
                                "weight_summary"};

// Whether --ops asks for `op`.
bool Want(const char* op) {
  return only_ops.empty() || std::find(only_ops.begin(), only_ops.end(), op) != only_ops.end();
}

void Report(const char* op, uint64_t n, uint64_t m, double ms, double floor_bytes) {
  const double gbps = floor_bytes / (ms * 1e-3) / 1e9;
  std::printf("RESULT %s %llu %llu %.3f %.4g %.1f %.3f\n", op, static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(m), ms, static_cast<double>(m) / (ms * 1e-3), gbps,
              copy_gbps > 0 ? gbps / copy_gbps : 0.0);
  std::fflush(stdout);
}

// The weight kernels at N: the recompute (loss policy with and without base weights,
// multiplicative) and the summary. w: N weights (the base, or W_e); out: N floats. The floor
// counts the inputs read once and the result written once: 16 B per sample with base weights
// (~4 ms at 1e9 on an H100), 12 B without.
void RunWeights(uint64_t n, int reps, const float* w, float* out, cudaMemPool_t pool) {
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaMemPoolTrimTo(pool, 0));  // The plans' scratch: room for the statistics.
  void* stats_memory = nullptr;
  BENCH_CUDA(cudaMalloc(&stats_memory, LossStatsBytes(n)));
  BENCH_CUDA(cudaMemset(stats_memory, 0, LossStatsBytes(n)));
  const DeviceLossStats stats = LossStatsIn(stats_memory, n);
  FillStats<<<132 * 16, 256>>>(stats, n);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  uint64_t zero = 0;
  BENCH_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  RecomputeParams loss;
  loss.loss = LossWeightKind::kLoss;
  loss.alpha = 0.5;  // Log2 and Exp2 per sample (alpha 1 is a division).
  loss.mix = 0.1;
  loss.marker = EpochMarker(5);
  RecomputeParams multiplicative = loss;
  multiplicative.loss = LossWeightKind::kMultiplicative;
  RecomputeCheck check;
  auto recompute = [&](const RecomputeParams& p, const float* base, const float* current) {
    BENCH_CUDA(RecomputeWeights(p, n, base, current, stats, out, &check, 0));
    if (check.first_bad != ~uint64_t{0} || (base != nullptr && !check.base_positive)) {
      std::fprintf(stderr, "recompute refused its inputs: first_bad %llu\n",
                   static_cast<unsigned long long>(check.first_bad));
      std::exit(1);
    }
  };
  if (Want("recompute_loss_base")) {
    Report("recompute_loss_base", n, n, MedianMs(reps, [&] { recompute(loss, w, nullptr); }),
           16.0 * n);
  }
  if (Want("recompute_loss")) {
    Report("recompute_loss", n, n, MedianMs(reps, [&] { recompute(loss, nullptr, nullptr); }),
           12.0 * n);
  }
  if (Want("recompute_multiplicative")) {
    Report("recompute_multiplicative", n, n,
           MedianMs(reps, [&] { recompute(multiplicative, nullptr, w); }), 16.0 * n);
  }
  uint64_t high = 0;
  BENCH_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  std::printf(
      "MEMORY N=%llu recompute: scratch peak %.3f MB (%.4f B/sample) besides base, "
      "current, stats (8.25 B/sample) and out (4 B/sample)\n",
      static_cast<unsigned long long>(n), high / 1e6, static_cast<double>(high) / n);
  WeightSummaryValues summary;
  if (Want("weight_summary")) {
    Report("weight_summary", n, n,
           MedianMs(reps, [&] { BENCH_CUDA(SummarizeWeights(w, n, &summary, 0)); }), 4.0 * n);
  }
  BENCH_CUDA(cudaFree(stats_memory));
}

void Run(uint64_t n, int reps) {
  size_t free_bytes = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total));
  // Peak: weights, plan, selection output, the shuffle's keys and positions twice + CUB scratch
  // (the recompute's statistics, 8.25 B, come after the plans have freed their scratch).
  const uint64_t need = n * (4 + 4 + 4 + 16 + 8) + (uint64_t{1} << 30);
  if (need > free_bytes) {
    std::printf("SKIP N=%llu: needs ~%.1f GB, %.1f GB free\n", static_cast<unsigned long long>(n),
                need / 1e9, free_bytes / 1e9);
    return;
  }
  float* w = nullptr;
  uint32_t* plan = nullptr;
  uint32_t* selected = nullptr;
  BENCH_CUDA(cudaMalloc(&w, n * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&plan, n * sizeof(uint32_t)));
  BENCH_CUDA(cudaMalloc(&selected, (n / 10 + 1) * sizeof(uint32_t)));
  FillWeights<<<132 * 16, 256>>>(w, n);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  uint64_t epoch = 0;

  // The floor: a device-to-device copy of N 4-byte entries (bytes read + written).
  const double copy_ms = MedianMs(reps, [&] {
    BENCH_CUDA(cudaMemcpyAsync(plan, w, n * sizeof(float), cudaMemcpyDeviceToDevice));
  });
  copy_gbps = 2.0 * n * 4 / (copy_ms * 1e-3) / 1e9;
  Report("copy_d2d", n, n, copy_ms, 2.0 * n * 4);

  if (Want("sequential")) {
    Report("sequential", n, n,
           MedianMs(reps, [&] { BENCH_CUDA(SequentialPlan<uint32_t>(n, plan, 0)); }), 4.0 * n);
  }
  if (Want("no_replacement_M=N")) {
    Report("no_replacement_M=N", n, n,
           MedianMs(reps, [&] { BENCH_CUDA(Shuffle<uint32_t>(7, ++epoch, n, nullptr, plan, 0)); }),
           4.0 * n);
  }
  const uint64_t m = n / 10;
  if (Want("selection_only_M=N/10_weighted")) {
    Report(
        "selection_only_M=N/10_weighted", n, m,
        MedianMs(reps,
                 [&] {
                   BENCH_CUDA(SelectEfraimidisSpirakis<uint32_t>(7, ++epoch, n, m, w, selected, 0));
                 }),
        4.0 * n + 4.0 * m);
  }
  if (Want("no_replacement_M=N/10_weighted")) {
    Report(
        "no_replacement_M=N/10_weighted", n, m,
        MedianMs(reps,
                 [&] {
                   BENCH_CUDA(SelectEfraimidisSpirakis<uint32_t>(7, ++epoch, n, m, w, selected, 0));
                   BENCH_CUDA(Shuffle<uint32_t>(7, epoch, m, selected, plan, 0));
                 }),
        4.0 * n + 4.0 * m);
  }
  if (Want("replacement_M=N_uniform")) {
    Report("replacement_M=N_uniform", n, n,
           MedianMs(reps, [&] { BENCH_CUDA(UniformDraws<uint32_t>(7, ++epoch, n, 0, n, plan, 0)); }),
           4.0 * n);
  }
  WeightScan* scan = nullptr;
  BENCH_CUDA(cudaMalloc(&scan, sizeof(WeightScan)));
  BENCH_CUDA(ScanWeights(w, n, scan, 0));
  WeightScan host_scan;
  BENCH_CUDA(cudaMemcpy(&host_scan, scan, sizeof host_scan, cudaMemcpyDeviceToHost));
  if (Want("weight_scan")) {
    Report("weight_scan", n, n, MedianMs(reps, [&] { BENCH_CUDA(ScanWeights(w, n, scan, 0)); }),
           4.0 * n);
  }
  if (Want("replacement_M=N_weighted")) {
    Report("replacement_M=N_weighted", n, n,
           MedianMs(reps,
                    [&] {
                      DeviceDrawTable table;
                      BENCH_CUDA(BuildDrawTable<uint32_t>(w, n, host_scan.max_bits, &table, 0));
                      BENCH_CUDA(WeightedDraws<uint32_t>(table, 7, ++epoch, 0, n, plan, 0));
                      BENCH_CUDA(FreeDrawTable(&table, 0));
                    }),
           8.0 * n);
  }
  DeviceDrawTable table;
  BENCH_CUDA(BuildDrawTable<uint32_t>(w, n, host_scan.max_bits, &table, 0));
  if (Want("replacement_draws_only_M=N")) {
    Report("replacement_draws_only_M=N", n, n,
           MedianMs(reps,
                    [&] { BENCH_CUDA(WeightedDraws<uint32_t>(table, 7, ++epoch, 0, n, plan, 0)); }),
           4.0 * n);
  }
  BENCH_CUDA(FreeDrawTable(&table, 0));
  BENCH_CUDA(cudaDeviceSynchronize());

  cudaMemPool_t pool;
  BENCH_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t plan_high = 0;
  BENCH_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &plan_high));
  RunWeights(n, reps, w, reinterpret_cast<float*>(plan), pool);

  const uint64_t high = plan_high;
  std::printf("MEMORY N=%llu scratch peak %.2f GB (%.1f B/sample) besides weights and plans\n",
              static_cast<unsigned long long>(n), high / 1e9, static_cast<double>(high) / n);
  uint64_t zero = 0;
  BENCH_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  BENCH_CUDA(cudaMemPoolTrimTo(pool, 0));
  BENCH_CUDA(cudaFree(scan));
  BENCH_CUDA(cudaFree(w));
  BENCH_CUDA(cudaFree(plan));
  BENCH_CUDA(cudaFree(selected));
}

int Main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {10000000, 100000000, 1000000000};
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--sizes=", 8) == 0) {
      sizes.clear();
      for (const char* p = argv[i] + 8; *p != '\0';) {
        char* end = nullptr;
        sizes.push_back(std::strtoull(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
      }
    }
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--ops=", 6) == 0) {
      for (const char* p = argv[i] + 6; *p != '\0';) {
        const char* end = std::strchr(p, ',');
        only_ops.emplace_back(p, end != nullptr ? end - p : std::strlen(p));
        p = end != nullptr ? end + 1 : p + std::strlen(p);
      }
    }
  }
  for (const std::string& op : only_ops) {
    if (std::find(std::begin(kOps), std::end(kOps), op) == std::end(kOps)) {
      std::fprintf(stderr, "gpu_benchmark: --ops: unknown operation \"%s\"; known:", op.c_str());
      for (const char* known : kOps) std::fprintf(stderr, " %s", known);
      std::fprintf(stderr, "\n");
      return 2;
    }
  }
  const GpuPresence presence = CheckGpu();
  if (!presence.usable()) {
    std::printf("gpu_benchmark: no usable GPU: %s\n", presence.message.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  BENCH_CUDA(KeepPoolMemory(0));
  for (uint64_t n : sizes) Run(n, n >= 1000000000 ? std::min(reps, 5) : reps);
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::gpu::Main(argc, argv); }
