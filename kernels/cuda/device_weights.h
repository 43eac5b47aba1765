// Device kernels of the weight side of docs/SAMPLING.md, bit-identical to the CPU backend: the
// loss policies' recompute, the weights' summary, applying losses and importance weights. The
// building blocks of CudaBackend's state (cuda_backend.h), as device_plan.h is for its plans.
//
// A small host API without Abseil (it also builds on the GPU machine, which has none): every
// function takes device pointers and a stream, enqueues its work on that stream and returns the
// first CUDA error (cudaErrorInvalidValue for a violated precondition, before anything is
// enqueued). Functions that return a value to the host (RecomputeWeights' check, the summary)
// synchronise the stream to read it. Scratch comes from the stream-ordered allocator
// (device_plan.h, KeepPoolMemory). Thread-safe: no state besides the arguments.
#ifndef SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_
#define SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loss_stats.h"
#include "kernels/policy_rules.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace gpu {

// The loss statistics as the device keeps them: a struct of arrays in one allocation of
// LossStatsBytes(N), so that the loss policy's first two passes read the 4-byte EMA and two bits
// per sample instead of the 8-byte SampleLossStats (the recompute's traffic: 32 to ~24 B per
// sample). Together the arrays hold exactly the SampleLossStats (SplitLossStats,
// JoinLossStats); all bytes 0 is every sample never seen.
struct DeviceLossStats {
  float* ema = nullptr;         // N: ema_loss.
  uint32_t* meta = nullptr;     // N: count | last_epoch << 16.
  uint32_t* seen = nullptr;     // LossStatsWords(N): bit i % 32 of word i / 32 = (count_i > 0).
  uint32_t* defined = nullptr;  // The same layout: EmaDefined(count_i, last_epoch_i).
};

SAMPLERD_LOSS_STATS_HD uint64_t LossStatsWords(uint64_t n) { return (n + 31) / 32; }
SAMPLERD_LOSS_STATS_HD uint64_t LossStatsBytes(uint64_t n) {
  return n * (sizeof(float) + sizeof(uint32_t)) + 2 * LossStatsWords(n) * sizeof(uint32_t);
}

// The arrays of n samples carved out of `memory` (LossStatsBytes(n) bytes, 4-byte aligned).
SAMPLERD_LOSS_STATS_HD DeviceLossStats LossStatsIn(void* memory, uint64_t n) {
  DeviceLossStats s;
  s.ema = static_cast<float*>(memory);
  s.meta = reinterpret_cast<uint32_t*>(s.ema + n);
  s.seen = s.meta + n;
  s.defined = s.seen + LossStatsWords(n);
  return s;
}

// SampleLossStats' second word: count | last_epoch << 16. (Host and device, as the sizes above:
// SAMPLERD_LOSS_STATS_HD of loss_stats.h.)
SAMPLERD_LOSS_STATS_HD uint32_t LossStatsMeta(const SampleLossStats& s) {
  return static_cast<uint32_t>(s.count) | static_cast<uint32_t>(s.last_epoch) << 16;
}

// The SampleLossStats of an EMA and its meta word (the inverse of LossStatsMeta).
SAMPLERD_LOSS_STATS_HD SampleLossStats LossStatsFrom(float ema, uint32_t meta) {
  SampleLossStats s;
  s.ema_loss = ema;
  s.count = static_cast<uint16_t>(meta & 0xffffu);
  s.last_epoch = static_cast<uint16_t>(meta >> 16);
  return s;
}

// Host side: samples in[0, count) (the samples [first, first + count) of a job, first a
// multiple of 32) into the arrays' parts for them: ema[0, count), meta[0, count), and the bit
// words seen and defined [0, LossStatsWords(count)), written whole (the bits past `count` 0).
inline void SplitLossStats(const SampleLossStats* in, uint64_t count, float* ema, uint32_t* meta,
                           uint32_t* seen, uint32_t* defined) {
  for (uint64_t w = 0; w < LossStatsWords(count); ++w) seen[w] = defined[w] = 0;
  for (uint64_t i = 0; i < count; ++i) {
    ema[i] = in[i].ema_loss;
    meta[i] = LossStatsMeta(in[i]);
    const uint32_t bit = 1u << (i % 32);
    if (in[i].count > 0) seen[i / 32] |= bit;
    if (weight_math::EmaDefined(in[i].count, in[i].last_epoch)) defined[i / 32] |= bit;
  }
}

// Host side: the SampleLossStats of ema[0, count) and meta[0, count) into out[0, count).
inline void JoinLossStats(const float* ema, const uint32_t* meta, uint64_t count,
                          SampleLossStats* out) {
  for (uint64_t i = 0; i < count; ++i) out[i] = LossStatsFrom(ema[i], meta[i]);
}

