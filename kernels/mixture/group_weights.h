// The group weights of a mixture job (docs/SAMPLING.md, "Mixture jobs", "Group weights"): static
// (set, and changed between epochs), or learned online from each epoch's per-group losses
// (group_losses.h) by (a) excess-loss exponentiated gradient (DoReMi, Xie et al. 2023, applied
// online) with a stall floor, or (b) EXP3 (Online Data Mixing, Albalak et al. 2023) rewarded by
// the loss decrease; both within bounds relative to uniform that stop a collapse onto one group.
// The weights are the input of the apportionment (apportion.h: SharesOf).
//
// Every rule is a pure function of (state, epoch's statistics) in IEEE double with a fixed order
// of operations, det_math.h's Log2/Exp2 (no libm) and no FMA (the build's -ffp-contract=off):
// replaying the same epochs' statistics gives the same bits on every host. Host code, O(K log K)
// per epoch (the bounds' projection sorts). Thread-compatible: GroupWeights is a value.
//
// One epoch of an online rule (O = the groups with at least one loss in the epoch, P = the sum
// of their weights before the epoch; groups outside O keep their weight and state bit for bit,
// so the weights keep adding up to 1 and a group that drew no sample is neither rewarded nor
// punished):
//   1. Loss tracking, k in O, l_k = the epoch's mean loss of group k: the first epoch with a
//      loss sets e_k = l_k, d_k = 0, r_k = 0; later ones: e'_k = b e_k + (1 - b) l_k,
//      r_k = e_k - e'_k (this epoch's decrease of the loss EMA), d'_k = b d_k + (1 - b) r_k
//      (its EMA: the loss's recent decrease per epoch), b = loss_decay.
//   2. Logits z_k (base 2), k in O:
//      (a) excess_k = max(0, e_k - max(ref_k, f_k)) with the stall floor f_k = e_k - H max(d_k,
//          0) (H = horizon, in epochs; H = +inf: no floor, DoReMi's max(0, e_k - ref_k));
//          z_k = Log2(w_k) + (eta excess_k) log2(e).
//      (b) R_k = a R_k + (1 - a) r_k / (|O| w_k / P) (the reward, importance-weighted by the
//          probability the group had relative to uniform over O; a = reward_decay);
//          z_k = (eta R_k) log2(e).
//   3. Softmax over O: m = max z_k; s_k = Exp2(z_k - m) / sum_{j in O} Exp2(z_j - m) (sums in
//      group order); v_k = ((1 - c) s_k + c / |O|) P with c = smoothing (a) or exploration (b).
//   4. Bounds: w'_k = min(max(v_k - t, lo), hi) with lo = min_ratio / K, hi = max_ratio / K and
//      t the shift that makes sum_{k in O} w'_k = P (ProjectOntoBounds: the Euclidean
//      projection onto {sum = P, lo <= w <= hi}); v unchanged when it already lies within.
#ifndef SAMPLERD_KERNELS_MIXTURE_GROUP_WEIGHTS_H_
#define SAMPLERD_KERNELS_MIXTURE_GROUP_WEIGHTS_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/mixture/group_losses.h"

