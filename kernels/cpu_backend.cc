// The CPU ComputeBackend: multithreaded, deterministic for any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/compute_backend.h"
#include "kernels/det_math.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/sampling.h"
#include "kernels/philox.h"

namespace samplerd {
namespace {

using internal::ParallelForChunks;

constexpr uint64_t kGrain = 1 << 16;  // Items per chunk of element-wise work.

absl::Status ValidatePlanInputs(const PlanSpec& spec, absl::Span<const float> weights) {
  if (spec.num_samples == 0) return absl::InvalidArgumentError("num_samples = 0: must be >= 1");
  if (spec.samples_per_epoch == 0) {
    return absl::InvalidArgumentError("samples_per_epoch = 0: must be >= 1");
  }
  if (!spec.replacement && spec.samples_per_epoch > spec.num_samples) {
    return absl::InvalidArgumentError(absl::StrCat("samples_per_epoch = ", spec.samples_per_epoch,
                                                   " exceeds num_samples = ", spec.num_samples,
                                                   " without replacement"));
  }
  if (spec.order == SampleOrder::kSequential &&
      (spec.replacement || spec.samples_per_epoch != spec.num_samples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order = SEQUENTIAL needs replacement = false and samples_per_epoch = num_samples; got "
        "replacement = ",
        spec.replacement, ", samples_per_epoch = ", spec.samples_per_epoch));
  }
  if (!weights.empty()) {
    if (weights.size() != spec.num_samples) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: ", weights.size(), " values for num_samples ", spec.num_samples));
    }
    if (absl::Status s = ValidateWeights(weights); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Checks the sizes and values of RecomputeWeights' inputs.
absl::Status ValidateRecomputeInputs(absl::Span<const float> base, absl::Span<const float> current,
                                     LossStatsView stats, absl::Span<float> out) {
  const size_t n = out.size();
  if (n == 0) return absl::InvalidArgumentError("weights: num_samples = 0");
  auto size_error = [n](const char* field, size_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", got, " values for num_samples ", n));
  };
  if (!base.empty() && base.size() != n) return size_error("base", base.size());
  if (current.size() != n) return size_error("current", current.size());
  if (stats.size() != n) return size_error("stats", stats.size());
  for (size_t i = 0; i < n; ++i) {
    if (!base.empty() && !(std::isfinite(base[i]) && base[i] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("base[", i, "] = ", base[i], ": must be finite and >= 0"));
    }
    if (!(std::isfinite(current[i]) && current[i] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("current[", i, "] = ", current[i], ": must be finite and >= 0"));
    }
    if (stats[i].count > 0 && !(std::isfinite(stats[i].ema_loss) && stats[i].ema_loss >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stats[", i, "].ema_loss = ", stats[i].ema_loss, ": must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
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

  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override;

  absl::Status ShardWithoutPlan(const PlanSpec& spec, uint64_t epoch, const ShardSpec& shard,
                                uint32_t rank, uint64_t start, absl::Span<uint64_t> out) override;

 private:
  // Sum of f(i) over [0, n), in double, combined in chunk order (thread-count independent).
  template <typename F>
  double DeterministicSum(uint64_t n, const F& f) const {
    std::vector<double> partial(internal::NumChunks(n, kGrain), 0.0);
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
      double s = 0;
      for (uint64_t i = b; i < e; ++i) s += f(i);
      partial[c] = s;
    });
    double total = 0;
    for (double s : partial) total += s;
    return total;
  }

  // Writes the plan (validated inputs) into `out`: uint32_t when N <= 2^32, else uint64_t.
  template <typename T>
  void FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                absl::Span<T> out) const;

  // Scales out[] to mean 1, clamps the positive weights to [lo, hi] (relative to mean 1), scales
  // to mean 1 again. Zero weights stay zero.
  void NormaliseAndClamp(absl::Span<float> out, double lo, double hi) const;

  const int threads_;
};

void CpuBackend::NormaliseAndClamp(absl::Span<float> out, double lo, double hi) const {
  const uint64_t n = out.size();
  const double mean = DeterministicSum(n, [&](uint64_t i) { return double{out[i]}; }) / n;
  ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) {
      // Zero stays zero: a sample the base excludes (static weight 0) is never drawn.
      const double w = out[i] == 0 ? 0.0 : std::clamp(out[i] / mean, lo, hi);
      out[i] = static_cast<float>(w);
    }
  });
  const double mean2 = DeterministicSum(n, [&](uint64_t i) { return double{out[i]}; }) / n;
  ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) out[i] = static_cast<float>(out[i] / mean2);
  });
}

