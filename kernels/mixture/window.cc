#include "kernels/mixture/window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/shuffle.h"
#include "kernels/internal/simd_level.h"
#include "kernels/mixture/apportion.h"
#include "kernels/philox.h"
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

absl::StatusOr<uint64_t> ValidateWindowInto(const GroupLayout& layout,
                                            absl::Span<const GroupCursor> cursors,
                                            absl::Span<const uint64_t> counts, uint64_t out_size) {
  if (absl::Status status = ValidateWindow(layout, cursors, counts); !status.ok()) return status;
  uint64_t m = 0;
  for (uint64_t c : counts) m += c;  // ValidateWindow: at most 2^34.
  if (out_size != m) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: ", out_size, " entries for a window of ", m));
  }
  return m;
}

std::vector<GroupCursor> CursorsAfter(const GroupLayout& layout,
                                      absl::Span<const GroupCursor> cursors,
                                      absl::Span<const uint64_t> counts) {
  std::vector<GroupCursor> next(layout.groups());
  for (uint32_t k = 0; k < layout.groups(); ++k) {
    next[k] = AdvanceCursor(cursors[k], layout.size(k), counts[k]);
  }
  return next;
}

namespace {

// Entries [first, first + count) of one pass of one group (n > 1), into out[0, count): what
// PassOrder::At gives, computed kBatch positions at a time, round by round over the whole batch
// (loops over 32-bit lanes that vectorise: 8 Mix32 per AVX2 instruction). After each network
// evaluation the entries that landed below n are written and the others (1 - n / 2^b of them
// at first, under half: a quarter at n = 10^8) are packed to the front of the batch and walk on
// together. Results are PassOrder::At's (window_test compares them).
constexpr uint64_t kBatch = 256;

SAMPLERD_INLINE void PassEntriesLoop(const PassKey& key, uint64_t n, uint64_t offset,
                                     uint64_t first, uint64_t count, uint64_t* out) {
  const uint32_t bits = static_cast<uint32_t>(plan_math::BitWidth(n - 1));
  const uint32_t u = bits / 2, v = bits - bits / 2;
  const int rounds = PassOrderRounds(bits);
  // The widths of A are u, v, u, ... round by round (pass_order.h, step 2).
  const uint32_t mask_u = static_cast<uint32_t>((uint64_t{1} << u) - 1);
  const uint32_t mask_v = static_cast<uint32_t>((uint64_t{1} << v) - 1);
  uint64_t x[kBatch];
  uint32_t a[kBatch], b[kBatch], slot[kBatch];
  for (uint64_t done = 0; done < count; done += kBatch) {
    uint64_t live = std::min(kBatch, count - done);
    for (uint64_t i = 0; i < live; ++i) {
      x[i] = first + done + i;
      slot[i] = static_cast<uint32_t>(i);
    }
    while (live > 0) {
      for (uint64_t i = 0; i < live; ++i) {
        a[i] = static_cast<uint32_t>(x[i] >> v);
        b[i] = static_cast<uint32_t>(x[i]) & mask_v;
      }
      for (int r = 0; r < rounds; ++r) {
        const uint32_t k = key.k[r], mask = r % 2 == 0 ? mask_u : mask_v;
        for (uint64_t i = 0; i < live; ++i) {
          const uint32_t c = a[i] ^ (Mix32(b[i] ^ k) & mask);
          a[i] = b[i];
          b[i] = c;
        }
      }
      // Widths (u, v) again: y = A 2^v + B. Every entry is written; one that walks on is
      // written again when it lands.
      uint64_t walking = 0;
      for (uint64_t i = 0; i < live; ++i) {
        const uint64_t y = (uint64_t{a[i]} << v) | b[i];
        const uint32_t s = slot[i];
        out[done + s] = offset + y;
        x[walking] = y;
        slot[walking] = s;
        walking += y >= n;
      }
      live = walking;
    }
  }
}

SAMPLERD_TARGET_AVX2 void PassEntriesAvx2(const PassKey& key, uint64_t n, uint64_t offset,
                                          uint64_t first, uint64_t count, uint64_t* out) {
  PassEntriesLoop(key, n, offset, first, count, out);
}
void PassEntriesScalar(const PassKey& key, uint64_t n, uint64_t offset, uint64_t first,
                       uint64_t count, uint64_t* out) {
  PassEntriesLoop(key, n, offset, first, count, out);
}

// PassEntriesLoop compiled for the widest level this CPU has (the same entries at every level:
// 32-bit integer arithmetic; AVX-512 would add nothing here that AVX2 does not).
void PassEntries(const PassKey& key, uint64_t n, uint64_t offset, uint64_t first, uint64_t count,
                 uint64_t* out) {
  static const bool avx2 = internal::BestSimdLevel() != internal::SimdLevel::kScalar;
  if (avx2) return PassEntriesAvx2(key, n, offset, first, count, out);
  PassEntriesScalar(key, n, offset, first, count, out);
}

// Window positions [begin, end) into out[0, end - begin); starts: the exclusive prefix sums of
// the counts (K + 1). A range walks its groups, and within a group its passes (one key per pass
// run).
void FillRange(uint64_t seed, const GroupLayout& layout, absl::Span<const GroupCursor> cursors,
               const std::vector<uint64_t>& starts, uint64_t begin, uint64_t end, uint64_t* out) {
  const uint32_t k_groups = layout.groups();
  uint32_t k = GroupOfWindowPosition(starts.data(), k_groups, begin);
  for (uint64_t w = begin; w < end;) {
    while (starts[k + 1] <= w) ++k;  // Skips the groups with a count of 0.
    const uint64_t n = layout.size(k), offset = layout.offset(k);
    const uint64_t group_end = std::min(end, starts[k + 1]);
    GroupCursor at = AdvanceCursor(cursors[k], n, w - starts[k]);
    while (w < group_end) {
      const uint64_t run = std::min(group_end - w, n - at.position);  // To the pass's end.
      if (n == 1) {
        out[w - begin] = offset;
      } else {
        PassEntries(MakePassKey(seed, k, at.pass), n, offset, at.position, run, &out[w - begin]);
      }
      w += run;
      at = AdvanceCursor(at, n, run);
    }
  }
}

std::vector<uint64_t> WindowStarts(absl::Span<const uint64_t> counts) {
  std::vector<uint64_t> starts(counts.size() + 1, 0);
  for (size_t k = 0; k < counts.size(); ++k) starts[k + 1] = starts[k] + counts[k];
  return starts;
}

}  // namespace

