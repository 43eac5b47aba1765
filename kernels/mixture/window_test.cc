// The window of a mixture job (window.h) against docs/SAMPLING.md, "Mixture jobs": every sample
// exactly once per pass of its group (exhaustively over full passes, for several K and size
// mixes, groups smaller than a window included), the window's shares equal the apportionment,
// a pure function of (seed, epoch, cursors, counts) (a golden hash; the same windows from saved
// cursors; any thread count), N = 10^12, and bad input.
#include "kernels/mixture/window.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mixture/apportion.h"
#include "kernels/testing/weight_cases.h"

namespace samplerd {
namespace mixture {
namespace {

using ::testing::HasSubstr;

uint32_t GroupOf(const GroupLayout& layout, uint64_t index) {
  uint32_t k = 0;
  while (layout.offset(k + 1) <= index) ++k;
  return k;
}

struct Mix {
  std::vector<uint64_t> sizes;
  std::vector<double> weights;
  uint64_t window;
};

// Windows from the apportionment until every group has completed `passes` passes; each group's
// entries (FillWindow, before the shuffle, in window order) must be, pass by pass, a permutation
// of the group's indices; the shuffled window must hold the same entries, and each group as
// many as its count.
TEST(WindowTest, EverySampleOncePerPass) {
  const Mix mixes[] = {
      {{7}, {1.0}, 5},                                   // One group, windows across passes.
      {{1, 2, 3, 50}, {1.0, 1.0, 1.0, 1.0}, 16},         // Groups smaller than a window.
      {{1000, 17, 1, 333}, {0.5, 3.0, 0.25, 1.0}, 100},  // Small groups wrap many times.
      {{64, 64, 64}, {2.0, 0.0, 1.0}, 9},                // A zero weight: no pass at all.
      {{5, 200, 31, 8, 999, 2}, {1.0, 4.0, 2.0, 0.1, 8.0, 0.5}, 257},
  };
  for (const Mix& mix : mixes) {
    auto layout = GroupLayout::Create(mix.sizes);
    ASSERT_TRUE(layout.ok());
    auto shares = SharesOf(mix.weights);
    ASSERT_TRUE(shares.ok());
    auto apportioner = Apportioner::Create(mix.sizes.size());
    ASSERT_TRUE(apportioner.ok());
    const uint32_t k_groups = layout->groups();
    std::vector<GroupCursor> cursors(k_groups);
    std::vector<std::vector<uint64_t>> seen(k_groups);  // Each group's entries in order.
    auto done = [&] {
      for (uint32_t k = 0; k < k_groups; ++k) {
        if (mix.weights[k] > 0 && cursors[k].pass < 3) return false;
      }
      return true;
    };
    for (uint64_t epoch = 0; !done(); ++epoch) {
      ASSERT_LT(epoch, 100000u);
      auto counts = apportioner->Next(*shares, mix.window);
      ASSERT_TRUE(counts.ok());
      std::vector<uint64_t> entries(mix.window);
      FillWindow(2, 11, *layout, cursors, counts->counts, absl::MakeSpan(entries));
      auto window = PlanWindow(2, 11, epoch, *layout, cursors, counts->counts);
      ASSERT_TRUE(window.ok()) << window.status();
      std::vector<uint64_t> per_group(k_groups, 0);
      for (uint64_t x : window->indices) ++per_group[GroupOf(*layout, x)];
      EXPECT_EQ(per_group, counts->counts) << "epoch " << epoch;
      std::vector<uint64_t> a = entries, b = window->indices;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ASSERT_EQ(a, b) << "the shuffle must permute the filled entries";
      for (uint64_t x : entries) seen[GroupOf(*layout, x)].push_back(x);
      cursors = window->cursors;
    }
    for (uint32_t k = 0; k < k_groups; ++k) {
      const uint64_t n = layout->size(k);
      const uint64_t full = seen[k].size() / n;
      EXPECT_EQ(full, cursors[k].pass);
      EXPECT_EQ(seen[k].size() % n, cursors[k].position);
      std::vector<std::vector<uint64_t>> orders;
      for (uint64_t p = 0; p < full; ++p) {
        std::vector<uint64_t> pass(seen[k].begin() + p * n, seen[k].begin() + (p + 1) * n);
        orders.push_back(pass);
        std::sort(pass.begin(), pass.end());
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_EQ(pass[i], layout->offset(k) + i) << "group " << k << " pass " << p;
        }
      }
      // A new order each pass (for groups of more than 16: small ones repeat an order by chance).
      if (n > 16 && full >= 2) {
        EXPECT_NE(orders[0], orders[1]) << "group " << k;
      }
    }
  }
}

// FillWindow (lanes side by side, kernels/mixture/window.cc) gives window_math.h's WindowEntry
// for every position: groups whose walks are long (n = 2^k + 1), of one sample, smaller and
// larger than the lanes, runs across passes, and chunks of the parallel fill.
TEST(WindowTest, FillIsThePerEntryRule) {
  const std::vector<uint64_t> sizes = {1, 2, 3, 17, 65537, 100000, 1, 5, (uint64_t{1} << 40) + 1};
  auto layout = GroupLayout::Create(sizes);
  ASSERT_TRUE(layout.ok());
  const std::vector<GroupCursor> cursors = {{0, 3},    {1, 0},     {2, 9},
                                            {16, 1},   {65530, 7}, {0, 0},
                                            {0, 1000}, {4, 2},     {(uint64_t{1} << 40) - 3, 0}};
  const std::vector<uint64_t> counts = {3, 7, 1, 40, 70000, 15, 0, 12, 40000};
  uint64_t m = 0;
  for (uint64_t c : counts) m += c;
  std::vector<uint64_t> filled(m);
  FillWindow(2, 99, *layout, cursors, counts, absl::MakeSpan(filled));
  uint64_t w = 0;
  for (uint32_t k = 0; k < layout->groups(); ++k) {
    for (uint64_t i = 0; i < counts[k]; ++i, ++w) {
      ASSERT_EQ(filled[w], WindowEntry(99, k, layout->offset(k), sizes[k], cursors[k], i))
          << "group " << k << " entry " << i;
    }
  }
}

TEST(WindowTest, GoldenHash) {
  auto layout = GroupLayout::Create({5, 1000, 37, 1});
  ASSERT_TRUE(layout.ok());
  auto shares = SharesOf({1.0, 2.0, 3.0, 0.5});
  ASSERT_TRUE(shares.ok());
  auto apportioner = Apportioner::Create(4);
  ASSERT_TRUE(apportioner.ok());
  std::vector<GroupCursor> cursors(4);
  std::vector<uint64_t> all;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    auto counts = apportioner->Next(*shares, 64);
    ASSERT_TRUE(counts.ok());
    auto window = PlanWindow(1, 7, epoch, *layout, cursors, counts->counts);
    ASSERT_TRUE(window.ok());
    all.insert(all.end(), window->indices.begin(), window->indices.end());
    cursors = window->cursors;
  }
  EXPECT_EQ(testutil::Fnv1a(all), 0x39f8391fad626d69ull)
      << std::hex << "0x" << testutil::Fnv1a(all);
}

TEST(WindowTest, APureFunctionOfItsInputs) {
  // From saved cursors the same windows follow (a restart), for any thread count.
  auto layout = GroupLayout::Create({100000, 3, 250000, 77});
  ASSERT_TRUE(layout.ok());
  auto shares = SharesOf({1.0, 0.01, 2.0, 0.5});
  ASSERT_TRUE(shares.ok());
  auto apportioner = Apportioner::Create(4);
  ASSERT_TRUE(apportioner.ok());
  std::vector<GroupCursor> cursors(4);
  std::vector<std::vector<uint64_t>> counts_of;
  std::vector<std::vector<GroupCursor>> cursors_of;
  std::vector<std::vector<uint64_t>> windows;
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    auto counts = apportioner->Next(*shares, 150000);
    ASSERT_TRUE(counts.ok());
    counts_of.push_back(counts->counts);
    cursors_of.push_back(cursors);
    auto window = PlanWindow(1, 5, epoch, *layout, cursors, counts->counts);
    ASSERT_TRUE(window.ok());
    windows.push_back(window->indices);
    cursors = window->cursors;
  }
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    auto again = PlanWindow(2, 5, epoch, *layout, cursors_of[epoch], counts_of[epoch]);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->indices, windows[epoch]) << "epoch " << epoch;
  }
  // Another epoch shuffles the same entries differently; another seed takes other entries.
  auto other_epoch = PlanWindow(2, 5, 9, *layout, cursors_of[1], counts_of[1]);
  auto other_seed = PlanWindow(2, 6, 1, *layout, cursors_of[1], counts_of[1]);
  ASSERT_TRUE(other_epoch.ok() && other_seed.ok());
  EXPECT_NE(other_epoch->indices, windows[1]);
  std::vector<uint64_t> a = other_epoch->indices, b = windows[1];
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  std::vector<uint64_t> c = other_seed->indices;
  std::sort(c.begin(), c.end());
  EXPECT_NE(c, b);
}

