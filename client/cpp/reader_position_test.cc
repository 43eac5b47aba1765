#include "client/cpp/reader_position.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

ReaderPosition Example() {
  ReaderPosition p;
  p.job = "train-1.a_b";
  p.epoch = 7;
  p.deal = 2;
  p.rank = 3;
  p.world_size = 4;
  p.position = (uint64_t{1} << 40) + 5;  // Beyond 32 bits.
  return p;
}

TEST(ReaderPositionTest, SerializeParseRoundTrips) {
  const ReaderPosition p = Example();
  const std::string text = p.Serialize();
  EXPECT_EQ(text,
            "samplerd.ReaderPosition version=3 job=train-1.a_b epoch=7 deal=2 rank=3 "
            "world_size=4 position=1099511627781");
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, p);
  EXPECT_FALSE(parsed->shard_length.has_value());
}

TEST(ReaderPositionTest, ShardLengthRoundTripsWhereKnown) {
  ReaderPosition p = Example();
  p.shard_length = p.position + 9;
  const std::string text = p.Serialize();
  EXPECT_EQ(text,
            "samplerd.ReaderPosition version=3 job=train-1.a_b epoch=7 deal=2 rank=3 "
            "world_size=4 position=1099511627781 shard_length=1099511627790");
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, p);
  // At the end of its shard (a checkpoint in the ShardEnd hook), and an empty shard.
  p.shard_length = p.position;
  parsed = ReaderPosition::Parse(p.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, p);
  p.position = 0;
  p.shard_length = 0;
  parsed = ReaderPosition::Parse(p.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, p);
  // The length is part of the value.
  ReaderPosition unknown = p;
  unknown.shard_length.reset();
  EXPECT_NE(unknown, p);
}

TEST(ReaderPositionTest, Version2HasNoShardLengthAndReadsAsUnknown) {
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(
      "samplerd.ReaderPosition version=2 job=train-1.a_b epoch=7 deal=2 rank=3 world_size=4 "
      "position=1099511627781");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, Example());
  EXPECT_FALSE(parsed->shard_length.has_value());
}

TEST(ReaderPositionTest, FieldsMayComeInAnyOrder) {
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(
      "samplerd.ReaderPosition position=1099511627781 world_size=4 rank=3 epoch=7 "
      "deal=2 job=train-1.a_b version=3");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, Example());
}

TEST(ReaderPositionTest, Version1HasNoDealAndReadsAsDeal0) {
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(
      "samplerd.ReaderPosition version=1 job=train-1.a_b epoch=7 rank=3 world_size=4 "
      "position=1099511627781");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ReaderPosition expected = Example();
  expected.deal = 0;
  EXPECT_EQ(*parsed, expected);
}

// A position loaded by another job, rank or world size is refused naming the loading job and
// rank, the position's epoch and the field.
TEST(ReaderPositionTest, CheckOwnerNamesTheLoaderAndTheField) {
  const ReaderPosition p = Example();  // Job "train-1.a_b", epoch 7, rank 3 of 4.
  EXPECT_TRUE(p.CheckOwner("train-1.a_b", 3, 4).ok());
  absl::Status s = p.CheckOwner("train-1.a_b", 1, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job \"train-1.a_b\" rank 1: the position of epoch 7 has position.rank = "
                        "3: this reader reads rank 1"));
  s = p.CheckOwner("other", 3, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job \"other\" rank 3: the position of epoch 7 has position.job = "
                        "\"train-1.a_b\""));
  s = p.CheckOwner("train-1.a_b", 3, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job \"train-1.a_b\" rank 3: the position of epoch 7 has "
                        "position.world_size = 4: this reader's world size is 8"));
}

// Each malformed text is INVALID_ARGUMENT with a message naming the field (and value).
TEST(ReaderPositionTest, MalformedTextNamesTheField) {
  const std::string ok_tail = " job=j epoch=1 rank=0 world_size=2 position=5";
  const struct {
    std::string text;
    std::string expected;
  } cases[] = {
      {"", "header = \"\""},
      {"{\"version\": 1}", "not a ReaderPosition"},
      {"samplerd.ReaderPosition" + ok_tail, "version = \"\": missing"},
      {"samplerd.ReaderPosition version=4" + ok_tail, "version = \"4\": this client reads 1 to 3"},
      {"samplerd.ReaderPosition version=0" + ok_tail, "version = \"0\": this client reads 1 to 3"},
      {"samplerd.ReaderPosition version=2 deal=0" + ok_tail + " shard_length=5",
       "shard_length = \"5\": unknown field"},
      {"samplerd.ReaderPosition version=3 deal=0" + ok_tail + " shard_length=4",
       "position = \"5\": past shard_length = 4"},
      {"samplerd.ReaderPosition version=3 deal=0" + ok_tail + " shard_length=-1",
       "shard_length = \"-1\": not an unsigned decimal number"},
      {"samplerd.ReaderPosition version=3 deal=0" + ok_tail + " shard_length=",
       "shard_length = \"\": not an unsigned decimal number"},
      {"samplerd.ReaderPosition version=2" + ok_tail, "deal = \"\": missing"},
      {"samplerd.ReaderPosition version=3" + ok_tail, "deal = \"\": missing"},
      {"samplerd.ReaderPosition version=1 epoch=1 rank=0 world_size=2 position=5",
       "job = \"\": missing"},
      {"samplerd.ReaderPosition version=1 job= epoch=1 rank=0 world_size=2 position=5",
       "job = \"\": must not be empty"},
      {"samplerd.ReaderPosition version=1 job=j rank=0 world_size=2 position=5",
       "epoch = \"\": missing"},
      {"samplerd.ReaderPosition version=1 job=j epoch=-1 rank=0 world_size=2 position=5",
       "epoch = \"-1\": not an unsigned decimal number"},
      {"samplerd.ReaderPosition version=1 job=j epoch=1x rank=0 world_size=2 position=5",
       "epoch = \"1x\""},
      {"samplerd.ReaderPosition version=1 job=j epoch=1 rank=4294967296 world_size=2 position=5",
       "rank = \"4294967296\": does not fit in 32 bits"},
      {"samplerd.ReaderPosition version=1 job=j epoch=1 rank=0 world_size=2 "
       "position=18446744073709551616",
       "position = \"18446744073709551616\""},
      {"samplerd.ReaderPosition version=1 job=j epoch=1 rank=2 world_size=2 position=5",
       "rank = \"2\": must be < world_size = 2"},
      {"samplerd.ReaderPosition version=1 job=j epoch=1 rank=0 world_size=0 position=5",
       "world_size = \"0\": must be >= 1"},
      {"samplerd.ReaderPosition version=1" + ok_tail + " deal=3", "deal = \"3\": unknown field"},
      {"samplerd.ReaderPosition version=1" + ok_tail + " epoch=2", "epoch = \"2\": given twice"},
      {"samplerd.ReaderPosition version=1" + ok_tail + " junk", "field = \"junk\""},
      {"samplerd.ReaderPosition  version=1" + ok_tail, "field = \"\""},
  };
  for (const auto& c : cases) {
    absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(c.text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.expected)) << c.text;
  }
}

}  // namespace
}  // namespace samplerd