absl::Status CpuBackend::RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                          absl::Span<const float> base,
                                          absl::Span<const float> current, LossStatsView stats,
                                          absl::Span<float> out) {
  if (absl::Status s = ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = ValidateRecomputeInputs(base, current, stats, out); !s.ok()) return s;
  const uint64_t n = out.size();
  auto base_at = [&](uint64_t i) { return base.empty() ? 1.0 : double{base[i]}; };

  switch (policy.loss) {
    case LossWeightKind::kNone: {
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) out[i] = static_cast<float>(base_at(i));
      });
      return absl::OkStatus();
    }
    case LossWeightKind::kLoss: {
      // Prior loss of samples never seen: configured, or the mean EMA of the seen samples.
      const double seen =
          DeterministicSum(n, [&](uint64_t i) { return stats[i].count > 0 ? 1.0 : 0.0; });
      double prior = 0;
      if (policy.prior_loss.has_value()) {
        prior = *policy.prior_loss;
      } else if (seen > 0) {
        prior = DeterministicSum(n,
                                 [&](uint64_t i) {
                                   return stats[i].count > 0 ? double{stats[i].ema_loss} : 0.0;
                                 }) /
                seen;
      }
      auto factor = [&](uint64_t i) {
        const double loss = stats[i].count > 0 ? double{stats[i].ema_loss} : prior;
        const double x = loss + policy.epsilon;
        return policy.alpha == 1.0 ? x : det::Pow(x, policy.alpha);
      };
      // f is computed once, parked in `out` (validation is over, so writing is allowed; out may
      // alias `current`, which the loss policy does not read), then mixed and multiplied.
      const double mean_f = DeterministicSum(n,
                                             [&](uint64_t i) {
                                               out[i] = static_cast<float>(factor(i));
                                               return double{out[i]};
                                             }) /
                            n;
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) {
          const double f = (1.0 - policy.mix) * out[i] / mean_f + policy.mix;
          out[i] = static_cast<float>(base_at(i) * f);
        }
      });
      NormaliseAndClamp(out, policy.clamp_lo, policy.clamp_hi);
      return absl::OkStatus();
    }
    case LossWeightKind::kMultiplicative: {
      const uint16_t seen_marker = EpochMarker(closed_epoch);
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) {
          const double w = current[i];
          out[i] = stats[i].last_epoch == seen_marker
                       ? static_cast<float>(w * (1.0 + policy.eta * stats[i].ema_loss))
                       : static_cast<float>(w);
        }
      });
      NormaliseAndClamp(out, policy.clamp_lo, policy.clamp_hi);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("policy.loss: unknown kind");
}

absl::StatusOr<Plan> CpuBackend::PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                           absl::Span<const float> weights) {
  if (absl::Status s = ValidatePlanInputs(spec, weights); !s.ok()) return s;
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  if (!spec.replacement && spec.order == SampleOrder::kWeightedRandom && !weights.empty()) {
    // Without replacement every drawn sample must have a positive weight.
    const uint64_t positive = static_cast<uint64_t>(
        DeterministicSum(n, [&](uint64_t i) { return weights[i] > 0 ? 1.0 : 0.0; }));
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
    plan.indices32.resize(m);
    FillPlan(spec, epoch, weights, absl::MakeSpan(plan.indices32));
  } else {
    plan.indices64.resize(m);
    FillPlan(spec, epoch, weights, absl::MakeSpan(plan.indices64));
  }
  return plan;
}

template <typename T>
void CpuBackend::FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                          absl::Span<T> out) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
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
  } else if (m == n) {
    // Every sample exactly once: the weights cannot matter, only the order.
    internal::ShuffleInto(threads_, spec.seed, epoch, m, [](uint64_t k) { return k; }, out);
  } else {
    const std::vector<uint64_t> selected =
        internal::SelectEfraimidisSpirakis(threads_, spec.seed, epoch, n, m, weights);
    internal::ShuffleInto(
        threads_, spec.seed, epoch, m, [&](uint64_t k) { return selected[k]; }, out);
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

absl::Status CpuBackend::ShardWithoutPlan(const PlanSpec& spec, uint64_t epoch,
                                          const ShardSpec& shard, uint32_t rank, uint64_t start,
                                          absl::Span<uint64_t> out) {
  if (absl::Status s = ValidatePlanInputs(spec, {}); !s.ok()) return s;
  const bool independent = spec.order == SampleOrder::kSequential || spec.replacement;
  if (!independent) {
    return absl::UnimplementedError(
        "ShardWithoutPlan: positions of a plan without replacement depend on each other; use "
        "PlanEpoch + ExtractShard");
  }
  const uint64_t m = spec.samples_per_epoch;
  absl::StatusOr<uint64_t> length = ShardLength(m, shard, rank);
  if (!length.ok()) return length.status();
  if (start > *length || out.size() > *length - start) {
    return absl::InvalidArgumentError(absl::StrCat("shard range [", start, ", ", start + out.size(),
                                                   ") passes the shard length ", *length));
  }
  ParallelForChunks(threads_, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t p = ShardToPlanPosition(m, shard, rank, start + k);
      out[k] = spec.order == SampleOrder::kSequential
                   ? p
                   : internal::UniformDraw(spec.seed, epoch, spec.num_samples, p);
    }
  });
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace samplerd
