#include "server/log_fields.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LogValueTest, PlainValuesStayBareOthersAreQuotedAndEscaped) {
  EXPECT_EQ(LogValue("train-1.v2"), "train-1.v2");
  EXPECT_EQ(LogValue("/samplerd.v1.Sampler/CreateJob"), "/samplerd.v1.Sampler/CreateJob");
  EXPECT_EQ(LogValue(""), "\"\"");
  EXPECT_EQ(LogValue("max jobs reached: 1"), "\"max jobs reached: 1\"");
  EXPECT_EQ(LogValue("a=b"), "\"a=b\"");
  EXPECT_EQ(LogValue("say \"hi\"\\\n"), "\"say \\\"hi\\\"\\\\\\n\"");
}

}  // namespace
}  // namespace samplerd
