#include "examples/cpp/balanced_accuracy.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::HasSubstr;

TEST(BalancedAccuracyTest, IsTheMeanOfThePerClassRecalls) {
  // Class 0: 3 of 4 right; class 1: 1 of 2 right.
  const std::vector<uint32_t> labels = {0, 0, 0, 0, 1, 1};
  const std::vector<uint32_t> predictions = {0, 0, 0, 1, 1, 0};
  absl::StatusOr<ClassRecalls> r = BalancedAccuracy(predictions, labels, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->recall[0], 0.75);
  EXPECT_DOUBLE_EQ(r->recall[1], 0.5);
  EXPECT_DOUBLE_EQ(r->balanced_accuracy, 0.625);
}

TEST(BalancedAccuracyTest, AlwaysPredictingTheMajorityScoresOneOverClasses) {
  // Plain accuracy would be 0.99 here.
  std::vector<uint32_t> labels(99, 0);
  labels.push_back(1);
  const std::vector<uint32_t> predictions(100, 0);
  EXPECT_DOUBLE_EQ(BalancedAccuracy(predictions, labels, 2)->balanced_accuracy, 0.5);
}

TEST(BalancedAccuracyTest, ClassesAbsentFromTheLabelsAreLeftOutOfTheMean) {
  const std::vector<uint32_t> labels = {0, 2};
  const std::vector<uint32_t> predictions = {0, 1};
  absl::StatusOr<ClassRecalls> r = BalancedAccuracy(predictions, labels, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(std::isnan(r->recall[1]));
  EXPECT_DOUBLE_EQ(r->balanced_accuracy, 0.5);
}

TEST(BalancedAccuracyTest, RefusesBadInputNamingIt) {
  const std::vector<uint32_t> two = {0, 1};
  const std::vector<uint32_t> three = {0, 1, 1};
  EXPECT_THAT(BalancedAccuracy(two, three, 2).status().message(),
              HasSubstr("predictions has 2 entries but labels has 3"));
  EXPECT_THAT(BalancedAccuracy({}, {}, 2).status().message(), HasSubstr("labels is empty"));
  EXPECT_THAT(BalancedAccuracy(two, two, 0).status().message(), HasSubstr("num_classes"));
  const std::vector<uint32_t> bad = {0, 5};
  EXPECT_THAT(BalancedAccuracy(two, bad, 2).status().message(),
              HasSubstr("labels[1] = 5 is not below num_classes = 2"));
  EXPECT_THAT(BalancedAccuracy(bad, two, 2).status().message(), HasSubstr("predictions[1] = 5"));
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
