// The CPU ComputeBackend: multithreaded, deterministic for any thread count.
#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/plan_math.h"
#include "kernels/det_math.h"
#include "kernels/exact_sum.h"
#include "kernels/internal/draw_table.h"
#include "kernels/internal/es_select.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/recompute_passes.h"
#include "kernels/internal/shuffle.h"
#include "kernels/internal/simd_level.h"
#include "kernels/philox.h"

namespace samplerd {
namespace {

using internal::ParallelForChunks;

constexpr uint64_t kGrain = 1 << 16;  // Items per chunk of element-wise work.

absl::Status ValidatePlanInputs(const PlanSpec& spec, absl::Span<const float> weights) {
  if (absl::Status s = ValidatePlanSpec(spec); !s.ok()) return s;
  if (!weights.empty()) {
    if (weights.size() != spec.num_samples) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: ", weights.size(), " values for num_samples ", spec.num_samples));
    }
  }
  return absl::OkStatus();
}

// ValidateWeights (finite, >= 0, not all 0) in parallel; the number of positive weights.
absl::StatusOr<uint64_t> CountPositiveWeights(int threads, absl::Span<const float> weights) {
  const uint64_t n = weights.size();
  std::vector<uint64_t> positive(internal::NumChunks(n, kGrain), 0);
  std::vector<uint8_t> bad(positive.size(), 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    // On the IEEE bits (so that it vectorises): finite and >= 0 is [+0, +inf) or -0;
    // positive is (+0, +inf).
    uint64_t count = 0, bad_count = 0;
    for (uint64_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &weights[i], sizeof bits);
      bad_count += (bits >= 0x7f800000u) & (bits != 0x80000000u);
      count += bits - 1u < 0x7f7fffffu;
    }
    positive[c] = count;
    bad[c] = bad_count > 0;
  });
  uint64_t total = 0;
  for (uint64_t c : positive) total += c;
  if (total == 0 || std::find(bad.begin(), bad.end(), 1) != bad.end()) {
    return ValidateWeights(weights);  // Names the first bad weight (or all zero).
  }
  return total;
}

// Checks the sizes of RecomputeWeights' inputs (their values are checked by the first pass).
absl::Status CheckRecomputeSizes(absl::Span<const float> base, absl::Span<const float> current,
                                 LossStatsView stats, absl::Span<float> out) {
  const size_t n = out.size();
  if (n == 0) return absl::InvalidArgumentError("weights: num_samples = 0");
  auto size_error = [n](const char* field, size_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", got, " values for num_samples ", n));
  };
  if (!base.empty() && base.size() != n) return size_error("base", base.size());
  if (!current.empty() && current.size() != n) return size_error("current", current.size());
  if (stats.size() != n) return size_error("stats", stats.size());
  return absl::OkStatus();
}

