#include "server/auth/token_table.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr char kTrain[] = "train-token-0123456789abcdef";

TEST(TokenTableTest, ParsesAdminAndJobGrantsSkippingCommentsAndBlankLines) {
  auto table = TokenTable::Parse(absl::StrCat("# who may do what\n\n", kAdmin, "  admin\n", "  ",
                                              kTrain, "\tjobs=train,eval.v2 \n"),
                                 "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  auto admin = table->Find(kAdmin);
  ASSERT_NE(admin, nullptr);
  EXPECT_TRUE(admin->admin);
  auto train = table->Find(kTrain);
  ASSERT_NE(train, nullptr);
  EXPECT_FALSE(train->admin);
  EXPECT_THAT(train->jobs, ::testing::UnorderedElementsAre("train", "eval.v2"));
}

TEST(TokenTableTest, FindsOnlyTheWholeToken) {
  auto table = TokenTable::Parse(absl::StrCat(kTrain, " jobs=train\n"), "tokens");
  ASSERT_TRUE(table.ok());
  const std::string token = kTrain;
  EXPECT_EQ(table->Find(token.substr(0, token.size() - 1)), nullptr);
  EXPECT_EQ(table->Find(token + "x"), nullptr);
  EXPECT_EQ(table->Find(""), nullptr);
  EXPECT_EQ(table->Find(kAdmin), nullptr);
  EXPECT_NE(table->Find(token), nullptr);
}

TEST(TokenTableTest, BadLinesAreNamedByNumberWithoutTheToken) {
  struct Case {
    std::string line;
    std::string want;
  };
  const Case cases[] = {
      {absl::StrCat(kTrain), "got 1 fields"},
      {absl::StrCat(kTrain, " admin extra"), "got 3 fields"},
      {absl::StrCat(kTrain, " root"), "grant \"root\": expected \"admin\" or \"jobs=NAME"},
      {absl::StrCat(kTrain, " jobs="), "grant \"jobs=\": name = \"\": must be 1 to 128"},
      {absl::StrCat(kTrain, " jobs=a,,b"), "name = \"\""},
      {absl::StrCat(kTrain, " jobs=a/b"), "name = \"a/b\": only [A-Za-z0-9._-]"},
      {"short-token admin", "the token has 11 characters; it must have 16 to 4096"},
      {absl::StrCat(kTrain, "\x01 admin"), "printable ASCII"},
  };
  for (const Case& c : cases) {
    auto table = TokenTable::Parse(absl::StrCat("# header\n", kAdmin, " admin\n", c.line, "\n"),
                                   "/etc/samplerd/tokens");
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    const std::string message(table.status().message());
    EXPECT_THAT(message, HasSubstr("/etc/samplerd/tokens: line 3: ")) << c.line;
    EXPECT_THAT(message, HasSubstr(c.want)) << c.line;
    EXPECT_THAT(message, Not(HasSubstr(kTrain))) << c.line;
    EXPECT_THAT(message, Not(HasSubstr("short-token"))) << c.line;
  }
}

TEST(TokenTableTest, ATokenListedTwiceIsAnErrorNamingBothLines) {
  auto table = TokenTable::Parse(
      absl::StrCat(kTrain, " jobs=a\n", kAdmin, " admin\n", kTrain, " jobs=b\n"), "tokens");
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()),
              HasSubstr("line 3: the token of line 1 again"));
}

TEST(TokenTableTest, LoadNamesAMissingFile) {
  testutil::TestDir dir;
  auto missing = TokenTable::Load(dir.path() + "/absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir.path() + "/absent"));
  testutil::WriteBytes(dir.path() + "/tokens", absl::StrCat(kAdmin, " admin\n"));
  auto loaded = TokenTable::Load(dir.path() + "/tokens");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_NE(loaded->Find(kAdmin), nullptr);
}

}  // namespace
}  // namespace samplerd
