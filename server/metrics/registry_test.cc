#include "server/metrics/registry.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace metrics {
namespace {

using ::testing::HasSubstr;

TEST(RegistryTest, RendersTheExactTextFormat) {
  Registry registry;
  auto* rpcs = registry.AddCounter("test_rpcs_total", "RPCs handled.", {"method", "code"});
  rpcs->WithLabels({"GetJob", "OK"})->Increment();
  rpcs->WithLabels({"GetJob", "OK"})->Increment(2);
  rpcs->WithLabels({"CreateJob", "NOT_FOUND"})->Increment();
  registry.AddGauge("test_up", "Whether it is up.")->WithLabels({})->Set(1);
  auto* latency =
      registry.AddHistogram("test_latency_seconds", "Latency.", {"method"}, {0.1, 1, 2.5});
  registry.AddGauge("test_small", "Small.")->WithLabels({})->Set(0.0005);
  auto h = latency->WithLabels({"GetJob"});
  h->Observe(0.05);
  h->Observe(0.1);  // On a bound: counted in that bucket (le means <=).
  h->Observe(2);
  h->Observe(100);
  registry.AddGaugeCallback("test_jobs", "Jobs by name.", {"job"}, [] {
    return std::vector<GaugeSample>{{{"b"}, 2.5}, {{"a"}, 1e21}};
  });
  EXPECT_EQ(registry.Render(),
            "# HELP test_jobs Jobs by name.\n"
            "# TYPE test_jobs gauge\n"
            "test_jobs{job=\"a\"} 1e+21\n"
            "test_jobs{job=\"b\"} 2.5\n"
            "# HELP test_latency_seconds Latency.\n"
            "# TYPE test_latency_seconds histogram\n"
            "test_latency_seconds_bucket{method=\"GetJob\",le=\"0.1\"} 2\n"
            "test_latency_seconds_bucket{method=\"GetJob\",le=\"1\"} 2\n"
            "test_latency_seconds_bucket{method=\"GetJob\",le=\"2.5\"} 3\n"
            "test_latency_seconds_bucket{method=\"GetJob\",le=\"+Inf\"} 4\n"
            "test_latency_seconds_sum{method=\"GetJob\"} 102.15\n"
            "test_latency_seconds_count{method=\"GetJob\"} 4\n"
            "# HELP test_rpcs_total RPCs handled.\n"
            "# TYPE test_rpcs_total counter\n"
            "test_rpcs_total{method=\"CreateJob\",code=\"NOT_FOUND\"} 1\n"
            "test_rpcs_total{method=\"GetJob\",code=\"OK\"} 3\n"
            "# HELP test_small Small.\n"
            "# TYPE test_small gauge\n"
            "test_small 0.0005\n"
            "# HELP test_up Whether it is up.\n"
            "# TYPE test_up gauge\n"
            "test_up 1\n");
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  registry.AddGauge("test_g", "Line one\nback\\slash \"quoted\"", {"job"})
      ->WithLabels({"a\"b\\c\nd"})
      ->Set(-0.5);
  EXPECT_EQ(registry.Render(),
            "# HELP test_g Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE test_g gauge\n"
            "test_g{job=\"a\\\"b\\\\c\\nd\"} -0.5\n");
}

TEST(RegistryTest, LabelledFamiliesWithoutSeriesAreOmittedAndRemovedSeriesVanish) {
  Registry registry;
  auto* family = registry.AddCounter("test_total", "Help.", {"job"});
  EXPECT_EQ(registry.Render(), "");
  std::shared_ptr<Counter> kept = family->WithLabels({"gone"});
  kept->Increment();
  EXPECT_THAT(registry.Render(), HasSubstr("test_total{job=\"gone\"} 1"));
  family->Remove({"gone"});
  kept->Increment();  // Still safe to use, no longer rendered.
  EXPECT_EQ(registry.Render(), "");
  // An unlabelled family renders 0 from the start.
  registry.AddCounter("test_plain_total", "Help.");
  EXPECT_THAT(registry.Render(), HasSubstr("test_plain_total 0\n"));
}

TEST(RegistryTest, NonFiniteValuesUsePrometheusSpelling) {
  Registry registry;
  auto* g = registry.AddGauge("test_g", "Help.", {"k"});
  g->WithLabels({"inf"})->Set(std::numeric_limits<double>::infinity());
  g->WithLabels({"nan"})->Set(std::numeric_limits<double>::quiet_NaN());
  g->WithLabels({"ninf"})->Set(-std::numeric_limits<double>::infinity());
  EXPECT_THAT(registry.Render(), HasSubstr("test_g{k=\"inf\"} +Inf\n"
                                           "test_g{k=\"nan\"} NaN\n"
                                           "test_g{k=\"ninf\"} -Inf\n"));
}

TEST(RegistryTest, ConcurrentUpdatesAreAllCounted) {
  Registry registry;
  auto* counters = registry.AddCounter("test_total", "Help.", {"thread"});
  auto* histograms = registry.AddHistogram("test_seconds", "Help.", {}, {0.5});
  constexpr int kThreads = 8;
  constexpr int kIncrements = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  // A scraper renders all the while (must neither crash nor block the writers).
  std::thread scraper([&] {
    while (!done.load()) registry.Render();
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one series, half have their own: creation races too.
      auto counter = counters->WithLabels({t % 2 == 0 ? "shared" : std::to_string(t)});
      auto histogram = histograms->WithLabels({});
      for (int i = 0; i < kIncrements; ++i) {
        counter->Increment();
        histogram->Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  done = true;
  scraper.join();
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("test_total{thread=\"shared\"} " +
                              std::to_string(kThreads / 2 * kIncrements) + "\n"));
  EXPECT_THAT(text, HasSubstr("test_total{thread=\"1\"} " + std::to_string(kIncrements) + "\n"));
  const int total = kThreads * kIncrements;
  EXPECT_THAT(text, HasSubstr("test_seconds_bucket{le=\"0.5\"} " + std::to_string(total / 2)));
  EXPECT_THAT(text, HasSubstr("test_seconds_bucket{le=\"+Inf\"} " + std::to_string(total)));
  EXPECT_THAT(text, HasSubstr("test_seconds_count " + std::to_string(total)));
  // 0.25 and 1.0 are exact in binary: the sum is exact whatever the order of additions.
  EXPECT_THAT(text, HasSubstr("test_seconds_sum " + std::to_string(total / 2 * 5 / 4) + "\n"));
}

TEST(RegistryDeathTest, ProgrammerErrorsFailLoudly) {
  Registry registry;
  registry.AddCounter("test_total", "Help.", {"job"});
  EXPECT_DEATH(registry.AddCounter("test_total", "Again."), "registered twice");
  EXPECT_DEATH(registry.AddCounter("9bad", "Help."), "invalid metric name");
  EXPECT_DEATH(registry.AddCounter("test_le", "Help.", {"le"}), "invalid label name");
  EXPECT_DEATH(registry.AddCounter("test_dash", "Help.", {"a-b"}), "invalid label name");
  EXPECT_DEATH(registry.AddHistogram("test_h", "Help.", {}, {1, 1}), "bounds must increase");
  auto* family = registry.AddGauge("test_g", "Help.", {"a", "b"});
  EXPECT_DEATH(family->WithLabels({"only one"}), "label values of test_g");
}

TEST(RegistryTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
}

}  // namespace
}  // namespace metrics
}  // namespace samplerd
