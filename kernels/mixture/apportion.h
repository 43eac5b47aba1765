// The exact apportionment of a mixture job's windows to its groups (docs/SAMPLING.md, "Mixture
// jobs", "Apportionment"): integer counts that add up to the window size M exactly, whose
// running totals follow the running total of each group's weighted target without drift, also
// when the weights change between windows. Integer arithmetic only (no floating point after the
// exact reading of the weights' bits), so a re-implementation is bit-exact. Host code, O(K) per
// window (K = groups). Thread-compatible: Apportioner is a value; const methods are safe to call
// concurrently, Next is not.
//
// Definition (D = 2^63, the fixed-point unit of a share):
//   Shares, from the weights w_0, ..., w_{K-1} (finite doubles >= 0, not all 0; -0 is 0):
//     1. E = the smallest integer with w_max < 2^E (from the largest weight's exponent bits);
//        s = 95 - BitWidth(K) - E. q_k = floor(w_k 2^s) (exact: w_k's significand shifted),
//        or 1 for a positive weight whose product truncates to 0. So q_k < 2^(95 - BitWidth(K))
//        and Q = sum q_k < 2^96.
//     2. p_k = floor(D q_k / Q) and r_k = D q_k mod Q (exact, 128-bit integers); the
//        L = D - sum p_k (< K) groups with the largest r_k (ties: the lower group number) get
//        p_k + 1. So sum p_k = D exactly, and a zero weight has p_k = 0 (so may a positive
//        weight below 2^-63 of the total: its target is below one sample per 2^63).
//   Window t of M samples, with the groups' lags e_k (integers in units of 1/D; all 0 before
//   the first window; sum e_k = 0 always):
//     3. a_k = e_k + M p_k; base_k = floor(a_k / D) when a_k >= 0, else 0 (a_k < 0: the group
//        is ahead of its target by more than this window's share); rem_k = a_k - D base_k.
//        S = sum base_k.
//     4. If S <= M: the M - S groups with the largest rem_k (ties: the lower group number) get
//        base_k + 1 (each of them has rem_k > 0), the others base_k.
//        If S > M (only possible when two or more groups have a_k < 0):
//        S - M units are taken back, one at a time, each from the group with base_k >= 1 (after
//        the units taken so far) of the smallest rem_k (+ D per unit taken from it; ties: the
//        higher group number). `taken_back` counts them.
//     5. c_k = the count of step 4; the new lag e_k = a_k - D c_k.
// Bounds (proofs in docs/SAMPLING.md, "Apportionment"): always sum c_k = M, c_k >= 0 and
// e_k > -D: a group is never a whole sample ahead of its target sum_t M_t p_k^(t) / D. A window
// without a take-back (S <= M) leaves every e_k < D too, whatever the lags before it:
// |C_k - target_k| < 1 sample. A take-back (S > M) means that no counts keep every lag below D;
// the take-back's order is the one that keeps the largest lag smallest. In general
// e_k < (K - 1) D (the lags add up to 0 and each is > -D), so counts never drift from their
// targets. Measured (apportion_test): with constant weights 86 of 10^6 random windows took back
// and the largest lag was 1.19 samples; with weights redrawn every 1-4 windows, 9 of 120,000 and
// 1.05. Against the weights themselves, p_k / D is within (K + 2) 2^-(93 - BitWidth(K)) of
// w_k / sum w (2^-53 for K = 10^6): below one sample per 2^53 samples.
#ifndef SAMPLERD_KERNELS_MIXTURE_APPORTION_H_
#define SAMPLERD_KERNELS_MIXTURE_APPORTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace samplerd {
namespace mixture {

using int128 = __int128;

// The most groups a mixture job has (the K <= 10^6): one home for the limit.
constexpr uint64_t kMaxGroups = 1000000;

// log2 of the fixed-point unit D of a share.
constexpr int kShareBits = 63;
constexpr uint64_t kShareUnit = uint64_t{1} << kShareBits;  // D.

// The weights as shares of D (steps 1-2). INVALID_ARGUMENT naming `weights[k]` and its value
// for a negative, NaN or infinite weight, and for no weight, more than kMaxGroups, or all 0.
absl::StatusOr<std::vector<uint64_t>> SharesOf(absl::Span<const double> weights);

// The counts of one window and what it did.
struct WindowCounts {
  std::vector<uint64_t> counts;  // c_k, adding up to M.
  uint64_t taken_back = 0;       // Units of step 4's take-back (0 unless S > M).
};

// The lags of a job's groups from window to window: O(K) state (16 bytes per group).
class Apportioner {
 public:
  // K groups, every lag 0 (before the first window). INVALID_ARGUMENT for K = 0 or K >
  // kMaxGroups.
  static absl::StatusOr<Apportioner> Create(uint64_t groups);

  // Restores saved lags (lags()): INVALID_ARGUMENT unless 1 <= K <= kMaxGroups, every lag is in
  // (-D, (K - 1) D) and they add up to 0 (a corrupt snapshot), naming the first bad one.
  static absl::StatusOr<Apportioner> FromLags(std::vector<int128> lags);

  // The counts of the next window of `window_size` (M) samples under `shares` (SharesOf, K of
  // them), and moves the lags on. INVALID_ARGUMENT (nothing changes) when shares.size() != K,
  // the shares do not add up to D, or M > 2^63.
  absl::StatusOr<WindowCounts> Next(absl::Span<const uint64_t> shares, uint64_t window_size);

  // e_k in units of 1/D: target - count, D times.
  const std::vector<int128>& lags() const { return lags_; }
  uint64_t groups() const { return lags_.size(); }

 private:
  explicit Apportioner(std::vector<int128> lags) : lags_(std::move(lags)) {}

  std::vector<int128> lags_;
};

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_APPORTION_H_
