// The CPU ComputeBackend: multithreaded, deterministic for any thread count.
#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend_checks.h"
#include "kernels/det_math.h"
#include "kernels/exact_sum.h"
#include "kernels/internal/draw_table.h"
#include "kernels/internal/es_select.h"
#include "kernels/internal/group_factors.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/recompute_passes.h"
#include "kernels/internal/shuffle.h"
#include "kernels/internal/simd_level.h"
#include "kernels/loss_groups.h"
#include "kernels/loss_policies.h"
#include "kernels/loss_table.h"
#include "kernels/philox.h"
#include "kernels/plan_shard.h"
#include "kernels/policy_rules.h"

namespace samplerd {
namespace {

using internal::ParallelForChunks;

constexpr uint64_t kGrain = 1 << 16;  // Items per chunk of element-wise work.

// Weights in host memory: the vector is shared (ToHost hands it out without a copy), the summary
// computed once when they are made. Made in a shared_ptr only (RecomputeWeights with no loss
// policy returns its `base` argument itself: shared_from_this).
class CpuWeights final : public BackendWeights, public std::enable_shared_from_this<CpuWeights> {
 public:
  CpuWeights(std::shared_ptr<const std::vector<float>> weights, const WeightSummary& summary)
      : weights_(std::move(weights)), summary_(summary) {}

  uint64_t size() const override { return weights_->size(); }
  const WeightSummary& summary() const override { return summary_; }
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> ToHost() const override {
    return weights_;
  }

  absl::Span<const float> span() const { return *weights_; }

 private:
  const std::shared_ptr<const std::vector<float>> weights_;
  const WeightSummary summary_;
};

// Loss statistics in host memory: a LossTable.
class CpuLossStats final : public BackendLossStats {
 public:
  CpuLossStats(uint64_t num_samples, double ema_decay) : table_(num_samples, ema_decay) {}

  uint64_t size() const override { return table_.size(); }

  absl::StatusOr<uint64_t> Apply(uint64_t epoch, absl::Span<const uint64_t> indices,
                                 absl::Span<const float> losses) override {
    // One sequential read of the indices, cheap next to the scattered writes below.
    if (absl::Status s = CheckApplyArguments(table_.size(), indices, losses); !s.ok()) return s;
    // Scattered indices make this loop memory bound: the statistics of the pair kAhead further
    // are loaded while this one is applied, overlapping the cache misses.
    constexpr size_t kAhead = 16;
    const size_t size = indices.size();
    uint64_t applied = 0;
    for (size_t k = 0; k < size; ++k) {
      if (k + kAhead < size) table_.Prefetch(indices[k + kAhead]);
      applied += table_.Apply(indices[k], losses[k], epoch);
    }
    return applied;
  }

  uint64_t SamplesSeen() const override { return table_.SamplesSeen(); }

  absl::StatusOr<std::vector<SampleLossStats>> ToHost() const override {
    const absl::Span<const SampleLossStats> stats = table_.stats();
    return std::vector<SampleLossStats>(stats.begin(), stats.end());
  }

  absl::Status Restore(absl::Span<const SampleLossStats> stats) override {
    return table_.Restore(stats);
  }

  absl::Span<const SampleLossStats> stats() const { return table_.stats(); }

 private:
  LossTable table_;
};

// `field`'s object as this backend's type: null for null, an error for another backend's.
template <typename Cpu, typename Base>
absl::StatusOr<const Cpu*> Own(const Base* object, absl::string_view field) {
  return OwnObject<Cpu>(object, field, "cpu");
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
                                 absl::Span<const SampleLossStats> stats, absl::Span<float> out) {
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
                               absl::Span<const SampleLossStats> stats, uint64_t i) {
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

  absl::StatusOr<std::shared_ptr<const BackendWeights>> MakeWeights(
      std::vector<float> weights) override;

  absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                 double ema_decay) override;