// The error for sample i, the first with a bad entry (internal::ChunkScan::first_bad): names
// the field and the value.
absl::Status BadRecomputeInput(absl::Span<const float> base, absl::Span<const float> current,
                               LossStatsView stats, uint64_t i) {
  auto valid_weight = [](float w) { return std::isfinite(w) && w >= 0; };
  if (!base.empty() && !valid_weight(base[i])) {
    return absl::InvalidArgumentError(
        absl::StrCat("base[", i, "] = ", base[i], ": must be finite and >= 0"));
  }
  if (!current.empty() && !valid_weight(current[i])) {
    return absl::InvalidArgumentError(
        absl::StrCat("current[", i, "] = ", current[i], ": must be finite and >= 0"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("stats[", i, "].ema_loss = ", stats[i].ema_loss, ": must be finite and >= 0"));
}

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(int num_threads) : threads_(num_threads) {}

  std::string name() const override { return "cpu"; }

  absl::Status RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                absl::Span<const float> base, absl::Span<const float> current,
                                LossStatsView stats, absl::Span<float> out) override;

  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 absl::Span<const float> weights) override;

  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override;

  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override;

 private:
  // pass(begin, end, results) over the groups of chunks of [0, n) (recompute_passes.h), in
  // parallel: one result per chunk, in chunk order.
  template <typename Result, typename Pass>
  std::vector<Result> OverChunkGroups(uint64_t n, const Pass& pass) const {
    std::vector<Result> results(internal::NumChunks(n, internal::kSumChunk));
    ParallelForChunks(threads_, n, internal::kSumChunk * internal::kChunksPerGroup,
                      [&](uint64_t g, uint64_t b, uint64_t e) {
                        pass(b, e, results.data() + g * internal::kChunksPerGroup);
                      });
    return results;
  }

  // The exact sum (exact_sum.h) over [0, n) of the terms that pass(begin, end, sums) sums per
  // chunk.
  template <typename Pass>
  double ExactSum(uint64_t n, const Pass& pass) const {
    const std::vector<exact_sum::ChunkSum> sums = OverChunkGroups<exact_sum::ChunkSum>(n, pass);
    return exact_sum::Total(sums.data(), sums.size());
  }

  // out[i] = the raw weights of `rule` (internal::RawWeightRule; finite, >= 0, not all 0 where
  // not excluded), whose sum is raw_sum, scaled to mean 1, clamped to [lo, hi], scaled to mean
  // 1 again; excluded samples (a zero base or current weight) get exactly 0, so they are never
  // drawn.
  void NormaliseClampWrite(const internal::RecomputeArrays& arrays,
                           const internal::RawWeightRule& rule, double raw_sum, double lo,
                           double hi, uint64_t n) const {
    const internal::SimdLevel level = internal::BestSimdLevel();
    // mean == 0: every raw weight vanished (e.g. all loss factors underflowed against a sample
    // that the base excludes); the samples that are not excluded are then equal.
    const internal::ClampRule clamp{raw_sum / static_cast<double>(n), lo, hi};
    const double mean_clamped =
        ExactSum(n,
                 [&](uint64_t b, uint64_t e, exact_sum::ChunkSum* sums) {
                   internal::SumClampedChunks(level, arrays, rule, clamp, b, e, sums);
                 }) /
        static_cast<double>(n);
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      internal::WriteWeightsRange(level, arrays, rule, clamp, mean_clamped, b, e);
    });
  }

  // Sizes `indices` to M and writes the plan (validated inputs) into it: uint32_t when
  // N <= 2^32, else uint64_t.
  template <typename T>
  void FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                LargeVector<T>& indices) const;

  const int threads_;
};

