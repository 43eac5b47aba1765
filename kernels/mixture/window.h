// The window of a mixture job (docs/SAMPLING.md, "Mixture jobs", "The window"): the M global
// indices of one epoch, a pure function of (seed, epoch, group sizes, cursors, counts). Each
// group contributes the next c_k entries of its own pass order (kernels/mixture/pass_order.h),
// wrapping into its next pass (a new key) whenever a pass ends; the contributions, group 0's
// first, are then shuffled by the plans' uniform shuffle (kernels/internal/shuffle.h, with the
// epoch's (seed, epoch)), and the result is dealt to the ranks as any plan (kernels/shard.h).
// Memory O(K + M). Host code; the per-entry rule is window_math.h's, shared with the device.
// Thread-safe: GroupLayout is immutable, PlanWindow a pure function.
#ifndef SAMPLERD_KERNELS_MIXTURE_WINDOW_H_
#define SAMPLERD_KERNELS_MIXTURE_WINDOW_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/mixture/window_math.h"

namespace samplerd {
namespace mixture {

// The groups of a mixture job: group k holds the global indices [offset(k), offset(k) +
// size(k)), offsets the prefix sums of the sizes in group order.
class GroupLayout {
 public:
  // INVALID_ARGUMENT naming the field and value: no group or more than kMaxGroups
  // (apportion.h), a size of 0 (`sizes[k]`), or sizes adding up to more than 2^63
  // (`sizes`: the group where the sum passes it).
  static absl::StatusOr<GroupLayout> Create(absl::Span<const uint64_t> sizes);

  uint32_t groups() const { return static_cast<uint32_t>(sizes_.size()); }
  uint64_t size(uint32_t k) const { return sizes_[k]; }
  uint64_t offset(uint32_t k) const { return offsets_[k]; }
  uint64_t total() const { return offsets_.back(); }  // N.
  // The K sizes and the K + 1 offsets (offsets()[K] = N), e.g. to upload them to a device.
  absl::Span<const uint64_t> sizes() const { return sizes_; }
  absl::Span<const uint64_t> offsets() const { return offsets_; }
  // The group of global index i < total(): the k with offset(k) <= i < offset(k + 1) (a binary
  // search, window_math.h's GroupOfWindowPosition on the offsets). O(log K).
  uint32_t GroupOf(uint64_t i) const { return GroupOfWindowPosition(offsets_.data(), groups(), i); }

 private:
  GroupLayout(std::vector<uint64_t> sizes, std::vector<uint64_t> offsets)
      : sizes_(std::move(sizes)), offsets_(std::move(offsets)) {}

  std::vector<uint64_t> sizes_;
  std::vector<uint64_t> offsets_;  // K + 1 entries.
};

// A window: its global indices, shuffled, and the cursors after it.
struct MixtureWindow {
  std::vector<uint64_t> indices;     // M = sum of the counts.
  std::vector<GroupCursor> cursors;  // K: where each group's next window starts.
};

// The checks of PlanWindow (also for a caller that fills the window elsewhere, the CUDA
// backend): INVALID_ARGUMENT naming the field, the group and the value when cursors or counts
// do not have one entry per group, a cursor's position is not below its group's size, a pass
// number would pass 2^64 - 1, or the counts add up to more than plan_math::kMaxShuffleInputs
// (2^34, the shuffle's limit).
absl::Status ValidateWindow(const GroupLayout& layout, absl::Span<const GroupCursor> cursors,
                            absl::Span<const uint64_t> counts);

// ValidateWindow, then INVALID_ARGUMENT naming `out` when `out_size` is not the sum of the counts
// (the window's size M): the checks of PlanWindowInto and of a compute backend's window
// (ComputeBackend::PlanMixtureWindow), in one place. Returns M.
absl::StatusOr<uint64_t> ValidateWindowInto(const GroupLayout& layout,
                                            absl::Span<const GroupCursor> cursors,
                                            absl::Span<const uint64_t> counts, uint64_t out_size);

// The cursors after a window of `counts` from `cursors` (AdvanceCursor by each count): O(K).
// Preconditions: ValidateWindow passed.
std::vector<GroupCursor> CursorsAfter(const GroupLayout& layout,
                                      absl::Span<const GroupCursor> cursors,
                                      absl::Span<const uint64_t> counts);

// The window's entries before the shuffle, in group order (window_math.h's WindowEntry for
// every group k and i < counts[k]), into `out` (sum of the counts entries). Preconditions:
// ValidateWindow passed. `threads` changes only the speed.
void FillWindow(int threads, uint64_t seed, const GroupLayout& layout,
                absl::Span<const GroupCursor> cursors, absl::Span<const uint64_t> counts,
                absl::Span<uint64_t> out);

// The window of `epoch`: FillWindow's entries, shuffled by the uniform shuffle under (seed,
// epoch) as they are computed (internal::ShuffleGenerated: no array of the unshuffled entries;
// 8 bytes per sample and the shuffle's scratch at the peak); and the new
// cursors (AdvanceCursor by each count). ValidateWindow's errors; nothing else fails.
absl::StatusOr<MixtureWindow> PlanWindow(int threads, uint64_t seed, uint64_t epoch,
                                         const GroupLayout& layout,
                                         absl::Span<const GroupCursor> cursors,
                                         absl::Span<const uint64_t> counts);

// The memory PlanWindowInto allocates besides `out` and the cursors it returns, at its peak, for
// K groups and a window of m samples on `threads` threads: the counts' prefix sums and the
// shuffle's scratch (internal::ShuffleScratchBytes).
uint64_t PlanWindowScratchBytes(int threads, uint64_t groups, uint64_t m);

// PlanWindow written into `out` (the caller's storage, e.g. a plan's indices: no other copy of
// the window), returning the new cursors (CursorsAfter). ValidateWindowInto's errors (out.size()
// not the sum of the counts: `out`); nothing is written on error. The CPU backend's
// ComputeBackend::PlanMixtureWindow.
absl::StatusOr<std::vector<GroupCursor>> PlanWindowInto(int threads, uint64_t seed, uint64_t epoch,
                                                        const GroupLayout& layout,
                                                        absl::Span<const GroupCursor> cursors,
                                                        absl::Span<const uint64_t> counts,
                                                        absl::Span<uint64_t> out);

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_WINDOW_H_
