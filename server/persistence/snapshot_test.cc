#include "server/persistence/snapshot.h"

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/loss_stats.h"
#include "server/persistence/state.pb.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testutil::ReadBytes;
using testutil::WriteBytes;

// Replaces the trailing crc32 with the one of the bytes before it.
void FixChecksum(std::string& bytes) {
  const size_t body = bytes.size() - 4;
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), body));
  std::memcpy(&bytes[body], &crc, 4);
}

// SampleLossStats as comparable, printable tuples.
std::vector<std::tuple<float, int, int>> Fields(const std::vector<SampleLossStats>& stats) {
  std::vector<std::tuple<float, int, int>> fields;
  for (const SampleLossStats& s : stats) fields.emplace_back(s.ema_loss, s.count, s.last_epoch);
  return fields;
}

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_ + "/snapshot-7.bin"; }

  static state::SnapshotHeader Header() {
    state::SnapshotHeader header;
    header.set_job("job-a");
    header.set_spec(std::string("spec\0bytes\xff", 11));
    header.set_epoch(7);
    header.set_planned(true);
    header.set_has_base(true);
    header.set_samples_seen(123456789012ull);
    return header;
  }

  // Writes a snapshot with distinct values in every array.
  void WriteFull() { ASSERT_TRUE(WriteSnapshot(path_, Header(), base_, weights_, stats_).ok()); }

  void ExpectDataLoss(const std::string& what) {
    auto snapshot = ReadSnapshot(path_);
    EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kDataLoss)
        << what << ": " << snapshot.status();
    EXPECT_THAT(snapshot.status().message(), HasSubstr(path_)) << what;
  }

  // Flips each byte of [from, to) of the good snapshot `good` in turn (three masks), expecting
  // DATA_LOSS each time.
  void ExpectFlips(const std::string& good, size_t from, size_t to) {
    ASSERT_LT(from, to);
    for (size_t at = from; at < to; ++at) {
      for (char mask : {'\x01', '\x80', '\xff'}) {
        std::string bytes = good;
        bytes[at] ^= mask;
        WriteBytes(path_, bytes);
        ExpectDataLoss(
            absl::StrCat("byte ", at, " of ", good.size(), " ^ ", static_cast<int>(mask & 0xff)));
      }
    }
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path();
  std::string path_;
  const std::vector<float> base_ = {0.5f, 1.25f, 2.0f, 0.0f, 3.75f};
  const std::vector<float> weights_ = {1.5f, -0.0f, 1e-30f, 4.5f, 6.25f};
  const std::vector<SampleLossStats> stats_ = {
      {0.25f, 1, 2}, {7.5f, 65535, 65535}, {0.0f, 0, 0}, {1e10f, 3, 1}, {2.5f, 300, 9}};
};

TEST_F(SnapshotTest, RoundTrips) {
  state::SnapshotHeader header = Header();
  // Overwritten from the spans by WriteSnapshot.
  header.set_format_version(99);
  header.set_base_count(1);
  header.set_weights_count(2);
  header.set_loss_stats_count(3);
  ASSERT_TRUE(WriteSnapshot(path_, header, base_, weights_, stats_).ok());

  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  const state::SnapshotHeader& h = snapshot->header;
  EXPECT_EQ(h.format_version(), kSnapshotFormatVersion);
  EXPECT_EQ(h.job(), "job-a");
  EXPECT_EQ(h.spec(), std::string("spec\0bytes\xff", 11));
  EXPECT_EQ(h.epoch(), 7u);
  EXPECT_TRUE(h.planned());
  EXPECT_TRUE(h.has_base());
  EXPECT_EQ(h.samples_seen(), 123456789012ull);
  EXPECT_EQ(h.base_count(), base_.size());
  EXPECT_EQ(h.weights_count(), weights_.size());
  EXPECT_EQ(h.loss_stats_count(), stats_.size());
  EXPECT_THAT(snapshot->base, ElementsAreArray(base_));
  ASSERT_EQ(snapshot->weights.size(), weights_.size());
  EXPECT_EQ(std::memcmp(snapshot->weights.data(), weights_.data(), weights_.size() * 4), 0);
  EXPECT_EQ(Fields(snapshot->loss_stats), Fields(stats_));
}

