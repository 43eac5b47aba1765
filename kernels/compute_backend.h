// ComputeBackend: the numerical core of samplerd (weight recompute, epoch planning, shards).
//
// One interface, two implementations: the multithreaded CPU backend (NewCpuBackend below,
// cpu_backend.cc) and, later, a CUDA backend. Both obey the determinism contract
// (docs/SAMPLING.md): given bit-identical inputs they return bit-identical outputs, on any
// machine and any thread count.
//
// Nothing here knows about gRPC or jobs; the server calls these functions with plain data.
// Implementations are thread-safe: concurrent calls on one backend object are allowed.
//
// Every function validates its inputs first. On a bad input it returns INVALID_ARGUMENT (or
// FAILED_PRECONDITION where the input is fine but the state is not, e.g. too few positive
// weights) with a message naming the field and the value, and writes nothing to its outputs.
#ifndef SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
#define SAMPLERD_KERNELS_COMPUTE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/large_array.h"

namespace samplerd {

// ----------------------------------------------------------------------------------------------
// Plans.

enum class SampleOrder {
  kWeightedRandom,  // Draw M of N by weight (with or without replacement), then shuffle.
  kSequential,      // 0, 1, ..., N-1; requires M == N and no replacement.
};

// Everything an epoch's plan depends on besides the epoch number and the weights.
struct PlanSpec {
  uint64_t num_samples = 0;        // N >= 1.
  uint64_t samples_per_epoch = 0;  // M >= 1 (already resolved: callers turn "0 = N" into N).
  uint64_t seed = 0;
  bool replacement = false;
  SampleOrder order = SampleOrder::kWeightedRandom;

  // Without replacement and M == N every sample appears exactly once per epoch: the weights
  // cannot change which samples are drawn, only their order (and importance weights are all 1).
  bool EveryIndexOnce() const { return !replacement && samples_per_epoch == num_samples; }
};

// The sampled indices of one epoch, in the order they are served. Immutable once built; share it
// as std::shared_ptr<const Plan> between readers.
//
// Stored in 4 bytes per index when N <= 2^32 (indices32), 8 bytes otherwise (indices64): exactly
// one of the two holds the M entries.
struct Plan {
  uint64_t epoch = 0;
  uint64_t num_samples = 0;         // N, for range checks and index encoding.
  LargeVector<uint32_t> indices32;  // Huge pages: see large_array.h.
  LargeVector<uint64_t> indices64;

  static bool Narrow(uint64_t num_samples) { return num_samples <= (uint64_t{1} << 32); }
  uint64_t size() const { return Narrow(num_samples) ? indices32.size() : indices64.size(); }
  uint64_t operator[](uint64_t position) const {
    return Narrow(num_samples) ? indices32[position] : indices64[position];
  }
};

// ----------------------------------------------------------------------------------------------
// Shards: pure arithmetic over plan positions, identical for every backend.

enum class PartitionMode {
  kInterleaved,  // Rank r: plan positions r, r+R, r+2R, ... (torch DistributedSampler).
  kContiguous,   // Rank r: one contiguous block.
};

enum class UnevenMode {
  kPad,       // Every shard ceil(M/R) long; positions >= M wrap to position mod M.
  kDropLast,  // Every shard floor(M/R) long; the tail is dropped.
  kUneven,    // Lengths floor(M/R) or ceil(M/R); every position exactly once (evaluation).
};

struct ShardSpec {
  uint32_t world_size = 1;  // R >= 1.
  PartitionMode partition = PartitionMode::kInterleaved;
  UnevenMode uneven = UnevenMode::kPad;
};

// OK if `rank` is a rank of `spec`; INVALID_ARGUMENT naming the rank and the world size
// otherwise (also for world_size == 0). The one check of a rank, for every caller.
absl::Status CheckRank(const ShardSpec& spec, uint32_t rank);

// Length of rank `rank`'s shard of a plan with `plan_length` (M) positions.
// INVALID_ARGUMENT if world_size == 0 or rank >= world_size.
absl::StatusOr<uint64_t> ShardLength(uint64_t plan_length, const ShardSpec& spec, uint32_t rank);

// Plan position served at shard position `shard_pos` of rank `rank`. Requires (not checked; the
// caller validated with ShardLength) rank < world_size and shard_pos < ShardLength(...).
// With kPad the result may be >= plan_length only before the wrap is applied: the returned value
// is already reduced modulo plan_length.
uint64_t ShardToPlanPosition(uint64_t plan_length, const ShardSpec& spec, uint32_t rank,
                             uint64_t shard_pos);

// ----------------------------------------------------------------------------------------------
// Weights.

enum class BaseWeightKind { kUniform, kStatic, kClassBalanced };
enum class LossWeightKind { kNone, kLoss, kMultiplicative };

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
};

// INVALID_ARGUMENT naming the first parameter out of range, e.g. "policy.alpha = -1 is outside
// [0, 8]".
absl::Status ValidatePolicy(const WeightPolicyParams& policy);

// Loss statistics of one sample: 8 bytes, so that ingesting losses for scattered indices touches
// one cache line each and the server's state stays within 16 bytes per sample with the weights.
struct SampleLossStats {
  float ema_loss = 0;       // EMA of the reported losses (undefined if count == 0).
  uint16_t count = 0;       // Losses applied over the job's life, saturating at 65535.
  uint16_t last_epoch = 0;  // EpochMarker of the last epoch with a loss; 0 = never seen.
};