TEST(WindowTest, ATrillionSamplesInTenThousandGroups) {
  std::vector<uint64_t> sizes(10000, 100000000);  // N = 10^12.
  auto layout = GroupLayout::Create(sizes);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total(), 1000000000000ull);
  std::vector<double> weights(10000);
  for (int k = 0; k < 10000; ++k) weights[k] = 1.0 + k % 7;
  auto shares = SharesOf(weights);
  ASSERT_TRUE(shares.ok());
  auto apportioner = Apportioner::Create(10000);
  ASSERT_TRUE(apportioner.ok());
  auto counts = apportioner->Next(*shares, 200000);
  ASSERT_TRUE(counts.ok());
  std::vector<GroupCursor> cursors(10000, GroupCursor{99999990, 41});  // Near a pass's end.
  auto window = PlanWindow(2, 1, 0, *layout, cursors, counts->counts);
  ASSERT_TRUE(window.ok());
  std::vector<uint64_t> sorted = window->indices;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 200000);
  EXPECT_LT(sorted.back(), layout->total());
  for (uint32_t k = 0; k < 10000; ++k) {
    const uint64_t total = 99999990 + counts->counts[k];
    EXPECT_EQ(window->cursors[k].pass, 41 + total / 100000000);
    EXPECT_EQ(window->cursors[k].position, total % 100000000);
  }
}

