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

// No field of a bad line is quoted: with the columns swapped, or a token pasted where a grant
// or a job name goes, the field is a token (docs/SECURITY.md: no message contains a token).
TEST(TokenTableTest, BadLinesAreNamedByNumberQuotingNoField) {
  constexpr char kOther[] = "other-token-0123456789abcdef";
  struct Case {
    std::string line;
    std::string want;
  };
  const Case cases[] = {
      {absl::StrCat(kTrain), "got 1 fields"},
      {absl::StrCat(kTrain, " admin extra"), "got 3 fields"},
      {absl::StrCat(kTrain, " ", kOther), "the grant (second field) is neither \"admin\" nor"},
      {absl::StrCat("jobs=train-run-1 ", kOther), "the first field is a grant: a line is"},
      {absl::StrCat("admin ", kOther), "the first field is a grant"},
      {absl::StrCat(kTrain, " jobs="), "job name 1 of the grant is not a job name"},
      {absl::StrCat(kTrain, " jobs=a,,b"), "job name 2 of the grant"},
      {absl::StrCat(kTrain, " jobs=a,", kOther, "/x"), "job name 2 of the grant"},
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
    EXPECT_THAT(message, Not(HasSubstr(kOther))) << c.line;
    EXPECT_THAT(message, Not(HasSubstr("other-token"))) << c.line;
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

TEST(TokenTableTest, LoadSingleReadsOneTokenAndNamesABadFileWithoutQuotingIt) {
  testutil::TestDir dir;
  const std::string path = dir.path() + "/metrics-token";
  testutil::WriteBytes(path, absl::StrCat("  ", kTrain, "\n"));
  auto table = TokenTable::LoadSingle(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(table->Find(kTrain), nullptr);
  EXPECT_EQ(table->Find(kAdmin), nullptr);
  testutil::WriteBytes(path, absl::StrCat(kTrain, " admin\n"));
  auto two_fields = TokenTable::LoadSingle(path);
  EXPECT_EQ(two_fields.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(two_fields.status().message()),
      AllOf(HasSubstr(path + ": must hold one token and nothing else"), Not(HasSubstr(kTrain))));
  EXPECT_EQ(TokenTable::LoadSingle(dir.path() + "/absent").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace samplerd
