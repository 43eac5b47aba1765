#include "examples/cpp/synthetic_data.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ImbalancedClassCountsTest, FallsGeometricallyFromMajorityToMajorityOverImbalance) {
  DatasetSpec spec;
  spec.classes = 3;
  spec.majority = 10000;
  spec.imbalance = 100.0;
  absl::StatusOr<std::vector<uint64_t>> counts = ImbalancedClassCounts(spec);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_THAT(*counts, ElementsAre(10000, 1000, 100));
}

TEST(ImbalancedClassCountsTest, EveryClassKeepsAtLeastOneSample) {
  DatasetSpec spec;
  spec.classes = 2;
  spec.majority = 10;
  spec.imbalance = 1000.0;
  EXPECT_THAT(*ImbalancedClassCounts(spec), ElementsAre(10, 1));
}

TEST(ImbalancedClassCountsTest, RefusesBadSpecsNamingTheFieldAndValue) {
  DatasetSpec spec;
  spec.classes = 1;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("classes"));
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("got 1"));
  spec = DatasetSpec();
  spec.classes = 65;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("got 65"));
  spec = DatasetSpec();
  spec.imbalance = 0.5;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("imbalance"));
  spec = DatasetSpec();
  spec.imbalance = std::nan("");
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("imbalance"));
  spec = DatasetSpec();
  spec.separation = 0.0;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("separation"));
  spec = DatasetSpec();
  spec.features = 0;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("features"));
  spec = DatasetSpec();
  spec.majority = 0;
  EXPECT_THAT(ImbalancedClassCounts(spec).status().message(), HasSubstr("majority"));
}

TEST(MakeDatasetTest, HasTheAskedShapeAndLabels) {
  DatasetSpec spec;
  spec.features = 5;
  spec.classes = 3;
  absl::StatusOr<Dataset> data = MakeDataset(spec, {4, 2, 1}, 11);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 7u);
  EXPECT_EQ(data->x.size(), 35u);
  EXPECT_THAT(data->y, ElementsAre(0, 0, 0, 0, 1, 1, 2));
  EXPECT_THAT(data->class_counts, ElementsAre(4, 2, 1));
}

TEST(MakeDatasetTest, IsDeterministicAndTheNoiseSeedChangesOnlyTheNoise) {
  DatasetSpec spec;
  spec.features = 8;
  spec.classes = 2;
  spec.separation = 3.0;
  const Dataset a = *MakeDataset(spec, {2000, 2000}, 1);
  const Dataset b = *MakeDataset(spec, {2000, 2000}, 1);
  const Dataset c = *MakeDataset(spec, {2000, 2000}, 2);
  EXPECT_EQ(a.x, b.x);
  EXPECT_NE(a.x, c.x);
  // Same class means in both (the spec's seed): per-class feature means agree within the noise
  // (std 1 / sqrt(2000) ~ 0.022 per estimate), and lie `separation` from the origin.
  for (int cls = 0; cls < 2; ++cls) {
    double norm2 = 0.0;
    for (int f = 0; f < spec.features; ++f) {
      double mean_a = 0.0, mean_c = 0.0;
      for (int i = 0; i < 2000; ++i) {
        mean_a += a.x[(cls * 2000 + i) * spec.features + f] / 2000.0;
        mean_c += c.x[(cls * 2000 + i) * spec.features + f] / 2000.0;
      }
      EXPECT_NEAR(mean_a, mean_c, 0.15) << "class " << cls << " feature " << f;
      norm2 += mean_a * mean_a;
    }
    EXPECT_NEAR(std::sqrt(norm2), 3.0, 0.2) << "class " << cls;
  }
}

TEST(MakeDatasetTest, NoiseHasUnitVariance) {
  DatasetSpec spec;
  spec.features = 1;
  spec.classes = 2;
  const Dataset data = *MakeDataset(spec, {20000, 1}, 3);
  double sum = 0.0, sum2 = 0.0;
  for (int i = 0; i < 20000; ++i) {
    sum += data.x[i];
    sum2 += static_cast<double>(data.x[i]) * data.x[i];
  }
  const double mean = sum / 20000.0;
  EXPECT_NEAR(sum2 / 20000.0 - mean * mean, 1.0, 0.05);
}

TEST(MakeDatasetTest, RefusesCountsOfTheWrongSize) {
  DatasetSpec spec;
  spec.classes = 3;
  const absl::Status s = MakeDataset(spec, {1, 2}, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("counts has 2 entries, expected classes = 3"));
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