absl::Status CpuBackend::RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                          absl::Span<const float> base,
                                          absl::Span<const float> current, LossStatsView stats,
                                          absl::Span<float> out) {
  if (absl::Status s = ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = CheckRecomputeSizes(base, current, stats, out); !s.ok()) return s;
  const uint64_t n = out.size();
  const internal::SimdLevel level = internal::BestSimdLevel();
  const internal::RecomputeArrays arrays{base.empty() ? nullptr : base.data(),
                                         current.empty() ? nullptr : current.data(), stats.data(),
                                         out.data()};
  internal::RawWeightRule rule;
  rule.kind = policy.loss;
  rule.mix = policy.mix;
  rule.eta = policy.eta;
  rule.marker = EpochMarker(closed_epoch);

  // Pass 1: validation, and what the policy needs from the statistics (for MULTIPLICATIVE the
  // raw weights' sum). Nothing is written before it is complete.
  const std::vector<internal::ChunkScan> scans = OverChunkGroups<internal::ChunkScan>(
      n, [&](uint64_t b, uint64_t e, internal::ChunkScan* chunk_scans) {
        internal::ScanChunks(level, arrays, rule, b, e, chunk_scans);
      });
  internal::ChunkScan all;
  std::vector<exact_sum::ChunkSum> ema_sums, raw_sums;
  ema_sums.reserve(scans.size());
  raw_sums.reserve(scans.size());
  for (const internal::ChunkScan& scan : scans) {
    // The lowest bad index, whatever the thread count: chunks are in index order.
    if (scan.first_bad != internal::kNoSample) {
      return BadRecomputeInput(base, current, stats, scan.first_bad);
    }
    all.base_positive |= scan.base_positive;
    all.current_positive |= scan.current_positive;
    all.seen += scan.seen;
    ema_sums.push_back(scan.ema_sum);
    all.ema_max = std::max(all.ema_max, scan.ema_max);
    all.unseen |= scan.unseen;
    raw_sums.push_back(scan.raw_sum);
  }
  if (!base.empty() && !all.base_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("base: all ", n, " weights are 0; at least one must be > 0"));
  }
  if (policy.loss == LossWeightKind::kMultiplicative && !current.empty() && !all.current_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("current: all ", n, " weights are 0; at least one must be > 0"));
  }

  switch (policy.loss) {
    case LossWeightKind::kNone: {
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        if (base.empty()) {
          std::fill(out.begin() + b, out.begin() + e, 1.0f);
        } else {
          std::copy(base.begin() + b, base.begin() + e, out.begin() + b);
        }
      });
      return absl::OkStatus();
    }
    case LossWeightKind::kLoss: {
      // Prior loss of samples never seen: configured, or the mean EMA of the seen samples.
      internal::LossFactorParams factors;
      if (policy.prior_loss.has_value()) {
        factors.prior = *policy.prior_loss;
      } else if (all.seen > 0) {
        factors.prior =
            exact_sum::Total(ema_sums.data(), ema_sums.size()) / static_cast<double>(all.seen);
      }
      // f_i = (x_i / x_max)^alpha, in (0, 1]: (x_i)^alpha up to a common factor, which the
      // normalisation removes, computed without overflow (losses near the float maximum with
      // alpha 8 would overflow even a double). x_max = max(v_i) + epsilon is max(v_i +
      // epsilon) (rounding is monotone), exact and order-independent.
      factors.epsilon = policy.epsilon;
      factors.alpha = policy.alpha;
      factors.x_max =
          std::max(all.seen > 0 ? double{all.ema_max} : 0.0, all.unseen ? factors.prior : 0.0) +
          policy.epsilon;
      factors.log2_x_max = det::Log2(factors.x_max);
      // Pass 2: f is computed once and parked in `out` (validation is over, so writing is
      // allowed; out may alias `current`, which the loss policy does not read). A factor that
      // underflows to 0 is harmless: the clamp lifts every sample with a positive base weight
      // to clamp_lo.
      rule.mean_f = ExactSum(n,
                             [&](uint64_t b, uint64_t e, exact_sum::ChunkSum* sums) {
                               internal::LossFactorsChunks(level, arrays, factors, b, e, sums);
                             }) /
                    static_cast<double>(n);
      // Pass 3: the raw weights' sum; passes 4 and 5: the clamp and the result.
      const double raw_sum = ExactSum(n, [&](uint64_t b, uint64_t e, exact_sum::ChunkSum* sums) {
        internal::SumRawChunks(level, arrays, rule, b, e, sums);
      });
      NormaliseClampWrite(arrays, rule, raw_sum, policy.clamp_lo, policy.clamp_hi, n);
      return absl::OkStatus();
    }
    case LossWeightKind::kMultiplicative:
      // In double: w (1 + eta ema) may pass the float range before the normalisation. The raw
      // weights' sum came with pass 1; passes 2 and 3: the clamp and the result.
      NormaliseClampWrite(arrays, rule, exact_sum::Total(raw_sums.data(), raw_sums.size()),
                          policy.clamp_lo, policy.clamp_hi, n);
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("policy.loss: unknown kind");
}