TEST_F(SnapshotTest, DifferentArrayLengthsRoundTrip) {
  const std::vector<float> base = {1.0f, 2.0f, 3.0f};
  const std::vector<float> weights = {4.0f};
  const std::vector<SampleLossStats> stats = {{5.0f, 6, 7}, {8.0f, 9, 10}};
  ASSERT_TRUE(WriteSnapshot(path_, Header(), base, weights, stats).ok());
  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->base, ElementsAreArray(base));
  EXPECT_THAT(snapshot->weights, ElementsAre(4.0f));
  EXPECT_EQ(Fields(snapshot->loss_stats), Fields(stats));
}

TEST_F(SnapshotTest, EmptyArraysRoundTrip) {
  state::SnapshotHeader header;
  header.set_job("empty");
  ASSERT_TRUE(WriteSnapshot(path_, header, {}, {}, {}).ok());
  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->header.job(), "empty");
  EXPECT_EQ(snapshot->header.epoch(), 0u);
  EXPECT_FALSE(snapshot->header.planned());
  EXPECT_EQ(snapshot->header.base_count(), 0u);
  EXPECT_EQ(snapshot->header.weights_count(), 0u);
  EXPECT_EQ(snapshot->header.loss_stats_count(), 0u);
  EXPECT_TRUE(snapshot->base.empty());
  EXPECT_TRUE(snapshot->weights.empty());
  EXPECT_TRUE(snapshot->loss_stats.empty());
}

TEST_F(SnapshotTest, TheFormatIsTheDocumentedOne) {
  WriteFull();
  const std::string bytes = ReadBytes(path_);
  ASSERT_GE(bytes.size(), 12u);
  EXPECT_EQ(bytes.substr(0, 8), "SMPLRDSN");
  uint32_t header_length = 0;
  std::memcpy(&header_length, &bytes[8], 4);
  EXPECT_EQ(bytes.size(),
            8 + 4 + header_length + 4 * base_.size() + 4 * weights_.size() + 8 * stats_.size() + 4);
  state::SnapshotHeader header;
  ASSERT_TRUE(header.ParseFromString(bytes.substr(12, header_length)));
  EXPECT_EQ(header.job(), "job-a");
  float first_base = 0;
  std::memcpy(&first_base, &bytes[12 + header_length], 4);
  EXPECT_EQ(first_base, base_[0]);
  std::string fixed = bytes;
  FixChecksum(fixed);
  EXPECT_EQ(fixed, bytes);  // The trailer is the crc32 of everything before it.
}

TEST_F(SnapshotTest, MissingFileIsNotFound) {
  auto snapshot = ReadSnapshot(path_);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kNotFound) << snapshot.status();
  EXPECT_THAT(snapshot.status().message(), HasSubstr(path_));
}

TEST_F(SnapshotTest, AnyFlippedByteOfTheMagicOrHeaderIsDataLoss) {
  WriteFull();
  const std::string good = ReadBytes(path_);
  uint32_t header_length = 0;
  std::memcpy(&header_length, &good[8], 4);
  ExpectFlips(good, 0, 12 + header_length);
}

TEST_F(SnapshotTest, AnyFlippedByteOfTheArraysIsDataLoss) {
  WriteFull();
  const std::string good = ReadBytes(path_);
  uint32_t header_length = 0;
  std::memcpy(&header_length, &good[8], 4);
  ExpectFlips(good, 12 + header_length, good.size() - 4);
}

TEST_F(SnapshotTest, AnyFlippedByteOfTheChecksumIsDataLoss) {
  WriteFull();
  const std::string good = ReadBytes(path_);
  ExpectFlips(good, good.size() - 4, good.size());
}

// The header is parsed before the checksum is verified: a damaged format_version must still be
// reported as damage, not as a file from another samplerd version.
TEST_F(SnapshotTest, AFlippedFormatVersionIsDataLoss) {
  WriteFull();
  std::string bytes = ReadBytes(path_);
  // The header starts with format_version = 2: tag 0x08, varint 0x02.
  ASSERT_EQ(bytes.substr(12, 2), "\x08\x02");
  bytes[13] = '\x01';  // format_version 1; the checksum no longer matches.
  WriteBytes(path_, bytes);
  ExpectDataLoss("format_version 2 -> 1");
  bytes[13] = '\x03';  // format_version 3.
  WriteBytes(path_, bytes);
  ExpectDataLoss("format_version 2 -> 3");
}

TEST_F(SnapshotTest, TruncatedFileIsDataLoss) {
  WriteFull();
  const std::string good = ReadBytes(path_);
  for (size_t size = 0; size < good.size(); ++size) {
    WriteBytes(path_, good.substr(0, size));
    ExpectDataLoss(absl::StrCat("truncated to ", size, " of ", good.size(), " bytes"));
  }
}