  using ComputeBackend::RecomputeWeights;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats,
      absl::Span<const float> irreducible) override;

  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 const BackendWeights* weights) override;

  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override;
  absl::StatusOr<std::vector<mixture::GroupCursor>> PlanMixtureWindow(
      uint64_t seed, uint64_t epoch, const mixture::GroupLayout& layout,
      absl::Span<const mixture::GroupCursor> cursors, absl::Span<const uint64_t> counts,
      absl::Span<uint64_t> out) override {
    return mixture::PlanWindowInto(threads_, seed, epoch, layout, cursors, counts, out);
  }
  uint64_t MixtureWindowScratchBytes(uint64_t groups, uint64_t window) const override {
    return mixture::PlanWindowScratchBytes(threads_, groups, window);
  }

  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override;

  absl::Status ImportanceWeights(const BackendWeights& weights, absl::Span<const uint64_t> indices,
                                 absl::Span<float> out) override;

  // RecomputeWeightsOnHost (cpu_backend.h) with this backend's threads: checks the policy and
  // the sizes (CheckRecomputeInputs' rules for spans), then RecomputeValidated.
  absl::Status RecomputeSpans(const WeightPolicyParams& policy, uint64_t closed_epoch,
                              absl::Span<const float> base, absl::Span<const float> current,
                              absl::Span<const SampleLossStats> stats, absl::Span<float> out,
                              absl::Span<const float> irreducible) const;

  // The passes, for a valid policy and inputs of one size N = out.size() >= 1 (base weights
  // present with loss_within_groups); the values are checked by the first pass.
  absl::Status RecomputeValidated(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                  absl::Span<const float> base, absl::Span<const float> current,
                                  absl::Span<const SampleLossStats> stats, absl::Span<float> out,
                                  absl::Span<const float> irreducible) const;

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

  // Weights that are valid (finite, >= 0, one > 0) as this backend's object, summarised in
  // parallel (SummarizeWeightChunk per chunk: the same bits as SummarizeWeights).
  std::shared_ptr<const BackendWeights> Wrap(
      std::shared_ptr<const std::vector<float>> weights) const {
    const std::vector<WeightChunkSummary> chunks = OverChunkGroups<WeightChunkSummary>(
        weights->size(), [&](uint64_t b, uint64_t e, WeightChunkSummary* out) {
          for (uint64_t c = b; c < e; c += exact_sum::kChunk) {
            *out++ = SummarizeWeightChunk(weights->data() + c,
                                          std::min<uint64_t>(exact_sum::kChunk, e - c));
          }
        });
    const WeightSummary summary = CombineWeightChunks(chunks, weights->size());
    return std::make_shared<const CpuWeights>(std::move(weights), summary);
  }

  // out[i] = the raw weights of `rule` (internal::RawWeightRule; finite, >= 0, not all 0 where
  // not excluded), whose mean is raw_mean, scaled to mean 1, clamped to [lo, hi], scaled to
  // mean 1 again; excluded samples (a zero base or current weight) get exactly 0, so they are
  // never drawn.
  void NormaliseClampWrite(const internal::RecomputeArrays& arrays,
                           const internal::RawWeightRule& rule, double raw_mean, double lo,
                           double hi, uint64_t n) const {
    const internal::ClampRule clamp{raw_mean, lo, hi};
    const double mean_clamped = MeanClamped(arrays, rule, clamp, n);
    const internal::SimdLevel level = internal::BestSimdLevel();
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      internal::WriteWeightsRange(level, arrays, rule, clamp, mean_clamped, b, e);
    });
  }

  // The mean of the clamped weights c_i (the second normalisation's divisor). With a zero
  // raw_mean (every raw weight vanished, e.g. all loss factors underflowed against a sample
  // that the base excludes) the samples that are not excluded are equal.
  double MeanClamped(const internal::RecomputeArrays& arrays, const internal::RawWeightRule& rule,
                     const internal::ClampRule& clamp, uint64_t n) const {
    const internal::SimdLevel level = internal::BestSimdLevel();
    return weight_math::MeanOf(ExactSum(n,
                                        [&](uint64_t b, uint64_t e, exact_sum::ChunkSum* sums) {
                                          internal::SumClampedChunks(level, arrays, rule, clamp,
                                                                     b, e, sums);
                                        }),
                               n);
  }

  // The loss-factor policies' last passes with the effective sample size floor
  // (weight_math::EssFloorMix): rule.mix raised until the weights meet it, then
  // NormaliseClampWrite. raw_mean_of(mix): the mean raw weight with that mix.
  template <typename RawMeanOf>
  void FloorClampWrite(const internal::RecomputeArrays& arrays, internal::RawWeightRule rule,
                       const RawMeanOf& raw_mean_of, const WeightPolicyParams& policy,
                       uint64_t n) const {
    if (policy.min_effective_fraction > 0) {
      const internal::SimdLevel level = internal::BestSimdLevel();
      rule.mix = weight_math::EssFloorMix(rule.mix, [&](double mix) {
        internal::RawWeightRule trial = rule;
        trial.mix = mix;
        const internal::ClampRule clamp{raw_mean_of(mix), policy.clamp_lo, policy.clamp_hi};
        const double mean_clamped = MeanClamped(arrays, trial, clamp, n);
        struct Sums {
          exact_sum::ChunkSum s1, s2;
        };
        const std::vector<Sums> sums =
            OverChunkGroups<Sums>(n, [&](uint64_t b, uint64_t e, Sums* out) {
              exact_sum::ChunkSum s1[internal::kChunksPerGroup], s2[internal::kChunksPerGroup];
              internal::SumFinalChunks(level, arrays, trial, clamp, mean_clamped, b, e, s1, s2);
              for (uint64_t c = 0; b + c * internal::kSumChunk < e; ++c) out[c] = {s1[c], s2[c]};
            });
        std::vector<exact_sum::ChunkSum> s1(sums.size()), s2(sums.size());
        for (size_t c = 0; c < sums.size(); ++c) {
          s1[c] = sums[c].s1;
          s2[c] = sums[c].s2;
        }
        return weight_math::MeetsEssFloor(exact_sum::Total(s1.data(), s1.size()),
                                          exact_sum::Total(s2.data(), s2.size()),
                                          policy.min_effective_fraction, n);
      });
    }
    NormaliseClampWrite(arrays, rule, raw_mean_of(rule.mix), policy.clamp_lo, policy.clamp_hi,
                        n);
  }

  // Sizes `indices` to M and writes the plan (validated inputs) into it: uint32_t when
  // N <= 2^32, else uint64_t.
  template <typename T>
  void FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                LargeVector<T>& indices) const;

  const int threads_;
};