absl::StatusOr<Plan> CpuBackend::PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                           absl::Span<const float> weights) {
  if (absl::Status s = ValidatePlanInputs(spec, weights); !s.ok()) return s;
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  uint64_t positive = n;
  if (!weights.empty()) {
    absl::StatusOr<uint64_t> count = CountPositiveWeights(threads_, weights);
    if (!count.ok()) return count.status();
    positive = *count;
  }
  if (!spec.replacement && spec.order == SampleOrder::kWeightedRandom) {
    // Without replacement every drawn sample must have a positive weight.
    if (positive < m) {
      return absl::FailedPreconditionError(
          absl::StrCat("samples_per_epoch = ", m, " without replacement needs ", m,
                       " samples with positive weight; ", positive, " have one"));
    }
  }
  Plan plan;
  plan.epoch = epoch;
  plan.num_samples = n;
  if (Plan::Narrow(n)) {
    FillPlan(spec, epoch, weights, plan.indices32);
  } else {
    FillPlan(spec, epoch, weights, plan.indices64);
  }
  return plan;
}

uint64_t CpuBackend::PlanScratchBytes(const PlanSpec& spec, bool weighted) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  // Beyond 2^56 the byte counts below could overflow; no machine holds such a plan anyway.
  constexpr uint64_t kHuge = uint64_t{1} << 56;
  if (n > kHuge || m > kHuge) return ~uint64_t{0};
  // CountPositiveWeights: a count and a flag per chunk.
  const uint64_t validation = weighted ? internal::NumChunks(n, kGrain) * 9 : 0;
  // What FillPlan allocates besides the plan, path by path.
  uint64_t fill = 0;
  if (spec.order == SampleOrder::kSequential) {
    fill = 0;
  } else if (spec.replacement) {
    fill = weighted ? internal::DrawTableBytes(n) : 0;  // Uniform draws need no table.
  } else if (m == n) {
    fill = internal::ShuffleScratchBytes(threads_, m);
  } else {
    // The selection, then the shuffle of the selected indices (which stay alive meanwhile).
    fill = std::max(internal::SelectScratchBytes(threads_, n, m),
                    m * sizeof(uint64_t) + internal::ShuffleScratchBytes(threads_, m));
  }
  return validation + fill;
}

template <typename T>
void CpuBackend::FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                          LargeVector<T>& indices) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  // Not written here: the threads below touch its pages first, in parallel (large_array.h).
  indices.resize(m);
  const absl::Span<T> out = absl::MakeSpan(indices);
  if (spec.order == SampleOrder::kSequential) {
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) out[i] = static_cast<T>(i);
    });
  } else if (spec.replacement) {
    if (weights.empty()) {
      internal::DrawUniform(threads_, spec.seed, epoch, n, 0, out);
    } else {
      const internal::DrawTable table = internal::BuildDrawTable(threads_, weights);
      internal::DrawWeighted(threads_, table, spec.seed, epoch, 0, out);
    }
  } else if (spec.EveryIndexOnce()) {
    // Every sample exactly once: the weights cannot matter, only the order.
    internal::ShuffleRange(threads_, spec.seed, epoch, out);
  } else {
    const std::vector<uint64_t> selected =
        internal::SelectEfraimidisSpirakis(threads_, spec.seed, epoch, n, m, weights);
    internal::ShuffleIndices(threads_, spec.seed, epoch, absl::MakeConstSpan(selected), out);
  }
}

absl::Status CpuBackend::ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                      uint64_t start, absl::Span<uint64_t> out) {
  const uint64_t m = plan.size();
  absl::StatusOr<uint64_t> length = ShardLength(m, shard, rank);
  if (!length.ok()) return length.status();
  if (start > *length || out.size() > *length - start) {
    return absl::InvalidArgumentError(absl::StrCat("shard range [", start, ", ", start + out.size(),
                                                   ") passes the shard length ", *length));
  }
  auto copy = [&](const auto& indices) {
    for (uint64_t k = 0; k < out.size(); ++k) {
      out[k] = indices[ShardToPlanPosition(m, shard, rank, start + k)];
    }
  };
  if (Plan::Narrow(plan.num_samples)) {
    copy(plan.indices32);
  } else {
    copy(plan.indices64);
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace samplerd