TEST(WindowTest, BadLayoutsNameTheField) {
  EXPECT_THAT(std::string(GroupLayout::Create({}).status().message()),
              HasSubstr("sizes: 0 groups"));
  auto status = GroupLayout::Create({3, 0, 2}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sizes[1] = 0"));
  status = GroupLayout::Create({uint64_t{1} << 62, uint64_t{1} << 62, 1}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sizes[2] = 1 hold more than 2^63"));
  EXPECT_TRUE(GroupLayout::Create({uint64_t{1} << 62, uint64_t{1} << 62}).ok());  // Exactly 2^63.
  status = GroupLayout::Create(std::vector<uint64_t>(kMaxGroups + 1, 1)).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("sizes: 1000001 groups"));
}

TEST(WindowTest, BadWindowsNameTheGroupAndChangeNothing) {
  auto layout = GroupLayout::Create({10, 20});
  ASSERT_TRUE(layout.ok());
  const std::vector<GroupCursor> cursors = {{3, 0}, {19, 5}};
  struct Case {
    std::vector<GroupCursor> cursors;
    std::vector<uint64_t> counts;
    std::string message;
  } cases[] = {
      {{{0, 0}}, {1, 1}, "cursors: 1 cursors for 2 groups"},
      {cursors, {1, 1, 1}, "counts: 3 counts for 2 groups"},
      {{{3, 0}, {20, 0}}, {1, 1}, "cursors[1].position = 20: not below the group's size 20"},
      {cursors, {uint64_t{1} << 34, 1}, "at counts[1] = 1"},
      {{{3, 0}, {19, ~uint64_t{0}}}, {0, 1}, "cursors[1].pass = 18446744073709551615"},
  };
  for (const Case& c : cases) {
    auto window = PlanWindow(1, 1, 1, *layout, c.cursors, c.counts);
    ASSERT_FALSE(window.ok()) << c.message;
    EXPECT_EQ(window.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(window.status().message()), HasSubstr(c.message));
  }
  // The last pass number itself is fine while the window does not pass it.
  EXPECT_TRUE(PlanWindow(1, 1, 1, *layout, {{3, 0}, {0, ~uint64_t{0}}}, {0, 19}).ok());
}

}  // namespace
}  // namespace mixture
}  // namespace samplerd