absl::StatusOr<std::shared_ptr<const BackendWeights>> CpuBackend::MakeWeights(
    std::vector<float> weights) {
  // Validated in parallel; the message names the first bad weight (ValidateWeights).
  if (absl::StatusOr<uint64_t> positive = CountPositiveWeights(threads_, weights); !positive.ok()) {
    return positive.status();
  }
  return Wrap(std::make_shared<const std::vector<float>>(std::move(weights)));
}

absl::StatusOr<std::unique_ptr<BackendLossStats>> CpuBackend::NewLossStats(uint64_t num_samples,
                                                                           double ema_decay) {
  if (absl::Status s = CheckNewLossStats(num_samples, ema_decay); !s.ok()) return s;
  return std::make_unique<CpuLossStats>(num_samples, ema_decay);
}

absl::StatusOr<std::shared_ptr<const BackendWeights>> CpuBackend::RecomputeWeights(
    const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
    const BackendWeights* current, const BackendLossStats* stats,
    absl::Span<const float> irreducible) {
  absl::StatusOr<const CpuWeights*> own_base = Own<CpuWeights>(base, "base");
  if (!own_base.ok()) return own_base.status();
  absl::StatusOr<const CpuWeights*> own_current = Own<CpuWeights>(current, "current");
  if (!own_current.ok()) return own_current.status();
  absl::StatusOr<const CpuLossStats*> own_stats = Own<CpuLossStats>(stats, "stats");
  if (!own_stats.ok()) return own_stats.status();
  absl::StatusOr<uint64_t> n = CheckRecomputeInputs(policy, base, current, stats, irreducible);
  if (!n.ok()) return n.status();
  // No loss factor: W_{e+1} is the base weights, the same object (null for uniform).
  if (!UsesLossStats(policy)) {
    if (base == nullptr) return nullptr;
    return std::shared_ptr<const BackendWeights>((*own_base)->shared_from_this());
  }
  auto out = std::make_shared<std::vector<float>>(*n);
  const absl::Span<const float> no_weights;
  // CheckRecomputeInputs validated the policy and the sizes: the passes run without checking
  // them again.
  if (absl::Status s = RecomputeValidated(policy, closed_epoch,
                                          base ? (*own_base)->span() : no_weights,
                                          current ? (*own_current)->span() : no_weights,
                                          (*own_stats)->stats(), absl::MakeSpan(*out),
                                          irreducible);
      !s.ok()) {
    return s;
  }
  // Valid by construction (mean 1, finite, >= 0): not validated again.
  return Wrap(std::move(out));
}

absl::Status CpuBackend::RecomputeSpans(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                        absl::Span<const float> base,
                                        absl::Span<const float> current,
                                        absl::Span<const SampleLossStats> stats,
                                        absl::Span<float> out,
                                        absl::Span<const float> irreducible) const {
  if (absl::Status s = ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = CheckRecomputeSizes(base, current, stats, out); !s.ok()) return s;
  if (absl::Status s = CheckGroupBase(policy, !base.empty()); !s.ok()) return s;
  if (absl::Status s = CheckIrreducible(policy, out.size(), irreducible); !s.ok()) return s;
  if (UsesIrreducibleLosses(policy)) {
    if (absl::Status s = ValidateIrreducibleLosses(irreducible, out.size()); !s.ok()) return s;
  }
  return RecomputeValidated(policy, closed_epoch, base, current, stats, out, irreducible);
}

