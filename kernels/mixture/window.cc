#include "kernels/mixture/window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/shuffle.h"
#include "kernels/mixture/apportion.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace mixture {

absl::StatusOr<GroupLayout> GroupLayout::Create(absl::Span<const uint64_t> sizes) {
  if (sizes.empty() || sizes.size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sizes: ", sizes.size(), " groups; a mixture has 1 to ", kMaxGroups, " groups"));
  }
  std::vector<uint64_t> offsets(sizes.size() + 1, 0);
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sizes[", k, "] = 0: every group holds at least one sample"));
    }
    if (sizes[k] > kMaxGroupSize - offsets[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sizes: the groups up to sizes[", k, "] = ", sizes[k],
                       " hold more than 2^63 samples (", offsets[k], " before it)"));
    }
    offsets[k + 1] = offsets[k] + sizes[k];
  }
  return GroupLayout(std::vector<uint64_t>(sizes.begin(), sizes.end()), std::move(offsets));
}

absl::Status ValidateWindow(const GroupLayout& layout, absl::Span<const GroupCursor> cursors,
                            absl::Span<const uint64_t> counts) {
  const uint32_t k_groups = layout.groups();
  if (cursors.size() != k_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursors: ", cursors.size(), " cursors for ", k_groups, " groups"));
  }
  if (counts.size() != k_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("counts: ", counts.size(), " counts for ", k_groups, " groups"));
  }
  uint64_t total = 0;
  for (uint32_t k = 0; k < k_groups; ++k) {
    const uint64_t n = layout.size(k);
    if (cursors[k].position >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cursors[", k, "].position = ", cursors[k].position, ": not below the group's size ", n));
    }
    if (counts[k] > plan_math::kMaxShuffleInputs - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("counts: the window passes ", plan_math::kMaxShuffleInputs,
                       " samples (the shuffle's limit) at counts[", k, "] = ", counts[k]));
    }
    total += counts[k];
    const uint64_t passes = (cursors[k].position + counts[k]) / n;
    if (passes > ~uint64_t{0} - cursors[k].pass) {
      return absl::InvalidArgumentError(absl::StrCat("cursors[", k, "].pass = ", cursors[k].pass,
                                                     ": the window would pass pass 2^64 - 1"));
    }
  }
  return absl::OkStatus();
}

void FillWindow(int threads, uint64_t seed, const GroupLayout& layout,
                absl::Span<const GroupCursor> cursors, absl::Span<const uint64_t> counts,
                absl::Span<uint64_t> out) {
  const uint32_t k_groups = layout.groups();
  std::vector<uint64_t> starts(k_groups + 1, 0);  // Exclusive prefix sums of the counts.
  for (uint32_t k = 0; k < k_groups; ++k) starts[k + 1] = starts[k] + counts[k];
  // Chunks of the window (not of the groups: one group may hold it all). A chunk walks its
  // groups, and within a group keeps one PassOrder per pass (the key costs a Philox call).
  constexpr uint64_t kGrain = 1 << 14;
  internal::ParallelForChunks(
      threads, starts[k_groups], kGrain, [&](uint64_t, uint64_t begin, uint64_t end) {
        uint32_t k = GroupOfWindowPosition(starts.data(), k_groups, begin);
        for (uint64_t w = begin; w < end;) {
          while (starts[k + 1] <= w) ++k;  // Skips the groups with a count of 0.
          const uint64_t n = layout.size(k), offset = layout.offset(k);
          const uint64_t group_end = std::min(end, starts[k + 1]);
          GroupCursor at = AdvanceCursor(cursors[k], n, w - starts[k]);
          while (w < group_end) {
            const PassOrder order(MakePassKey(seed, k, at.pass), n);
            const uint64_t run = std::min(group_end - w, n - at.position);  // To the pass's end.
            for (uint64_t i = 0; i < run; ++i) out[w + i] = offset + order.At(at.position + i);
            w += run;
            at = AdvanceCursor(at, n, run);
          }
        }
      });
}

absl::StatusOr<MixtureWindow> PlanWindow(int threads, uint64_t seed, uint64_t epoch,
                                         const GroupLayout& layout,
                                         absl::Span<const GroupCursor> cursors,
                                         absl::Span<const uint64_t> counts) {
  if (absl::Status status = ValidateWindow(layout, cursors, counts); !status.ok()) return status;
  uint64_t m = 0;
  for (uint64_t c : counts) m += c;
  MixtureWindow window;
  {
    std::vector<uint64_t> entries(m);
    FillWindow(threads, seed, layout, cursors, counts, absl::MakeSpan(entries));
    window.indices.resize(m);
    internal::ShuffleIndices(threads, seed, epoch, absl::MakeConstSpan(entries),
                             absl::MakeSpan(window.indices));
  }
  window.cursors.resize(layout.groups());
  for (uint32_t k = 0; k < layout.groups(); ++k) {
    window.cursors[k] = AdvanceCursor(cursors[k], layout.size(k), counts[k]);
  }
  return window;
}

}  // namespace mixture
}  // namespace samplerd