void FillWindow(int threads, uint64_t seed, const GroupLayout& layout,
                absl::Span<const GroupCursor> cursors, absl::Span<const uint64_t> counts,
                absl::Span<uint64_t> out) {
  const std::vector<uint64_t> starts = WindowStarts(counts);
  // Chunks of the window (not of the groups: one group may hold it all).
  constexpr uint64_t kGrain = 1 << 14;
  internal::ParallelForChunks(threads, starts.back(), kGrain,
                              [&](uint64_t, uint64_t begin, uint64_t end) {
                                FillRange(seed, layout, cursors, starts, begin, end, &out[begin]);
                              });
}

uint64_t PlanWindowScratchBytes(int threads, uint64_t groups, uint64_t m) {
  return (groups + 1) * sizeof(uint64_t) + internal::ShuffleScratchBytes(threads, m);
}

absl::StatusOr<std::vector<GroupCursor>> PlanWindowInto(int threads, uint64_t seed, uint64_t epoch,
                                                        const GroupLayout& layout,
                                                        absl::Span<const GroupCursor> cursors,
                                                        absl::Span<const uint64_t> counts,
                                                        absl::Span<uint64_t> out) {
  if (absl::StatusOr<uint64_t> m = ValidateWindowInto(layout, cursors, counts, out.size());
      !m.ok()) {
    return m.status();
  }
  const std::vector<uint64_t> starts = WindowStarts(counts);
  // The entries are computed block by block as the shuffle scatters them (FillWindow's entries,
  // never held as a whole): the window costs 8 bytes per sample plus the shuffle's scratch, as
  // a plan of 64-bit indices does.
  const internal::InputBlockFn entries = [&](uint64_t k, uint64_t count, uint64_t* values) {
    FillRange(seed, layout, cursors, starts, k, k + count, values);
  };
  internal::ShuffleGenerated(threads, seed, epoch, entries, out);
  return CursorsAfter(layout, cursors, counts);
}

absl::StatusOr<MixtureWindow> PlanWindow(int threads, uint64_t seed, uint64_t epoch,
                                         const GroupLayout& layout,
                                         absl::Span<const GroupCursor> cursors,
                                         absl::Span<const uint64_t> counts) {
  if (absl::Status status = ValidateWindow(layout, cursors, counts); !status.ok()) return status;
  MixtureWindow window;
  uint64_t m = 0;
  for (uint64_t c : counts) m += c;  // ValidateWindow: at most 2^34.
  window.indices.resize(m);
  absl::StatusOr<std::vector<GroupCursor>> next =
      PlanWindowInto(threads, seed, epoch, layout, cursors, counts, absl::MakeSpan(window.indices));
  if (!next.ok()) return next.status();
  window.cursors = *std::move(next);
  return window;
}

}  // namespace mixture
}  // namespace samplerd