absl::Status CpuBackend::RecomputeValidated(const WeightPolicyParams& policy,
                                            uint64_t closed_epoch, absl::Span<const float> base,
                                            absl::Span<const float> current,
                                            absl::Span<const SampleLossStats> stats,
                                            absl::Span<float> out,
                                            absl::Span<const float> irreducible) const {
  const uint64_t n = out.size();
  const internal::SimdLevel level = internal::BestSimdLevel();
  const internal::RecomputeArrays arrays{
      base.empty() ? nullptr : base.data(), current.empty() ? nullptr : current.data(),
      stats.data(), out.data(),
      UsesIrreducibleLosses(policy) ? irreducible.data() : nullptr};
  internal::RawWeightRule rule;
  rule.kind = policy.loss;
  rule.mix = policy.mix;
  rule.eta = policy.eta;
  rule.marker = EpochMarker(closed_epoch);

  // Pass 1: validation, and what the policy needs from the statistics (for MULTIPLICATIVE the
  // raw weights' sum; for LOSS with base weights also the base weights' sum). Nothing is written
  // before it is complete.
  const std::vector<internal::ChunkScan> scans = OverChunkGroups<internal::ChunkScan>(
      n, [&](uint64_t b, uint64_t e, internal::ChunkScan* chunk_scans) {
        internal::ScanChunks(level, arrays, rule, b, e, chunk_scans);
      });
  internal::ChunkScan all;
  std::vector<exact_sum::ChunkSum> ema_sums, raw_sums, base_sums;
  ema_sums.reserve(scans.size());
  raw_sums.reserve(scans.size());
  base_sums.reserve(scans.size());
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
    base_sums.push_back(scan.base_sum);
  }
  if (!base.empty() && !all.base_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("base: all ", n, " weights are 0; at least one must be > 0"));
  }
  if (DescriptorOf(policy.loss).reads_current && !current.empty() && !all.current_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("current: all ", n, " weights are 0; at least one must be > 0"));
  }

  // The passes after the first, by the shape of the policy's rule (policy_rules.h).
  return VisitPolicyRule(rule.kind, internal::RuleInputsOf(arrays, rule), [&](const auto& r) {
    using Rule = std::decay_t<decltype(r)>;
    if constexpr (Rule::kShape == PolicyRuleShape::kNone) {
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        if (base.empty()) {
          std::fill(out.begin() + b, out.begin() + e, 1.0f);
        } else {
          std::copy(base.begin() + b, base.begin() + e, out.begin() + b);
        }
      });
    } else if constexpr (Rule::kShape == PolicyRuleShape::kFactor) {
      // The factors of the rule's signal (the EMA for LOSS); the scan summed and maximised it.
      // f_i = (x_i / x_max)^alpha, in (0, 1]: (x_i)^alpha up to a common factor, which the
      // normalisation removes, computed without overflow (weight_math::LossFactorRuleOf: the
      // prior of the samples never seen, configured or the mean signal of the seen ones, and
      // x_max, exact and order-independent).
      const internal::LossFactorParams factors = weight_math::LossFactorRuleOf(
          policy.prior_loss.has_value(), policy.prior_loss.value_or(0.0), policy.epsilon,
          policy.alpha, all.seen, exact_sum::Total(ema_sums.data(), ema_sums.size()),
          all.ema_max, all.unseen);
      if (policy.loss_within_groups) {
        // The factors normalised within each group of equal base weight (docs/SAMPLING.md, "Loss
        // within groups"), parked in `out`; the raw weights are then LossRaw with mean_f = 1,
        // and their mean is the base weights' (each group keeps its base share).
        LossGroupTable groups;
        if (!FindLossGroups(base.data(), n, kMaxLossGroups, &groups)) {
          return TooManyLossGroups();
        }
        internal::GroupFactors(threads_, arrays, rule, factors, groups, n);
        rule.mean_f = 1.0;
        const double mean_b =
            weight_math::MeanOf(exact_sum::Total(base_sums.data(), base_sums.size()), n);
        FloorClampWrite(
            arrays, rule, [mean_b](double) { return mean_b; }, policy, n);
        return absl::OkStatus();
      }
      // Pass 2: f is computed once and parked in `out` (validation is over, so writing is
      // allowed; out may alias `current`, which a kFactor rule does not read), with the exact
      // sums of f_i and, with base weights, of base_i f_i. A factor that underflows to 0 is
      // harmless: the clamp lifts every sample with a positive base weight to clamp_lo.
      std::vector<exact_sum::ChunkSum> factor_sums(scans.size()), base_factor_sums;
      if (!base.empty()) base_factor_sums.resize(scans.size());
      ParallelForChunks(threads_, n, internal::kSumChunk * internal::kChunksPerGroup,
                        [&](uint64_t g, uint64_t b, uint64_t e) {
                          const uint64_t first = g * internal::kChunksPerGroup;
                          internal::LossFactorsChunks(
                              level, arrays, rule, factors, b, e, factor_sums.data() + first,
                              base.empty() ? nullptr : base_factor_sums.data() + first);
                        });
      rule.mean_f =
          weight_math::MeanOf(exact_sum::Total(factor_sums.data(), factor_sums.size()), n);
      // The raw weights' mean in closed form (no pass of its own); passes 3 and 4: the clamp
      // and the result.
      double mean_bf = rule.mean_f, mean_b = 1.0;
      if (!base.empty()) {
        mean_bf = weight_math::MeanOf(
            exact_sum::Total(base_factor_sums.data(), base_factor_sums.size()), n);
        mean_b = weight_math::MeanOf(exact_sum::Total(base_sums.data(), base_sums.size()), n);
      }
      const double mean_f = rule.mean_f;
      FloorClampWrite(
          arrays, rule,
          [&](double mix) {
            return weight_math::LossRawMean(1.0 - mix, mean_f, mix, mean_bf, mean_b);
          },
          policy, n);
    } else {
      // kDirect: in double, raw_i (e.g. w (1 + eta ema)) may pass the float range before the
      // normalisation. The raw weights' sum came with pass 1; passes 2 and 3: the clamp and the
      // result.
      NormaliseClampWrite(
          arrays, rule, weight_math::MeanOf(exact_sum::Total(raw_sums.data(), raw_sums.size()), n),
          policy.clamp_lo, policy.clamp_hi, n);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Plan> CpuBackend::PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                           const BackendWeights* weights) {
  if (absl::Status s = ValidatePlanSpec(spec); !s.ok()) return s;
  absl::StatusOr<const CpuWeights*> own = Own<CpuWeights>(weights, "weights");
  if (!own.ok()) return own.status();
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  if (weights != nullptr && weights->size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", weights->size(), " values for num_samples ", n));
  }
  // The weights were validated when they were made: finite and >= 0, so the positive ones are
  // those that are not 0.
  const uint64_t positive = weights == nullptr ? n : n - weights->summary().zero_count;
  const absl::Span<const float> w = weights == nullptr ? absl::Span<const float>() : (*own)->span();
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
    FillPlan(spec, epoch, w, plan.indices32);
  } else {
    FillPlan(spec, epoch, w, plan.indices64);
  }
  return plan;
}