namespace samplerd {
namespace mixture {

// Bounds on every group's weight, relative to uniform: min_ratio / K <= w_k <= max_ratio / K.
// 0 <= min_ratio <= 1 <= max_ratio (+inf: no upper bound).
struct WeightBounds {
  double min_ratio = 0;
  double max_ratio = std::numeric_limits<double>::infinity();
};

// (a) Excess-loss exponentiated gradient.
struct ExcessLossConfig {
  double eta = 1;           // Step size, per unit of excess loss (> 0, finite).
  double smoothing = 1e-3;  // c in [0, 1]: DoReMi's mix with uniform.
  double loss_decay = 0.5;  // b in [0, 1): the EMA of each group's epoch mean loss.
  double horizon = 10;      // H > 0 epochs (+inf: no stall floor).
  WeightBounds bounds;
};

// (b) EXP3 rewarded by the loss decrease.
struct Exp3Config {
  double eta = 1;             // Step size, per unit of reward (> 0, finite).
  double exploration = 0.05;  // gamma in [0, 1]: the mass spread uniformly.
  double reward_decay = 0.9;  // a in [0, 1): ODM's smoothing of the reward.
  double loss_decay = 0.5;    // b in [0, 1).
  WeightBounds bounds;
};

enum class GroupWeightRule { kStatic, kExcessLoss, kExp3 };

// Per-group state of the online rules.
struct GroupTrack {
  bool seen = false;    // Some epoch had a loss of the group.
  double ema = 0;       // e_k.
  double decrease = 0;  // d_k.
  double reward = 0;    // R_k (EXP3).
};

// weights / their sum, after checking: INVALID_ARGUMENT when weights.size() != groups
// (`weights`), or (SharesOf's checks, apportion.h) a weight is negative, NaN or infinite
// (`weights[k]`), or all are 0. Finite weights whose sum overflows are divided by the largest
// first ({1e308, 1e308} is {0.5, 0.5}).
absl::StatusOr<std::vector<double>> NormalizeWeights(absl::Span<const double> weights,
                                                     uint64_t groups);

// The reference losses of rule (a): INVALID_ARGUMENT unless there are `groups` of them
// (`reference_losses`), each finite and >= 0 (`reference_losses[k]` and its value).
absl::Status ValidateReferenceLosses(absl::Span<const double> reference, uint64_t groups);

// Step 4: the Euclidean projection of v (its entries at `members`, the others untouched) onto
// {sum over members = mass, lo <= w <= hi}: min(max(v_k - t, lo), hi) with the t that solves the
// sum (found on the sorted breakpoints v_k - hi, v_k - lo; between two, the sum is linear in t).
// v is returned unchanged when every member already lies in [lo, hi]. When |members| lo >= mass
// (or |members| hi <= mass) every member gets lo (hi). The result always lies in [lo, hi].
void ProjectOntoBounds(absl::Span<const uint32_t> members, double mass, double lo, double hi,
                       absl::Span<double> v);

class GroupWeights {
 public:
  // Static weights (NormalizeWeights' errors).
  static absl::StatusOr<GroupWeights> Static(absl::Span<const double> weights);
  // (a), from `initial` weights (NormalizeWeights, then projected onto the bounds) and the
  // reference losses (ValidateReferenceLosses). INVALID_ARGUMENT naming the
  // config field and value for eta, smoothing, loss_decay, horizon or bounds out of range.
  static absl::StatusOr<GroupWeights> ExcessLoss(absl::Span<const double> initial,
                                                 absl::Span<const double> reference,
                                                 const ExcessLossConfig& config);
  // (b), as (a) without reference losses.
  static absl::StatusOr<GroupWeights> Exp3(absl::Span<const double> initial,
                                           const Exp3Config& config);

  // Static rule only (FAILED_PRECONDITION otherwise): new weights between epochs
  // (NormalizeWeights' errors; nothing changes on error).
  absl::Status SetStatic(absl::Span<const double> weights);

  // The same rule and parameters with the weights and tracks of a saved state (a snapshot's, a
  // kept epoch start's), bit for bit: replaying from it gives what the saved object would have.
  // INVALID_ARGUMENT, nothing changed, unless there are groups() weights, each finite and >= 0,
  // and groups() tracks (`tracks` may be empty for the static rule: none seen).
  absl::Status Restore(absl::Span<const double> weights, absl::Span<const GroupTrack> tracks);

  // One epoch's statistics (the header's steps 1-4; the static rule ignores them).
  // INVALID_ARGUMENT when losses.groups() != groups() (nothing changes).
  absl::Status Update(const GroupLosses& losses);

  GroupWeightRule rule() const { return rule_; }
  uint32_t groups() const { return static_cast<uint32_t>(weights_.size()); }
  const std::vector<double>& weights() const { return weights_; }  // Add up to 1 (rounding).
  const std::vector<GroupTrack>& tracks() const { return tracks_; }
  // The current excess of each group under (a) (0 for a group never seen; empty otherwise).
  std::vector<double> Excess() const;

 private:
  GroupWeights(GroupWeightRule rule, std::vector<double> weights)
      : rule_(rule), weights_(std::move(weights)), tracks_(weights_.size()) {}

  GroupWeightRule rule_;
  std::vector<double> weights_;
  std::vector<GroupTrack> tracks_;
  std::vector<double> reference_;  // (a) only.
  ExcessLossConfig excess_;
  Exp3Config exp3_;
};

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_GROUP_WEIGHTS_H_