// A loss policy's parameters (WeightPolicyParams of kernels/weight_policy.h without Abseil,
// already validated by ValidatePolicy), and the marker of the closed epoch. The kernels are
// templates over the policy's rule (kernels/policy_rules.h: VisitPolicyRule of `loss`), never
// naming a kind; the fields below are what the rules' shapes read.
struct RecomputeParams {
  LossWeightKind loss = LossWeightKind::kLoss;    // A loss policy: not kNone.
  double alpha = 1.0, epsilon = 1e-3, mix = 0.0;  // kFactor rules.
  bool has_prior_loss = false;                    // kFactor: else the mean signal of the seen.
  double prior_loss = 0.0;
  double eta = 1.0;  // PolicyRuleInputs::eta (MULTIPLICATIVE).
  double clamp_lo = 0.1, clamp_hi = 10.0;
  uint16_t marker = 0;  // EpochMarker(closed epoch): PolicyRuleInputs::marker.
  // kFactor with loss_within_groups: the factor normalised within each group of equal base
  // weight (base required). RecomputeWeights reads the groups' table (loss_groups.h,
  // FindLossGroups of the base weights) from host memory: num_groups keys (ascending) and counts.
  bool within_groups = false;
  const uint32_t* group_keys = nullptr;
  const uint64_t* group_counts = nullptr;
  uint32_t num_groups = 0;
  // PolicyRuleInputs::irreducible (REDUCIBLE_LOSS: its N irreducible losses; nullptr for the
  // others): device memory for RecomputeWeights, host memory for the host reference.
  const float* irreducible = nullptr;
  // kFactor: the effective sample size floor (weight_math::EssFloorMix), a fraction of N; 0: off.
  double min_effective_fraction = 0.0;

  // The inputs of the policy's rule (VisitPolicyRule).
  PolicyRuleInputs rule_inputs() const {
    PolicyRuleInputs inputs;
    inputs.irreducible = irreducible;
    inputs.eta = eta;
    inputs.marker = marker;
    return inputs;
  }
};

// What the first pass of RecomputeWeights found: the CPU backend's validation of its inputs.
struct RecomputeCheck {
  // The lowest index with a bad entry: a base or current weight not finite or < 0, or the EMA of
  // a sample with count > 0 or last_epoch > 0 not finite or < 0. ~0: none.
  uint64_t first_bad = ~uint64_t{0};
  bool base_positive = false;     // Some base weight > 0 (false when base is nullptr).
  bool current_positive = false;  // Some current weight > 0 (false when current is nullptr).
};

// W_{e+1} (n entries, mean 1) from base and current weights (nullptr: all 1) and the loss
// statistics, by the passes of CpuBackend::RecomputeWeights (exact sums over exact_sum::kChunk
// samples; the effective sample size floor's bisection on the host from the device's exact
// sums), into `out` (must not overlap the inputs). Fills *check (host memory) first; if it finds
// a bad entry, an all-zero base, or (a kDirect rule) an all-zero current, nothing is written to
// `out` and the caller turns *check into the CPU backend's error. n >= 1;
// cudaErrorInvalidValue for params.loss kNone or a rule without its inputs (HasInputs).
cudaError_t RecomputeWeights(const RecomputeParams& params, uint64_t n, const float* base,
                             const float* current, const DeviceLossStats& stats, float* out,
                             RecomputeCheck* check, cudaStream_t stream);

// SummarizeWeights (weight_policy.h) of n device weights: min, max, mean = S1 / n and the
// effective sample size S1^2 / S2, with S1 and S2 the exact sums (exact_sum.h) of w and of
// double(w)^2, and the number of zeros. The same bits as the CPU. n >= 1; *summary in host
// memory.
struct WeightSummaryValues {
  double min = 0, max = 0, mean = 0, effective_sample_size = 0;
  uint64_t zero_count = 0;
};
cudaError_t SummarizeWeights(const float* weights, uint64_t n, WeightSummaryValues* summary,
                             cudaStream_t stream);

// ApplyLoss (loss_stats.h) of losses[k] to sample indices[k] of `stats` for k < count, with
// `marker` and `decay` (its bits too). The indices are distinct (the host decided which pairs
// apply: one per sample per epoch), so the kernel's order does not matter. indices, losses:
// device memory (or pinned host memory mapped for the device).
cudaError_t ApplyLosses(const DeviceLossStats& stats, const uint64_t* indices, const float* losses,
                        uint64_t count, uint16_t marker, float decay, cudaStream_t stream);

// out[k] = 1.0f / weights[indices[k]] for k < count (indices < N, checked by the caller).
cudaError_t GatherImportance(const float* weights, const uint64_t* indices, uint64_t count,
                             float* out, cudaStream_t stream);

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_DEVICE_WEIGHTS_H_