uint64_t CpuBackend::PlanScratchBytes(const PlanSpec& spec, bool weighted) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  // Beyond 2^56 the byte counts below could overflow; no machine holds such a plan anyway.
  constexpr uint64_t kHuge = uint64_t{1} << 56;
  if (n > kHuge || m > kHuge) return ~uint64_t{0};
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
  return fill;
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
  return CopyShard(plan, shard, rank, start, out);
}

absl::Status CpuBackend::ImportanceWeights(const BackendWeights& weights,
                                           absl::Span<const uint64_t> indices,
                                           absl::Span<float> out) {
  absl::StatusOr<const CpuWeights*> own = Own<CpuWeights>(&weights, "weights");
  if (!own.ok()) return own.status();
  const absl::Span<const float> w = (*own)->span();
  if (absl::Status s = CheckImportanceArguments(w.size(), indices, out); !s.ok()) return s;
  for (size_t k = 0; k < indices.size(); ++k) out[k] = 1.0f / w[indices[k]];
  return absl::OkStatus();
}

int ThreadsOrHardware(int num_threads) {
  return num_threads > 0 ? num_threads
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(ThreadsOrHardware(num_threads));
}

absl::Status RecomputeWeightsOnHost(int num_threads, const WeightPolicyParams& policy,
                                    uint64_t closed_epoch, absl::Span<const float> base,
                                    absl::Span<const float> current,
                                    absl::Span<const SampleLossStats> stats,
                                    absl::Span<float> out, absl::Span<const float> irreducible) {
  return CpuBackend(ThreadsOrHardware(num_threads))
      .RecomputeSpans(policy, closed_epoch, base, current, stats, out, irreducible);
}

}  // namespace samplerd
