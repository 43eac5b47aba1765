// Device kernels (device_plan.h, device_weights.h) == the host references (reference.h) for the
// same inputs: N from 1 to 1e7 (1e8 with --max_n=100000000), weights uniform, random, with ties,
// zeros and extreme ratios, M < N and M = N, both index widths, every shard layout, the
// shuffle's global-memory fallback; the loss policies' recompute (random parameters, with and
// without base and current weights, nothing seen, everything seen, bad inputs), the summary,
// applied losses and importance weights. reference_test checks the references against the CPU
// backend in CI.
//
// GoogleTest without Abseil. Without a usable GPU every test is skipped (GTEST_SKIP, with the
// reason), so that CI and tools/run_tests.sh count it as skipped, never as passed. On the GPU
// machine it runs from the bundle of tools/gpu/make_bundle.sh (tools/gpu/check.sh, stages 1, 2,
// 7 and 8). A difference prints one line, "FAIL [kernel] case: index K: device X, reference Y"
// (the first difference of each case; the first kMaxPrintedFailures cases per test), and the
// last line is "identity: P passed, F failed (S s)".
// Flags (besides gtest's): --max_n=N (largest N, default 10000000), --min_n=N (smallest N of the
// size loops, default 1: a later run goes on from there), --quick (N <= 5000: for
// compute-sanitizer).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/gpu_presence.h"
#include "kernels/cuda/reference.h"
#include "kernels/loss_groups.h"
#include "kernels/loss_stats.h"
#include "kernels/testing/weight_cases.h"

