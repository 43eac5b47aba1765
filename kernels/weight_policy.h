// Weight policies: their parameters (WeightPolicyParams, checked by ValidatePolicy) and the
// base weights every backend starts from (uploaded static weights checked and normalised,
// class-balanced weights), with a summary for metrics. The recompute that applies a loss policy
// is ComputeBackend::RecomputeWeights (compute_backend.h); docs/SAMPLING.md defines both.
//
// Every function validates its inputs first; on a bad input it returns INVALID_ARGUMENT with a
// message naming the field and the value, and writes nothing. Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_WEIGHT_POLICY_H_
#define SAMPLERD_KERNELS_WEIGHT_POLICY_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/exact_sum.h"
#include "kernels/policy_rules.h"  // LossWeightKind.

namespace samplerd {

enum class BaseWeightKind { kUniform, kStatic, kClassBalanced };

// Parameters of a weight policy with every default already filled in (see the .proto for the
// meaning of each; ValidatePolicy checks the ranges).
struct WeightPolicyParams {
  BaseWeightKind base = BaseWeightKind::kUniform;
  LossWeightKind loss = LossWeightKind::kNone;
  double class_balance_beta = 0.0;   // [0, 1); 0 selects 1/count.
  double ema_decay = 0.9;            // [0, 1).
  double alpha = 1.0;                // [0, 8].
  double epsilon = 1e-3;             // (0, 1e6].
  double mix = 0.0;                  // [0, 1].
  double clamp_lo = 0.1;             // (0, 1].
  double clamp_hi = 10.0;            // [1, 1e6].
  std::optional<double> prior_loss;  // >= 0; unset: mean EMA of the seen samples.
  double eta = 1.0;                  // (0, 100].
  // kLoss with a kStatic or kClassBalanced base: the loss factor is normalised within each group
  // of samples of equal base weight (docs/SAMPLING.md, "Loss within groups").
  bool loss_within_groups = false;
  // kLoss, kReducibleLoss: the floor on the effective sample size of W_{e+1}, as a fraction of
  // N, [0, 1]; 0: off (docs/SAMPLING.md, "Effective sample size floor").
  double min_effective_fraction = 0.0;
};

// The most groups (distinct base weights) that loss_within_groups supports.
inline constexpr uint64_t kMaxLossGroups = 65536;

// INVALID_ARGUMENT naming the first parameter out of range, e.g. "policy.alpha = -1 is outside
// [0, 8]", loss_within_groups without a loss that allows it (loss_policies.h: LOSS,
// REDUCIBLE_LOSS) and a kStatic or kClassBalanced base, or min_effective_fraction > 0 with a
// loss policy other than LOSS or REDUCIBLE_LOSS.
absl::Status ValidatePolicy(const WeightPolicyParams& policy);

// Base weights from class labels: 1/count(label), or (1-beta)/(1-beta^count) when beta > 0.
// Normalised to mean 1. INVALID_ARGUMENT if labels.size() != out.size() ("labels: 3 values for
// num_samples 4") or beta is out of [0, 1).
absl::Status ClassBalancedWeights(absl::Span<const uint32_t> labels, double beta,
                                  absl::Span<float> out);

// Validates uploaded static weights: finite, >= 0, not all zero. The message names the first bad
// value with its index: "weights[17] = nan: weights must be finite and >= 0".
absl::Status ValidateWeights(absl::Span<const float> weights);

// Validates the irreducible losses of REDUCIBLE_LOSS (UploadIrreducibleLosses): exactly
// num_samples values ("irreducible_losses: 3 values for num_samples 4"), each finite and >= 0
// ("irreducible_losses[17] = nan: must be finite and >= 0"; -0 is a zero). All zero is allowed
// (the policy is then LOSS).
absl::Status ValidateIrreducibleLosses(absl::Span<const float> losses, uint64_t num_samples);

// The largest supported ratio between the largest and the smallest positive static weight: 2^126.
// Within it, every positive weight normalised to mean 1 is at least 2^-126 (the mean is at most
// the largest weight), a normal float: it stays positive, so it is drawn with and without
// replacement, and its importance weight 1 / w is a finite float. Beyond it the smallest weights
// would underflow to 0 (or to subnormals whose inverse overflows), silently never drawn.
inline constexpr double kMaxWeightRatio = 0x1p126;

// Validates static weights (ValidateWeights, then the ratio of the largest to the smallest
// positive weight <= kMaxWeightRatio) and normalises them to mean 1 in place: float(w / mean),
// the mean the exact sum of the weights (exact_sum.h) divided by N (so the result, and every plan
// drawn from it, is the same on every machine and on a GPU). INVALID_ARGUMENT names the bad value,
// or for the ratio both weights and the ratio: "weights: the largest positive weight (weights[0]
// = 3.40282e+38) is 2.4e+83 (2^277.0) times the smallest (weights[1] = 1.4013e-45); at most 2^126
// is supported ...". On error `weights` is unchanged.
absl::Status NormaliseWeights(absl::Span<float> weights);

// Summary statistics of a weight vector (finite and >= 0, as every weight vector of a job), for
// metrics (JobStatus.weights). Defined so that it does not depend on the order in which a backend
// visits the weights (a GPU's reduction returns the same bits as the CPU, see
// kernels/cuda/device_weights.h), in double:
//   min, max:    the smallest and the largest weight (a zero min or max is +0, whatever sign
//                the zero had); zero_count: how many weights are 0 (or -0).
//   S1, S2:      the exact sums (exact_sum.h, chunks of exact_sum::kChunk weights) of w and of
//                double(w) * double(w) (exact: a float's square fits in a double's significand).
//   mean:        S1 / N.
//   effective_sample_size: S1 * S1 / S2 (Kish), 0 when S2 = 0 (all weights 0).
// All 0 for no weights.
struct WeightSummary {
  double min = 0, max = 0, mean = 0;
  double effective_sample_size = 0;
  uint64_t zero_count = 0;
};
WeightSummary SummarizeWeights(absl::Span<const float> weights);

// With policy.loss_within_groups: INVALID_ARGUMENT if the base weights have more than
// kMaxLossGroups distinct values (naming the count), checked when they are uploaded so that a job
// never fails at an epoch boundary for it. OK for any other policy.
absl::Status CheckLossGroups(const WeightPolicyParams& policy, absl::Span<const float> base);

// The error of base weights with more than kMaxLossGroups distinct values under
// loss_within_groups: "base: more than 65536 distinct weights; policy.loss_within_groups ...".
absl::Status TooManyLossGroups();

// SummarizeWeights in parts, for a backend that summarises the chunks of exact_sum::kChunk
// weights in parallel: SummarizeWeightChunk of each chunk (weights [c kChunk, min(N, (c + 1)
// kChunk)), 1 to kChunk weights), then CombineWeightChunks of all of them in any order (N: the
// number of weights).
struct WeightChunkSummary {
  float min = 0, max = 0;
  uint64_t zero_count = 0;
  exact_sum::ChunkSum sum, sum_of_squares;
};
WeightChunkSummary SummarizeWeightChunk(const float* weights, uint64_t count);
WeightSummary CombineWeightChunks(absl::Span<const WeightChunkSummary> chunks, uint64_t n);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_WEIGHT_POLICY_H_
