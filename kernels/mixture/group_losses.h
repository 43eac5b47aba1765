// The per-group loss statistics of one epoch of a mixture job (docs/SAMPLING.md, "Mixture jobs",
// "Group weights", step 1): from the ranks' (global index, loss) pairs, each group's count of
// losses and their sum, exact, so that the result depends neither on the order in which the
// pairs arrive nor on how they are batched or threaded.
//
// Definition: the group of index i is the k with offset(k) <= i < offset(k + 1) (a binary
// search of the layout's offsets). A loss x (finite, 0 <= x < 2^32 = kMaxGroupLoss) counts as
// the integer q(x) = floor(x 2^32) (exact: x's significand shifted); S_k = the integer sum of
// the q of group k's losses (128 bits: exact for any count below 2^64), n_k their count. The
// group's mean loss is RoundToDouble(S_k) 2^-32 / n_k (exact_sum.h's rounding to nearest even,
// an exact scaling, one IEEE division). Truncating each loss below 2^-32 changes a mean by less
// than 2^-32.
//
// A loss is counted every time it is added: the caller (the job) drops duplicates of a position
// as it does for other jobs. Memory: 24 bytes per group. Thread-compatible.
#ifndef SAMPLERD_KERNELS_MIXTURE_GROUP_LOSSES_H_
#define SAMPLERD_KERNELS_MIXTURE_GROUP_LOSSES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace mixture {

// Losses of a mixture job are below 2^32 (their fixed-point sums are exact); one home for the
// limit.
constexpr double kMaxGroupLoss = 4294967296.0;  // 2^32.

class GroupLosses {
 public:
  // No loss yet in any of `groups` groups.
  explicit GroupLosses(uint32_t groups) : counts_(groups, 0), sums_(groups, 0) {}

  // Adds the pairs (indices[i], losses[i]). INVALID_ARGUMENT, and nothing added, when the spans
  // differ in length, an index is not below the layout's N (`indices[i]`), or a loss is not
  // finite, negative or not below kMaxGroupLoss (`losses[i]`), naming the pair and the value.
  // The layout must have groups() groups (a precondition).
  absl::Status Add(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                   absl::Span<const float> losses);
  // Add's checks alone (a caller that must refuse a bad batch before it records it).
  static absl::Status Check(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                            absl::Span<const float> losses);
  // Add without its checks, for pairs that passed Check (a precondition): the job checks a batch
  // before taking its lock and adds the accepted pairs under it, without a second pass.
  void AddChecked(const GroupLayout& layout, absl::Span<const uint64_t> indices,
                  absl::Span<const float> losses);

  // Merges another epoch's statistics of the same groups (e.g. a thread's): the same result as
  // adding its pairs here. Precondition: other.groups() == groups().
  void Merge(const GroupLosses& other);

  uint32_t groups() const { return static_cast<uint32_t>(counts_.size()); }
  uint64_t count(uint32_t k) const { return counts_[k]; }
  unsigned __int128 fixed_sum(uint32_t k) const { return sums_[k]; }  // S_k.
  // The mean loss of group k; precondition: count(k) > 0.
  double Mean(uint32_t k) const;

 private:
  std::vector<uint64_t> counts_;
  std::vector<unsigned __int128> sums_;
};

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_GROUP_LOSSES_H_