// The marker of `epoch` in SampleLossStats::last_epoch: epoch mod 65535, plus 1 (never 0). It
// tells "seen in this epoch" apart from any of the previous 65534 epochs.
inline uint16_t EpochMarker(uint64_t epoch) { return static_cast<uint16_t>(epoch % 65535 + 1); }

// Per-sample loss statistics, N entries. Owned by the caller (the server's LossTable); backends
// only read them.
using LossStatsView = absl::Span<const SampleLossStats>;

// Base weights from class labels: 1/count(label), or (1-beta)/(1-beta^count) when beta > 0.
// Normalised to mean 1. INVALID_ARGUMENT if labels.size() != out.size() ("labels: 3 values for
// num_samples 4") or beta is out of [0, 1).
absl::Status ClassBalancedWeights(absl::Span<const uint32_t> labels, double beta,
                                  absl::Span<float> out);

// Validates uploaded static weights: finite, >= 0, not all zero. The message names the first bad
// value with its index: "weights[17] = nan: weights must be finite and >= 0".
absl::Status ValidateWeights(absl::Span<const float> weights);

// The largest supported ratio between the largest and the smallest positive static weight: 2^126.
// Within it, every positive weight normalised to mean 1 is at least 2^-126 (the mean is at most
// the largest weight), a normal float: it stays positive, so it is drawn with and without
// replacement, and its importance weight 1 / w is a finite float. Beyond it the smallest weights
// would underflow to 0 (or to subnormals whose inverse overflows), silently never drawn.
inline constexpr double kMaxWeightRatio = 0x1p126;

// Validates static weights (ValidateWeights, then the ratio of the largest to the smallest
// positive weight <= kMaxWeightRatio) and normalises them to mean 1 in place: w / mean, the mean
// summed in double in index order (so the result, and every plan drawn from it, is the same on
// every machine). INVALID_ARGUMENT names the bad value, or for the ratio both weights and the
// ratio: "weights: the largest positive weight (weights[0] = 3.40282e+38) is 2.4e+83 (2^277.0)
// times the smallest (weights[1] = 1.4013e-45); at most 2^126 is supported ...". On error
// `weights` is unchanged.
absl::Status NormaliseWeights(absl::Span<float> weights);

// Summary statistics of a weight vector (computed in double, in a fixed order).
struct WeightSummary {
  double min = 0, max = 0, mean = 0;
  double effective_sample_size = 0;  // (sum w)^2 / sum w^2.
  uint64_t zero_count = 0;
};
WeightSummary SummarizeWeights(absl::Span<const float> weights);

// ----------------------------------------------------------------------------------------------

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;

  // W_{e+1} from the base weights, the current weights W_e and the loss statistics, after epoch
  // `closed_epoch` ended (samples with last_epoch == EpochMarker(closed_epoch) were seen in it).
  //   base:     N base weights (mean 1), or empty for uniform.
  //   current:  W_e, N entries, or empty for all ones (uniform W_e). Validated when given; only
  //             the multiplicative policy reads it (and updates it).
  //   out:      N entries; may alias `current`. Result normalised to mean 1.
  // With LossWeightKind::kNone the result is the base weights.
  virtual absl::Status RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                        absl::Span<const float> base,
                                        absl::Span<const float> current, LossStatsView stats,
                                        absl::Span<float> out) = 0;

  // The plan of `epoch`: a pure function of (spec, epoch, weights).
  //   weights: N entries, or empty for uniform weights.
  // Without replacement: Efraimidis-Spirakis selection of the M smallest keys (ties by index),
  // then a uniform shuffle; with M == N the weights have no effect. FAILED_PRECONDITION if fewer
  // than M weights are positive. With replacement: quantised weights, exact prefix sums; draw j
  // depends only on (seed, epoch, j).
  virtual absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                         absl::Span<const float> weights) = 0;

  // An upper bound on the host memory that PlanEpoch(spec, ...) allocates besides the plan it
  // returns (draw tables, selection keys, shuffle buffers), at its peak; `weighted`: with
  // weights (not empty). The server admits a job by memory with it before allocating anything
  // (server/job_memory.h). Saturates at UINT64_MAX. No plan is needed for it: pure arithmetic.
  virtual uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const = 0;

  // Copies rank `rank`'s shard positions [start, start + out.size()) of `plan` into `out`.
  // INVALID_ARGUMENT if rank >= world_size or the range passes the shard's end.
  virtual absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                    uint64_t start, absl::Span<uint64_t> out) = 0;

  // Rank `rank`'s shard positions [start, start + out.size()) computed directly, without
  // materialising the plan. Only for plans whose positions are independent: with replacement
  // (uniform weights only, so N may exceed memory) or sequential order. UNIMPLEMENTED otherwise.
  // Returns exactly what PlanEpoch + ExtractShard would.
  virtual absl::Status ShardWithoutPlan(const PlanSpec& spec, uint64_t epoch,
                                        const ShardSpec& shard, uint32_t rank, uint64_t start,
                                        absl::Span<uint64_t> out) = 0;
};

// The CPU backend with `num_threads` worker threads (0: hardware concurrency).
std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads = 0);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_COMPUTE_BACKEND_H_
