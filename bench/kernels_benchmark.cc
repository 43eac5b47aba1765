// Google Benchmark of the CPU backend: weight recompute (loss and multiplicative policies), plans
// with and without replacement, and shard extraction, at N = 1e6, 1e7 and 1e8.
//
//   bazel run //bench:kernels_benchmark                       # all sizes (~1 minute)
//   bazel run //bench:kernels_benchmark -- --benchmark_filter='/1000000/'  # one size
//   # A/B on a busy machine: the built binary, repeated; compare the _min rows.
//   kernels_benchmark --benchmark_filter='Recompute.*/10000000/' --benchmark_repetitions=5
#include <algorithm>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu_backend.h"
#include "kernels/testing/backend_state.h"

namespace samplerd {
namespace {

std::vector<float> Weights(uint64_t n) {
  std::vector<float> w(n);
  uint64_t s = 1;
  for (float& x : w) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(0.1 + (s >> 40) * (1.0 / (1ull << 24)));
  }
  return w;
}

ComputeBackend& Backend() {
  static ComputeBackend* backend = NewCpuBackend(0).release();
  return *backend;
}

// The weight recompute at the end of an epoch: every sample seen, current weights given (as
// the server passes them from the second epoch on). threads: the backend's (0: all cores).
void Recompute(benchmark::State& state, LossWeightKind kind, int threads) {
  const uint64_t n = state.range(0);
  const std::vector<float> ema = Weights(n);
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) stats[i] = {ema[i], 1, EpochMarker(0)};
  WeightPolicyParams p;
  p.loss = kind;
  p.alpha = 0.5;  // Not 1: exercises the deterministic Pow.
  ComputeBackend& backend = threads == 0 ? Backend() : *NewCpuBackend(threads).release();
  const std::shared_ptr<const BackendWeights> current =
      testutil::WeightsOf(backend, std::vector<float>(n, 1.0f));
  absl::StatusOr<std::unique_ptr<BackendLossStats>> loss_stats =
      testutil::LossStatsOf(backend, stats);
  if (!loss_stats.ok()) return state.SkipWithError(loss_stats.status().ToString().c_str());
  // Each iteration makes W_{e+1} (its allocation and its summary included, as at a boundary).
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        backend.RecomputeWeights(p, 0, nullptr, current.get(), loss_stats->get()));
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_RecomputeLossPolicy(benchmark::State& state) { Recompute(state, LossWeightKind::kLoss, 0); }
void BM_RecomputeMultiplicative(benchmark::State& state) {
  Recompute(state, LossWeightKind::kMultiplicative, 0);
}
// On one thread the CPU column is the whole cost: steadier than wall time on a loaded machine.
void BM_RecomputeLossPolicyOneThread(benchmark::State& state) {
  Recompute(state, LossWeightKind::kLoss, 1);
}

void Plan(benchmark::State& state, bool replacement, uint64_t m_divisor, bool weighted) {
  const uint64_t n = state.range(0);
  const std::shared_ptr<const BackendWeights> w =
      weighted ? testutil::WeightsOf(Backend(), Weights(n)) : nullptr;
  const PlanSpec spec{n, n / m_divisor, 42, replacement, SampleOrder::kWeightedRandom};
  uint64_t epoch = 0;
  for (auto _ : state) {
    auto plan = Backend().PlanEpoch(spec, epoch++, w.get());
    benchmark::DoNotOptimize(plan->size());
  }
  state.SetItemsProcessed(state.iterations() * (n / m_divisor));
}

void BM_PlanWithReplacement(benchmark::State& state) { Plan(state, true, 1, true); }
void BM_PlanWithoutReplacementAll(benchmark::State& state) { Plan(state, false, 1, false); }
void BM_PlanWithoutReplacementTenth(benchmark::State& state) { Plan(state, false, 10, true); }

void BM_ExtractShard(benchmark::State& state) {
  const uint64_t n = state.range(0);
  auto plan = Backend().PlanEpoch({n, n, 1, true, SampleOrder::kWeightedRandom}, 0, {});
  const ShardSpec shard{8, PartitionMode::kInterleaved, UnevenMode::kPad};
  std::vector<uint64_t> out(1 << 16);
  const uint64_t length = *ShardLength(n, shard, 3);
  uint64_t pos = 0;
  for (auto _ : state) {
    const uint64_t count = std::min<uint64_t>(out.size(), length - pos);
    benchmark::DoNotOptimize(
        Backend().ExtractShard(*plan, shard, 3, pos, absl::MakeSpan(out.data(), count)));
    pos = pos + count >= length ? 0 : pos + count;
  }
  state.SetItemsProcessed(state.iterations() * out.size());
}

// Wall time (UseRealTime): the backend runs on all cores, and items/s should count them all.
#define SIZES \
  Arg(1'000'000)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime()
// With --benchmark_repetitions, also the fastest repetition (the least disturbed by other load).
double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
BENCHMARK(BM_RecomputeLossPolicy)->SIZES->Iterations(3)->ComputeStatistics("min", Min);
BENCHMARK(BM_RecomputeMultiplicative)->SIZES->Iterations(3)->ComputeStatistics("min", Min);
BENCHMARK(BM_RecomputeLossPolicyOneThread)->SIZES->Iterations(3)->ComputeStatistics("min", Min);
BENCHMARK(BM_PlanWithReplacement)->SIZES->Iterations(3);
BENCHMARK(BM_PlanWithoutReplacementAll)->SIZES->Iterations(3);
BENCHMARK(BM_PlanWithoutReplacementTenth)->SIZES->Iterations(3);
BENCHMARK(BM_ExtractShard)->SIZES;

}  // namespace
}  // namespace samplerd