TEST_F(SnapshotTest, TrailingBytesAreDataLoss) {
  WriteFull();
  WriteBytes(path_, ReadBytes(path_) + std::string(4, '\0'));
  ExpectDataLoss("4 bytes appended");
}

TEST_F(SnapshotTest, WrongMagicIsDataLoss) {
  WriteFull();
  std::string bytes = ReadBytes(path_);
  bytes.replace(0, 8, "SMPLRDSX");
  FixChecksum(bytes);  // Only the magic is wrong.
  WriteBytes(path_, bytes);
  ExpectDataLoss("wrong magic");
  WriteBytes(path_, std::string(100, 'x'));
  ExpectDataLoss("not a snapshot");
}

TEST_F(SnapshotTest, UnknownFormatVersionIsFailedPrecondition) {
  WriteFull();
  std::string bytes = ReadBytes(path_);
  uint32_t header_length = 0;
  std::memcpy(&header_length, &bytes[8], 4);
  state::SnapshotHeader header;
  ASSERT_TRUE(header.ParseFromString(bytes.substr(12, header_length)));
  header.set_format_version(kSnapshotFormatVersion + 1);
  const std::string new_header = header.SerializeAsString();
  ASSERT_EQ(new_header.size(), header_length);  // Small varints: the same size.
  bytes.replace(12, header_length, new_header);
  FixChecksum(bytes);
  WriteBytes(path_, bytes);
  auto snapshot = ReadSnapshot(path_);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kFailedPrecondition) << snapshot.status();
  EXPECT_THAT(snapshot.status().message(), HasSubstr(path_));
}

TEST_F(SnapshotTest, NoTemporaryFileIsLeftBehind) {
  WriteFull();
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("snapshot-7.bin"));
}

TEST_F(SnapshotTest, AStaleTemporaryFileIsReplaced) {
  WriteBytes(path_ + ".tmp", std::string(100000, 'x'));  // A write cut short by a crash.
  WriteFull();
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT(snapshot->base, ElementsAreArray(base_));
}

TEST_F(SnapshotTest, OverwritingReplacesTheSnapshot) {
  WriteFull();
  state::SnapshotHeader header;
  header.set_job("second");
  header.set_epoch(8);
  const std::vector<float> weights = {9.0f};
  ASSERT_TRUE(WriteSnapshot(path_, header, {}, weights, {}).ok());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->header.job(), "second");
  EXPECT_EQ(snapshot->header.epoch(), 8u);
  EXPECT_FALSE(snapshot->header.has_base());
  EXPECT_TRUE(snapshot->base.empty());
  EXPECT_THAT(snapshot->weights, ElementsAre(9.0f));
  EXPECT_TRUE(snapshot->loss_stats.empty());
}

TEST_F(SnapshotTest, StagingWritesOnlyTheTemporaryFileUntilTheCommit) {
  state::SnapshotHeader old_header;
  old_header.set_job("old");
  ASSERT_TRUE(WriteSnapshot(path_, old_header, {}, {}, {}).ok());

  std::vector<float> base = base_;
  ASSERT_TRUE(StageSnapshot(path_, Header(), base, weights_, stats_).ok());
  base.assign(base.size(), -1.0f);  // Free to change once staged.
  EXPECT_TRUE(std::filesystem::exists(path_ + ".tmp"));
  auto snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->header.job(), "old");

  ASSERT_TRUE(CommitSnapshot(path_).ok());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  snapshot = ReadSnapshot(path_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->header.job(), "job-a");
  EXPECT_THAT(snapshot->base, ElementsAreArray(base_));
  EXPECT_EQ(Fields(snapshot->loss_stats), Fields(stats_));
}

TEST_F(SnapshotTest, CommitWithoutAStagedSnapshotIsNotFound) {
  WriteFull();
  const absl::Status s = CommitSnapshot(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(path_ + ".tmp"));
  EXPECT_TRUE(ReadSnapshot(path_).ok());  // The committed one is untouched.
}

TEST_F(SnapshotTest, WriteIntoAMissingDirectoryFails) {
  const std::string path = dir_ + "/no/such/dir/snapshot-0.bin";
  EXPECT_FALSE(WriteSnapshot(path, Header(), base_, weights_, stats_).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace samplerd