namespace samplerd {
namespace gpu {
namespace {

using testutil::PatternWeights;
using testutil::VariedStats;

// Flags, set by main.
uint64_t max_n = 10000000;
uint64_t min_n = 1;
bool quick = false;

// Checks passed and failed, over all tests (the last line); failures of the current test.
int passed = 0, failed = 0, failed_in_test = 0;
constexpr int kMaxPrintedFailures = 20;

// what: "[kernel] case: detail". Printed (and a gtest failure) for the first
// kMaxPrintedFailures of a test; counted always.
void Fail(const std::string& what) {
  ++failed;
  if (++failed_in_test > kMaxPrintedFailures) return;
  std::printf("FAIL %s\n", what.c_str());
  std::fflush(stdout);
  ADD_FAILURE() << what;
}

// Aborts the current case on a CUDA error (the message names the call and the error).
#define CASE_CUDA(expr)                                                                    \
  do {                                                                                     \
    const cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      Fail(name + ": " #expr ": " + cudaGetErrorName(e_) + ": " + cudaGetErrorString(e_)); \
      return;                                                                              \
    }                                                                                      \
  } while (0)

// A device array freed on scope exit, poisoned (0xAB bytes) when allocated so that an entry the
// kernel fails to write cannot pass by chance.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  cudaError_t Allocate(uint64_t n) {
    size_ = n;
    if (n == 0) return cudaSuccess;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T));
    return e != cudaSuccess ? e : cudaMemset(data_, 0xAB, n * sizeof(T));
  }
  cudaError_t Upload(const std::vector<T>& host) {
    const cudaError_t e = Allocate(host.size());
    if (e != cudaSuccess || host.empty()) return e;
    return cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<uint64_t>* out) const {
    std::vector<T> host(size_);
    if (size_ > 0) {
      const cudaError_t e =
          cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) return e;
    }
    out->assign(host.begin(), host.end());
    return cudaSuccess;
  }
  // The entries as they are (bits).
  cudaError_t Copy(std::vector<T>* out) const {
    out->resize(size_);
    if (size_ == 0) return cudaSuccess;
    return cudaMemcpy(out->data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  uint64_t size_ = 0;
};

// "0.5 (0x3f000000)": a float's value and its bits (two floats may print alike).
std::string FloatText(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.9g (0x%08x)", x, bits);
  return buffer;
}

// kernel: the device function whose output this is (the first in a pipeline that differs).
void Compare(const char* kernel, const std::string& name, const std::vector<uint64_t>& gpu,
             const std::vector<uint64_t>& ref) {
  const std::string what = std::string("[") + kernel + "] " + name;
  if (gpu.size() != ref.size()) {
    Fail(what + ": " + std::to_string(gpu.size()) + " entries, reference " +
         std::to_string(ref.size()));
    return;
  }
  for (size_t k = 0; k < gpu.size(); ++k) {
    if (gpu[k] != ref[k]) {
      Fail(what + ": index " + std::to_string(k) + ": device " + std::to_string(gpu[k]) +
           ", reference " + std::to_string(ref[k]));
      return;
    }
  }
  ++passed;
}

struct Case {
  uint64_t n;
  std::string kind;  // "uniform" (no weights) or a PatternWeights kind.
  uint64_t seed, epoch;
};

template <typename Index>
void CheckWithoutReplacement(const Case& c, const std::vector<float>& w, const float* d_w,
                             const float* d_importance_w, uint64_t m) {
  const std::string name = "without replacement n=" + std::to_string(c.n) +
                           " m=" + std::to_string(m) + " weights=" + c.kind +
                           " index_bits=" + std::to_string(8 * sizeof(Index));
  DeviceArray<Index> selected, plan;
  CASE_CUDA(plan.Allocate(m));
  std::vector<uint64_t> ref_selected;
  if (m < c.n) {
    CASE_CUDA(selected.Allocate(m));
    CASE_CUDA(SelectEfraimidisSpirakis<Index>(c.seed, c.epoch, c.n, m, d_w, selected.get(), 0));
    CASE_CUDA(cudaDeviceSynchronize());
    std::vector<uint64_t> gpu;
    CASE_CUDA(selected.Download(&gpu));
    ref_selected = reference::SelectEfraimidisSpirakis(c.seed, c.epoch, c.n, m,
                                                       w.empty() ? nullptr : w.data());
    Compare("SelectEfraimidisSpirakis", name, gpu, ref_selected);
  } else {
    ref_selected.resize(m);
    for (uint64_t i = 0; i < m; ++i) ref_selected[i] = i;
  }
  CASE_CUDA(Shuffle<Index>(c.seed, c.epoch, m, m < c.n ? selected.get() : nullptr, plan.get(), 0));
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> gpu_plan;
  CASE_CUDA(plan.Download(&gpu_plan));
  const std::vector<uint64_t> ref_plan =
      reference::Shuffle(c.seed, c.epoch, ref_selected, plan_math::ShuffleBucketBits(m));
  Compare("Shuffle", name, gpu_plan, ref_plan);

  // Shards of this plan, with importance weights when weighted.
  if (m == c.n && c.n <= 100000) {
    for (uint32_t r : {1u, 3u, 8u}) {
      for (bool interleaved : {true, false}) {
        for (UnevenMode uneven : {UnevenMode::kPad, UnevenMode::kDropLast, UnevenMode::kUneven}) {
          const ShardSpec layout{
              r, interleaved ? PartitionMode::kInterleaved : PartitionMode::kContiguous, uneven};
          for (uint32_t rank : {0u, r - 1}) {
            const uint64_t length = plan_math::ShardLength(m, layout, rank);
            const uint64_t start = length / 3;
            const uint64_t count = length - start;
            const std::string shard_name = name + " shard R=" + std::to_string(r) +
                                           " rank=" + std::to_string(rank) +
                                           " interleaved=" + std::to_string(interleaved) +
                                           " uneven=" + std::to_string(static_cast<int>(uneven));
            DeviceArray<uint64_t> indices;
            DeviceArray<float> importance;
            CASE_CUDA(indices.Allocate(count));
            CASE_CUDA(importance.Allocate(count));
            CASE_CUDA(ExtractShard<Index>(
                plan.get(), m, layout, rank, start, count, d_importance_w, indices.get(),
                d_importance_w == nullptr ? nullptr : importance.get(), 0));
            CASE_CUDA(cudaDeviceSynchronize());
            std::vector<uint64_t> gpu;
            CASE_CUDA(indices.Download(&gpu));
            const std::vector<uint64_t> ref =
                reference::Shard(ref_plan, layout, rank, start, count);
            Compare("ExtractShard", shard_name, gpu, ref);
            if (d_importance_w != nullptr && count > 0) {
              std::vector<float> host(count);
              CASE_CUDA(cudaMemcpy(host.data(), importance.get(), count * sizeof(float),
                                   cudaMemcpyDeviceToHost));
              uint64_t k = 0;
              for (; k < count; ++k) {
                const float expected = 1.0f / w[ref[k]];  // The server's 1.0f / weights[index].
                if (std::memcmp(&host[k], &expected, sizeof(float)) != 0) {
                  Fail("[ExtractShard] " + shard_name + " importance weights: index " +
                       std::to_string(k) + ": device " + FloatText(host[k]) + ", reference " +
                       FloatText(expected));
                  break;
                }
              }
              if (k == count) ++passed;
            }
          }
        }
      }
    }
  }
}

template <typename Index>
void CheckWithReplacement(const Case& c, const std::vector<float>& w, const float* d_w,
                          uint32_t max_bits, uint64_t m, uint64_t first) {
  const std::string name = "with replacement n=" + std::to_string(c.n) + " m=" + std::to_string(m) +
                           " first=" + std::to_string(first) + " weights=" + c.kind +
                           " index_bits=" + std::to_string(8 * sizeof(Index));
  DeviceArray<Index> plan;
  CASE_CUDA(plan.Allocate(m));
  std::vector<uint64_t> prefix;
  if (d_w == nullptr) {
    CASE_CUDA(UniformDraws<Index>(c.seed, c.epoch, c.n, first, m, plan.get(), 0));
  } else {
    DeviceDrawTable table;
    CASE_CUDA(BuildDrawTable<Index>(d_w, c.n, max_bits, &table, 0));
    const cudaError_t e = WeightedDraws<Index>(table, c.seed, c.epoch, first, m, plan.get(), 0);
    const uint64_t total = table.total;
    CASE_CUDA(FreeDrawTable(&table, 0));
    CASE_CUDA(e);
    prefix = reference::QuantisedPrefix(w.data(), c.n);
    if (total != prefix.back()) {
      Fail("[BuildDrawTable] " + name + ": total " + std::to_string(total) + ", reference " +
           std::to_string(prefix.back()));
    }
  }
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> gpu;
  CASE_CUDA(plan.Download(&gpu));
  Compare(d_w == nullptr ? "UniformDraws" : "WeightedDraws", name, gpu,
          reference::Draws(prefix, c.n, c.seed, c.epoch, first, m));
}

template <typename Index>
void CheckCase(const Case& c, bool thorough) {
  const std::string name = "n=" + std::to_string(c.n) + " weights=" + c.kind;
  const std::vector<float> w =
      c.kind == "uniform" ? std::vector<float>() : PatternWeights(c.kind, c.n, 7);
  DeviceArray<float> d_weights;
  CASE_CUDA(d_weights.Upload(w));
  const float* d_w = w.empty() ? nullptr : d_weights.get();
  uint64_t positive = c.n;
  uint32_t max_bits = 0;
  if (d_w != nullptr) {
    DeviceArray<WeightScan> scan;
    CASE_CUDA(scan.Allocate(1));
    CASE_CUDA(ScanWeights(d_w, c.n, scan.get(), 0));
    WeightScan got;
    CASE_CUDA(cudaMemcpy(&got, scan.get(), sizeof got, cudaMemcpyDeviceToHost));
    positive = 0;
    for (float x : w) {
      positive += x > 0;
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      if (bits != 0x80000000u && bits > max_bits) max_bits = bits;
    }
    if (got.positive != positive || got.max_bits != max_bits || got.first_bad != ~uint64_t{0}) {
      Fail("[ScanWeights] " + name + ": positive " + std::to_string(got.positive) + " (reference " +
           std::to_string(positive) + "), max_bits " + std::to_string(got.max_bits) + " (" +
           std::to_string(max_bits) + "), first_bad " + std::to_string(got.first_bad));
    } else {
      ++passed;
    }
  }
  // Without replacement: M = N ignores the weights (every index once), M < N selects.
  std::vector<uint64_t> ms = {c.n};
  if (thorough)
    ms = {1, c.n / 10, positive - 1, positive, c.n};
  else if (c.kind != "uniform")
    ms = {c.n / 10};
  for (uint64_t m : ms) {
    if (m == 0 || m > positive) continue;
    CheckWithoutReplacement<Index>(c, w, m == c.n ? nullptr : d_w, d_w, m);
  }
  for (uint64_t m :
       thorough ? std::vector<uint64_t>{c.n, 2 * c.n + 1} : std::vector<uint64_t>{c.n}) {
    CheckWithReplacement<Index>(c, w, d_w, max_bits, m, 0);
  }
  if (thorough) CheckWithReplacement<Index>(c, w, d_w, max_bits, 1000, uint64_t{1} << 35);
}

void CheckScanFindsTheFirstBadWeight() {
  const std::string name = "ScanWeights bad";
  std::vector<float> w(100000, 1.0f);
  w[70001] = -1.0f;
  w[90000] = NAN;
  w[5] = -0.0f;  // Allowed: a zero weight.
  DeviceArray<float> d;
  CASE_CUDA(d.Upload(w));
  DeviceArray<WeightScan> scan;
  CASE_CUDA(scan.Allocate(1));
  CASE_CUDA(ScanWeights(d.get(), w.size(), scan.get(), 0));
  WeightScan got;
  CASE_CUDA(cudaMemcpy(&got, scan.get(), sizeof got, cudaMemcpyDeviceToHost));
  if (got.first_bad != 70001 || got.positive != 99997) {
    Fail("[ScanWeights] " + name + ": first_bad " + std::to_string(got.first_bad) + ", positive " +
         std::to_string(got.positive));
  } else {
    ++passed;
  }
}

template <typename Index>
void CheckShuffleFallback(uint64_t m, uint32_t capacity) {
  const std::string name =
      "shuffle fallback m=" + std::to_string(m) + " capacity=" + std::to_string(capacity);
  std::vector<uint64_t> inputs(m);
  for (uint64_t k = 0; k < m; ++k) inputs[k] = 5 * k + 1;
  DeviceArray<Index> d_in, d_out;
  CASE_CUDA(d_in.Upload(std::vector<Index>(inputs.begin(), inputs.end())));
  CASE_CUDA(d_out.Allocate(m));
  CASE_CUDA(ShuffleWithCapacity<Index>(17, 2, m, d_in.get(), d_out.get(), capacity, 0));
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> gpu;
  CASE_CUDA(d_out.Download(&gpu));
  Compare("ShuffleWithCapacity", name, gpu,
          reference::Shuffle(17, 2, inputs, plan_math::ShuffleBucketBits(m)));
}

void CheckSequential(uint64_t n) {
  const std::string name = "sequential n=" + std::to_string(n);
  DeviceArray<uint32_t> d;
  CASE_CUDA(d.Allocate(n));
  CASE_CUDA(SequentialPlan<uint32_t>(n, d.get(), 0));
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> gpu, ref(n);
  CASE_CUDA(d.Download(&gpu));
  for (uint64_t i = 0; i < n; ++i) ref[i] = i;
  Compare("SequentialPlan", name, gpu, ref);
}

// ---- Weights (device_weights.h) ---------------------------------------------------------------

// Loss statistics in the device's layout (DeviceLossStats), uploaded from and read back as
// SampleLossStats through the host conversions of device_weights.h, the ones CudaLossStats uses.
class DeviceStats {
 public:
  cudaError_t Upload(const std::vector<SampleLossStats>& host) {
    n_ = host.size();
    const uint64_t words = LossStatsWords(n_);
    std::vector<float> ema(n_);
    std::vector<uint32_t> meta(n_), seen(words), defined(words);
    SplitLossStats(host.data(), n_, ema.data(), meta.data(), seen.data(), defined.data());
    cudaError_t e = memory_.Allocate(LossStatsBytes(n_));
    if (e != cudaSuccess) return e;
    const DeviceLossStats d = get();
    e = cudaMemcpy(d.ema, ema.data(), n_ * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
      e = cudaMemcpy(d.meta, meta.data(), n_ * sizeof(uint32_t), cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpy(d.seen, seen.data(), words * sizeof(uint32_t), cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpy(d.defined, defined.data(), words * sizeof(uint32_t), cudaMemcpyHostToDevice);
    }
    return e;
  }
  // The statistics, and whether the device's bits agree with them (the bits are derived).
  cudaError_t Download(std::vector<SampleLossStats>* out, bool* bits_agree) const {
    const uint64_t words = LossStatsWords(n_);
    std::vector<float> ema(n_);
    std::vector<uint32_t> meta(n_), seen(words), defined(words);
    const DeviceLossStats d = get();
    cudaError_t e = cudaMemcpy(ema.data(), d.ema, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) {
      e = cudaMemcpy(meta.data(), d.meta, n_ * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpy(seen.data(), d.seen, words * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpy(defined.data(), d.defined, words * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    }
    if (e != cudaSuccess) return e;
    out->resize(n_);
    JoinLossStats(ema.data(), meta.data(), n_, out->data());
    std::vector<float> ema2(n_);
    std::vector<uint32_t> meta2(n_), seen2(words), defined2(words);
    SplitLossStats(out->data(), n_, ema2.data(), meta2.data(), seen2.data(), defined2.data());
    *bits_agree = seen == seen2 && defined == defined2;
    return cudaSuccess;
  }
  DeviceLossStats get() const { return LossStatsIn(memory_.get(), n_); }

 private:
  DeviceArray<uint8_t> memory_;
  uint64_t n_ = 0;
};

bool SameBytes(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// One recompute on the device against the reference: the check always, the weights when it
// passes; when it fails, `out` must be untouched (still the 0xAB poison). `irreducible`:
// REDUCIBLE_LOSS's irreducible losses (params.irreducible is set to their copy on the device
// for the device, to the host vector for the reference).
void CheckRecompute(const std::string& name, const RecomputeParams& params,
                    const std::vector<float>& base, const std::vector<float>& current,
                    const std::vector<SampleLossStats>& stats,
                    const std::vector<float>& irreducible = {}) {
  const uint64_t n = stats.size();
  DeviceArray<float> d_base, d_current, d_out, d_irreducible;
  DeviceStats d_stats;
  CASE_CUDA(d_base.Upload(base));
  CASE_CUDA(d_current.Upload(current));
  CASE_CUDA(d_stats.Upload(stats));
  CASE_CUDA(d_irreducible.Upload(irreducible));
  CASE_CUDA(d_out.Allocate(n));
  RecomputeParams device_params = params, host_params = params;
  device_params.irreducible = irreducible.empty() ? nullptr : d_irreducible.get();
  host_params.irreducible = irreducible.empty() ? nullptr : irreducible.data();
  RecomputeCheck check;
  CASE_CUDA(RecomputeWeights(device_params, n, base.empty() ? nullptr : d_base.get(),
                             current.empty() ? nullptr : d_current.get(), d_stats.get(),
                             d_out.get(), &check, 0));
  CASE_CUDA(cudaDeviceSynchronize());
  const reference::Recomputed want =
      reference::RecomputeWeights(host_params, n, base.empty() ? nullptr : base.data(),
                                  current.empty() ? nullptr : current.data(), stats.data());
  if (check.first_bad != want.check.first_bad || check.base_positive != want.check.base_positive ||
      check.current_positive != want.check.current_positive) {
    Fail("[RecomputeWeights] " + name + ": check first_bad " + std::to_string(check.first_bad) +
         " (reference " + std::to_string(want.check.first_bad) + "), base_positive " +
         std::to_string(check.base_positive) + " (" + std::to_string(want.check.base_positive) +
         "), current_positive " + std::to_string(check.current_positive) + " (" +
         std::to_string(want.check.current_positive) + ")");
    return;
  }
  std::vector<float> got;
  CASE_CUDA(d_out.Copy(&got));
  if (want.weights.empty()) {
    const std::vector<uint8_t> poison(n * sizeof(float), 0xAB);
    if (!SameBytes(got.data(), poison.data(), poison.size())) {
      Fail("[RecomputeWeights] " + name + ": the check failed but out was written");
      return;
    }
    ++passed;
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (!SameBytes(&got[i], &want.weights[i], sizeof(float))) {
      Fail("[RecomputeWeights] " + name + ": index " + std::to_string(i) + ": device " +
           FloatText(got[i]) + ", reference " + FloatText(want.weights[i]));
      return;
    }
  }
  ++passed;
}

// Random parameters of the policies (as ValidatePolicy allows them).
RecomputeParams RandomParams(std::mt19937_64& rng, int round) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  RecomputeParams p;
  p.loss = round % 3 == 2 ? LossWeightKind::kMultiplicative : LossWeightKind::kLoss;
  const double alphas[] = {1.0, 0.0, 0.5, 2.0, 8.0, 0.3};
  p.alpha = alphas[round % 6];
  p.epsilon = round % 4 == 0 ? 1e-3 : 1e-6 + unit(rng);
  p.mix = round % 5 == 0 ? 0.0 : unit(rng);
  p.has_prior_loss = round % 7 == 3;
  p.prior_loss = p.has_prior_loss ? unit(rng) : 0.0;
  p.eta = 0.01 + 10 * unit(rng);
  p.clamp_lo = 0.01 + 0.99 * unit(rng);
  p.clamp_hi = 1.0 + 20 * unit(rng);
  p.marker = EpochMarker(5);
  return p;
}

// The kFactor variants of a round's policy (after RandomParams' draws, so that every round keeps
// its parameters): REDUCIBLE_LOSS instead of LOSS in some rounds, the effective sample size floor
// in others (both in some).
void FactorVariants(int round, RecomputeParams* p) {
  if (p->loss == LossWeightKind::kMultiplicative) return;
  if (round % 4 == 1 || round % 4 == 2) p->loss = LossWeightKind::kReducibleLoss;
  if (round % 5 == 2 || round % 5 == 4) p->min_effective_fraction = 0.25 + 0.125 * (round % 6);
}

// Irreducible losses for REDUCIBLE_LOSS (finite, >= 0), in the range of VariedStats' EMAs so
// that some signals are 0 and some positive; none for the other policies.
std::vector<float> IrreducibleFor(const RecomputeParams& p, uint64_t n, uint64_t seed) {
  if (p.loss != LossWeightKind::kReducibleLoss) return {};
  std::mt19937_64 rng(seed);
  std::vector<float> irreducible(n);
  for (uint64_t i = 0; i < n; ++i) {
    irreducible[i] = i % 5 == 0 ? 0.0f : static_cast<float>(rng() % 4096) / 1024.0f;
  }
  return irreducible;
}

std::string PolicyName(const RecomputeParams& p) {
  const char* kind = p.loss == LossWeightKind::kMultiplicative ? " multiplicative"
                     : p.loss == LossWeightKind::kReducibleLoss ? " reducible_loss"
                                                                : " loss";
  return kind + (p.min_effective_fraction > 0
                     ? " floor=" + std::to_string(p.min_effective_fraction)
                     : std::string());
}

void CheckRecomputes(uint64_t n, int rounds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const char* kinds[] = {"random", "ties", "zeros", "extreme"};
  for (int round = 0; round < rounds; ++round) {
    RecomputeParams p = RandomParams(rng, round);
    FactorVariants(round, &p);
    const std::string weights = kinds[round % 4];
    std::vector<float> base = round % 2 ? PatternWeights(weights, n, round) : std::vector<float>();
    std::vector<float> current = round % 4 == 1
                                     ? std::vector<float>()
                                     : PatternWeights(kinds[(round + 1) % 4], n, round + 50);
    std::vector<SampleLossStats> stats = VariedStats(n, seed + round, p.marker);
    std::string seen = "varied";
    if (round % 8 == 5) {
      stats.assign(n, SampleLossStats{});
      seen = "nothing seen";
    } else if (round % 8 == 6) {
      for (uint64_t i = 0; i < n; ++i) stats[i] = {0.25f + i % 3, 2, p.marker};
      seen = "all seen";
    }
    const std::string name =
        std::string("recompute n=") + std::to_string(n) + " round=" + std::to_string(round) +
        PolicyName(p) + " alpha=" + std::to_string(p.alpha) +
        " base=" + (base.empty() ? "none" : weights) +
        " current=" + (current.empty() ? "none" : kinds[(round + 1) % 4]) + " stats=" + seen;
    CheckRecompute(name, p, base, current, stats, IrreducibleFor(p, n, seed + round));
  }
}

// Loss within groups (RecomputeParams::within_groups): class-balanced-like bases of 1 to 97
// groups, some samples excluded (base 0), against the reference.
void CheckRecomputesWithinGroups(uint64_t n, int rounds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    RecomputeParams p = RandomParams(rng, 3 * round);  // kLoss.
    FactorVariants(round, &p);
    p.within_groups = true;
    const uint64_t classes = 1 + (round * 31) % 97;
    std::vector<float> base(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t c = (i * i + static_cast<uint64_t>(round)) % classes;
      base[i] = i % 23 == 7 && n > 1 ? 0.0f : 1.0f / static_cast<float>(1 + c);
    }
    LossGroupTable groups;
    FindLossGroups(base.data(), n, 65536, &groups);
    p.group_keys = groups.keys.data();
    p.group_counts = groups.counts.data();
    p.num_groups = groups.size();
    std::vector<SampleLossStats> stats = VariedStats(n, seed + round, p.marker);
    if (round % 5 == 4) stats.assign(n, SampleLossStats{});
    CheckRecompute("recompute within groups n=" + std::to_string(n) + " round=" +
                       std::to_string(round) + PolicyName(p) +
                       " groups=" + std::to_string(groups.size()),
                   p, base, {}, stats, IrreducibleFor(p, n, seed + round));
  }
}

// Bad inputs: the device's check names the reference's sample (the lowest bad index, in any
// field), an all-zero base or current is refused, and `out` stays untouched.
void CheckRecomputeRefusals() {
  const uint64_t n = 3 * 4096 + 5;
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
    RecomputeParams p;
    p.loss = kind;
    p.marker = 3;
    const std::string k = kind == LossWeightKind::kLoss ? "loss" : "multiplicative";
    std::vector<float> base(n, 1.0f), current(n, 1.0f);
    std::vector<SampleLossStats> stats(n, SampleLossStats{0.5f, 1, 3});
    stats[17] = {NAN, 0, 0};  // Undefined EMA: not an error.
    base[9000] = -1.0f;
    stats[5000].ema_loss = INFINITY;
    current[12000] = NAN;
    CheckRecompute("refusal " + k + " ema 5000", p, base, current, stats);
    stats[5000].ema_loss = 0.5f;
    CheckRecompute("refusal " + k + " base 9000", p, base, current, stats);
    base[9000] = 1.0f;
    CheckRecompute("refusal " + k + " current 12000", p, base, current, stats);
    current[12000] = 1.0f;
    stats[4096] = {NAN, 0, 7};  // Restored statistics: last_epoch > 0 defines the EMA.
    CheckRecompute("refusal " + k + " restored 4096", p, base, current, stats);
    stats[4096] = {0.5f, 1, 3};
    CheckRecompute("refusal " + k + " zero base", p, std::vector<float>(n, 0.0f), current, stats);
    // All-zero current: refused by the multiplicative policy only.
    CheckRecompute("refusal " + k + " zero current", p, base, std::vector<float>(n, -0.0f), stats);
  }
}

void CheckSummary(const std::string& kind, uint64_t n) {
  const std::string name = "summary n=" + std::to_string(n) + " weights=" + kind;
  std::vector<float> w = PatternWeights(kind, n, 5);
  if (kind == "zeros") {
    for (uint64_t i = 0; i < n; i += 7) {
      if (w[i] == 0) w[i] = -0.0f;  // Both zeros: min is +0 whichever comes first.
    }
  }
  DeviceArray<float> d;
  CASE_CUDA(d.Upload(w));
  WeightSummaryValues got;
  CASE_CUDA(SummarizeWeights(d.get(), n, &got, 0));
  const WeightSummaryValues want = reference::SummarizeWeights(w.data(), n);
  if (!SameBytes(&got.min, &want.min, 8) || !SameBytes(&got.max, &want.max, 8) ||
      !SameBytes(&got.mean, &want.mean, 8) ||
      !SameBytes(&got.effective_sample_size, &want.effective_sample_size, 8) ||
      got.zero_count != want.zero_count) {
    char buffer[512];
    std::snprintf(buffer, sizeof buffer,
                  ": min %a max %a mean %a ess %a zeros %llu; reference %a %a %a %a %llu", got.min,
                  got.max, got.mean, got.effective_sample_size,
                  static_cast<unsigned long long>(got.zero_count), want.min, want.max, want.mean,
                  want.effective_sample_size, static_cast<unsigned long long>(want.zero_count));
    Fail("[SummarizeWeights] " + name + buffer);
    return;
  }
  ++passed;
}

// Losses applied on the device (distinct indices, some samples already holding a loss of the
// epoch: the duplicates ApplyLoss drops) == ApplyLoss one by one; importance weights.
void CheckApplyLossesAndImportance(uint64_t n) {
  const std::string name = "apply losses n=" + std::to_string(n);
  std::mt19937_64 rng(n);
  std::vector<SampleLossStats> stats = VariedStats(n, 9, EpochMarker(4));
  DeviceStats d_stats;
  CASE_CUDA(d_stats.Upload(stats));
  for (uint64_t epoch : {4ull, 5ull, 65535ull + 4}) {
    std::vector<uint64_t> indices;
    std::vector<float> losses;
    for (uint64_t i = 0; i < n; ++i) {
      if (rng() % 3 == 0) continue;
      indices.push_back(i);
      losses.push_back(static_cast<float>(rng() % 100000) / 77.0f);
    }
    std::shuffle(indices.begin(), indices.end(), rng);
    DeviceArray<uint64_t> d_indices;
    DeviceArray<float> d_losses;
    CASE_CUDA(d_indices.Upload(indices));
    CASE_CUDA(d_losses.Upload(losses));
    CASE_CUDA(ApplyLosses(d_stats.get(), d_indices.get(), d_losses.get(), indices.size(),
                          EpochMarker(epoch), 0.875f, 0));
    reference::ApplyLosses(stats, indices, losses, EpochMarker(epoch), 0.875f);
  }
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<SampleLossStats> got;
  bool bits_agree = false;
  CASE_CUDA(d_stats.Download(&got, &bits_agree));
  if (!bits_agree) {
    Fail("[ApplyLosses] " + name + ": the device's seen/defined bits disagree with its statistics");
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (!SameBytes(&got[i], &stats[i], sizeof(SampleLossStats))) {
      Fail("[ApplyLosses] " + name + ": index " + std::to_string(i) + ": device {ema " +
           FloatText(got[i].ema_loss) + ", count " + std::to_string(got[i].count) + ", epoch " +
           std::to_string(got[i].last_epoch) + "}, reference {ema " + FloatText(stats[i].ema_loss) +
           ", count " + std::to_string(stats[i].count) + ", epoch " +
           std::to_string(stats[i].last_epoch) + "}");
      return;
    }
  }
  ++passed;

  const std::string importance = "importance n=" + std::to_string(n);
  const std::vector<float> w = PatternWeights("extreme", n, 6);
  std::vector<uint64_t> indices(n / 3 + 1);
  for (uint64_t& i : indices) i = rng() % n;
  DeviceArray<float> d_w, d_out;
  DeviceArray<uint64_t> d_indices;
  CASE_CUDA(d_w.Upload(w));
  CASE_CUDA(d_indices.Upload(indices));
  CASE_CUDA(d_out.Allocate(indices.size()));
  CASE_CUDA(GatherImportance(d_w.get(), d_indices.get(), indices.size(), d_out.get(), 0));
  CASE_CUDA(cudaDeviceSynchronize());
  std::vector<float> out;
  CASE_CUDA(d_out.Copy(&out));
  const std::vector<float> want = reference::GatherImportance(w.data(), indices);
  for (size_t k = 0; k < want.size(); ++k) {
    if (!SameBytes(&out[k], &want[k], sizeof(float))) {
      Fail("[GatherImportance] " + importance + ": index " + std::to_string(k) + ": device " +
           FloatText(out[k]) + ", reference " + FloatText(want[k]));
      return;
    }
  }
  ++passed;
}

// The recompute (global and within groups) and the summary at n; seeds seed and seed + 1.
void CheckWeightsAt(uint64_t n, uint64_t seed) {
  // Big N: a few rounds (the reference runs on one core: ~1 s per 1e7 samples and pass).
  const int rounds = n <= 65537 ? (quick ? 6 : 24) : n <= 1000003 ? 12 : 2;
  CheckRecomputes(n, rounds, seed);
  CheckRecomputesWithinGroups(n, rounds, seed + 1);
  for (const char* kind : {"random", "ties", "zeros", "extreme"}) {
    if (n >= 10000000 && std::string(kind) != "random") continue;
    CheckSummary(kind, n);
  }
}

// The weight kinds of the plans at n: fewer at big N (the references run on one CPU core).
std::vector<std::string> PlanKinds(uint64_t n) {
  if (n >= 10000000) return {"uniform", "random"};
  return {"uniform", "random", "ties", "zeros", "extreme"};
}

// The plans at n, each kind of PlanKinds(n) with the next seed.
void CheckPlansAt(uint64_t n, uint64_t* seed) {
  for (const std::string& kind : PlanKinds(n)) {
    const Case c{n, kind, (*seed)++, n % 5};
    CheckCase<uint32_t>(c, /*thorough=*/n <= 1000003);
    if (n <= 65537) CheckCase<uint64_t>(c, true);  // The wide path at small N.
  }
}

const GpuPresence& Presence() {
  static const GpuPresence* presence = [] {
    auto* p = new GpuPresence(CheckGpu());
    if (p->usable()) {
      std::printf("GPU: %s\n", p->message.c_str());
      if (KeepPoolMemory(0) != cudaSuccess) std::printf("note: KeepPoolMemory failed\n");
    }
    return p;
  }();
  return *presence;
}

class IdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Presence().usable()) GTEST_SKIP() << "no usable GPU: " << Presence().message;
    failed_in_test = 0;
  }
  void TearDown() override {
    if (failed_in_test > kMaxPrintedFailures) {
      std::printf("... and %d more failures in this test\n", failed_in_test - kMaxPrintedFailures);
    }
  }
};

// Plans, shards, recomputes and summaries for every N in [--min_n, --max_n], smallest first, a
// progress line after each (a run cut short by a time limit still says how far it got). The
// inputs of a case do not depend on --min_n (seeds are counted from N = 1).
TEST_F(IdentityTest, EverySize) {
  const std::vector<uint64_t> plan_sizes = {1,    2,    3,    31,    32,      33,       1000,
                                            1024, 1025, 4097, 65537, 1000003, 10000000, 100000000};
  const std::vector<uint64_t> weight_sizes = {1,    2,     3,       4095,     4096,
                                              4097, 65537, 1000003, 10000000, 100000000};
  std::vector<uint64_t> sizes = plan_sizes;
  sizes.insert(sizes.end(), weight_sizes.begin(), weight_sizes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  uint64_t plan_seed = 1, weight_seed = 100;
  for (uint64_t n : sizes) {
    if (n > max_n) break;
    const bool plans = std::count(plan_sizes.begin(), plan_sizes.end(), n) > 0;
    const bool weights = std::count(weight_sizes.begin(), weight_sizes.end(), n) > 0;
    if (n < min_n) {  // Not run here; its seeds are still taken.
      if (plans) plan_seed += PlanKinds(n).size();
      if (weights) weight_seed += 2;
      continue;
    }
    if (plans) CheckPlansAt(n, &plan_seed);
    if (weights) {
      CheckWeightsAt(n, weight_seed);
      weight_seed += 2;
    }
    std::printf("n=%llu done: %d passed, %d failed\n", static_cast<unsigned long long>(n), passed,
                failed);
    std::fflush(stdout);
  }
}

// Cases of fixed sizes: bad inputs of the recompute, applied losses and importance weights,
// ScanWeights' first bad weight, the sequential plan, the shuffle's global-memory fallback.
TEST_F(IdentityTest, FixedCases) {
  CheckRecomputeRefusals();
  CheckApplyLossesAndImportance(quick ? 3000 : 200003);
  CheckScanFindsTheFirstBadWeight();
  CheckSequential(quick ? 1000 : 3000017);
  for (uint64_t m : {2000ull, 100000ull}) {
    CheckShuffleFallback<uint32_t>(m, 64);    // Every block of buckets falls back.
    CheckShuffleFallback<uint64_t>(m, 3000);  // Some blocks fall back.
  }
}

}  // namespace
}  // namespace gpu
}  // namespace samplerd

int main(int argc, char** argv) {
  using samplerd::gpu::max_n;
  using samplerd::gpu::min_n;
  using samplerd::gpu::quick;
  ::testing::InitGoogleTest(&argc, argv);  // Removes gtest's flags.
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_n=", 8) == 0) {
      max_n = std::strtoull(argv[i] + 8, nullptr, 10);
    } else if (std::strncmp(argv[i], "--min_n=", 8) == 0) {
      min_n = std::strtoull(argv[i] + 8, nullptr, 10);
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "identity_test: unknown flag '%s' (--max_n=N, --min_n=N, --quick)\n",
                   argv[i]);
      return 2;
    }
  }
  if (quick) max_n = std::min<uint64_t>(max_n, 5000);
  const auto start = std::chrono::steady_clock::now();
  const int status = RUN_ALL_TESTS();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (samplerd::gpu::Presence().usable()) {
    std::printf("identity: %d passed, %d failed (%.1f s)\n", samplerd::gpu::passed,
                samplerd::gpu::failed, seconds);
  }
  return status;
}
