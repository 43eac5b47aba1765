#include "server/persistence/record_log.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/test_dir.h"
#include "zlib.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::ReadBytes;
using testutil::WriteBytes;

constexpr size_t kHeaderBytes = 8;   // u32 length | u32 crc32(length)
constexpr size_t kTrailerBytes = 4;  // u32 crc32(payload)

// `size` bytes that differ from record to record and cover every byte value.
std::string Payload(size_t size, uint32_t seed) {
  std::string payload(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : payload) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return payload;
}

// The size of the framed record for `payload`.
uint64_t Framed(const std::string& payload) {
  return kHeaderBytes + payload.size() + kTrailerBytes;
}

// Where record `index` starts in a log of `records`.
uint64_t OffsetOf(const std::vector<std::string>& records, size_t index) {
  uint64_t offset = kRecordLogHeadBytes;
  for (size_t i = 0; i < index; ++i) offset += Framed(records[i]);
  return offset;
}

class RecordLogTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_ + "/wal-0.log"; }

  // Writes `records` to a new log at path_; with `synced`, then syncs it (and the head then says
  // so: damage within them is corruption, after them a torn tail).
  void WriteLog(const std::vector<std::string>& records, bool synced = false) {
    auto writer = RecordLogWriter::Open(path_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const std::string& record : records) ASSERT_TRUE((*writer)->Append(record).ok());
    if (synced) {
      ASSERT_TRUE((*writer)->Sync().ok());
    }
  }

  // Expects path_ to read back as `records` followed by a torn tail, then that opening it for
  // append drops the tail: a new record follows the last intact one.
  void ExpectTornTailAfter(const std::vector<std::string>& records) {
    const uint64_t intact = OffsetOf(records, records.size());
    {
      auto contents = ReadRecordLog(path_);
      ASSERT_TRUE(contents.ok()) << contents.status();
      EXPECT_EQ(contents->records, records);
      EXPECT_TRUE(contents->torn_tail);
      EXPECT_EQ(contents->valid_bytes, intact);
    }
    {
      auto writer = RecordLogWriter::Open(path_);
      ASSERT_TRUE(writer.ok()) << writer.status();
      EXPECT_EQ(std::filesystem::file_size(path_), intact);
      ASSERT_TRUE((*writer)->Append("after the tail").ok());
    }
    std::vector<std::string> expected = records;
    expected.push_back("after the tail");
    auto contents = ReadRecordLog(path_);
    ASSERT_TRUE(contents.ok()) << contents.status();
    EXPECT_EQ(contents->records, expected);
    EXPECT_FALSE(contents->torn_tail);
    EXPECT_EQ(contents->valid_bytes, OffsetOf(expected, expected.size()));
    EXPECT_EQ(contents->valid_bytes, std::filesystem::file_size(path_));
  }

  // Expects DATA_LOSS naming the file from both the reader and the writer, and that the writer
  // left the file as it was.
  void ExpectDataLoss() {
    const std::string before = ReadBytes(path_);
    auto contents = ReadRecordLog(path_);
    EXPECT_EQ(contents.status().code(), absl::StatusCode::kDataLoss) << contents.status();
    EXPECT_THAT(contents.status().message(), HasSubstr(path_));
    auto writer = RecordLogWriter::Open(path_);
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kDataLoss) << writer.status();
    EXPECT_THAT(writer.status().message(), HasSubstr(path_));
    EXPECT_EQ(ReadBytes(path_), before);  // Nothing truncated.
  }

  // Five records: the corruption tests damage record 2 (index 1).
  static std::vector<std::string> FiveRecords() {
    return {"first", Payload(100, 2), "third", Payload(37, 4), "fifth"};
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path();
  std::string path_;
};

TEST_F(RecordLogTest, RoundTripsManyRecords) {
  std::vector<std::string> records = {"", "a", Payload(1 << 20, 1), "", std::string(5, '\0')};
  for (uint32_t i = 0; i < 1000; ++i) records.push_back(Payload(i % 97, i));
  records.push_back(Payload((1 << 20) + 3, 2));
  records.push_back("");
  WriteLog(records);

  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->records.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(contents->records[i], records[i]) << "record " << i;
  }
  EXPECT_FALSE(contents->torn_tail);
  EXPECT_EQ(contents->valid_bytes, OffsetOf(records, records.size()));
  EXPECT_EQ(contents->valid_bytes, std::filesystem::file_size(path_));
}

TEST_F(RecordLogTest, TheFormatIsTheDocumentedOne) {
  ASSERT_EQ(kRecordLogHeadBytes, 8192u);
  {
    auto writer = RecordLogWriter::Open(path_, "hdr");
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("abc").ok());
  }
  std::string bytes = ReadBytes(path_);
  ASSERT_EQ(bytes.size(), kRecordLogHeadBytes + kHeaderBytes + 3 + kTrailerBytes);
  // Two head blocks: magic, version 3, header length 3, header, sequence (0 and 1), synced
  // bytes (the head itself), crc32 of the 43 bytes before it; zeros to 4096.
  for (uint64_t block : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("head block ", block));
    const std::string b = bytes.substr(block * 4096, 4096);
    EXPECT_EQ(b.substr(0, 19), std::string("SMPLRDWL\x03\0\0\0\x03\0\0\0hdr", 19));
    EXPECT_EQ(b.substr(19, 16),
              absl::StrCat(std::string(1, static_cast<char>(block)), std::string(7, '\0'),
                           std::string("\0\x20", 2), std::string(6, '\0')));
    EXPECT_EQ(b.substr(39), std::string(4096 - 39, '\0'));
  }
  const std::string record = bytes.substr(kRecordLogHeadBytes);
  EXPECT_EQ(record.substr(0, 4), std::string("\x03\x00\x00\x00", 4));  // Little-endian length.
  EXPECT_EQ(record.substr(kHeaderBytes, 3), "abc");
  // crc32("abc") = 0x352441c2, little-endian.
  EXPECT_EQ(record.substr(kHeaderBytes + 3), std::string("\xc2\x41\x24\x35", 4));
  // An empty record: length 0, crc32 of four zero bytes, crc32 of nothing (0).
  std::filesystem::remove(path_);
  WriteLog({""});
  EXPECT_EQ(ReadBytes(path_).substr(kRecordLogHeadBytes),
            std::string("\x00\x00\x00\x00\x1c\xdf\x44\x21\x00\x00\x00\x00", 12));
}

TEST_F(RecordLogTest, OpenCreatesAnEmptyLogWithItsHeader) {
  {
    auto writer = RecordLogWriter::Open(path_, "epoch 7");
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ((*writer)->header(), "epoch 7");
    EXPECT_EQ((*writer)->synced_bytes(), kRecordLogHeadBytes);
  }
  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_TRUE(contents->records.empty());
  EXPECT_FALSE(contents->torn_tail);
  EXPECT_EQ(contents->valid_bytes, kRecordLogHeadBytes);
  EXPECT_EQ(contents->head.header, "epoch 7");
  EXPECT_EQ(contents->head.synced_bytes, kRecordLogHeadBytes);
  // Reopened, it keeps its header.
  auto writer = RecordLogWriter::Open(path_, "another");
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->header(), "epoch 7");
}

TEST_F(RecordLogTest, AHeaderTooLargeForTheHeadIsRefused) {
  EXPECT_TRUE(RecordLogWriter::Open(path_, std::string(kRecordLogMaxHeaderBytes, 'h')).ok());
  std::filesystem::remove(path_);
  auto writer = RecordLogWriter::Open(path_, std::string(kRecordLogMaxHeaderBytes + 1, 'h'));
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument) << writer.status();
  EXPECT_THAT(writer.status().message(), HasSubstr("4061 bytes"));
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(RecordLogTest, ReopenAppendsAfterTheLastRecord) {
  WriteLog({"one", "", "three"});
  {
    auto writer = RecordLogWriter::Open(path_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ((*writer)->path(), path_);
    ASSERT_TRUE((*writer)->Append("four").ok());
    ASSERT_TRUE((*writer)->Append("five").ok());
    ASSERT_TRUE((*writer)->Sync().ok());
  }
  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_THAT(contents->records, ElementsAre("one", "", "three", "four", "five"));
  EXPECT_FALSE(contents->torn_tail);
  EXPECT_EQ(contents->valid_bytes, std::filesystem::file_size(path_));
}

TEST_F(RecordLogTest, SyncedRecordsAreReadBack) {
  auto writer = RecordLogWriter::Open(path_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("synced").ok());
  ASSERT_TRUE((*writer)->Sync().ok());
  // The writer is still open: the data is in the file, not in a user-space buffer.
  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_THAT(contents->records, ElementsAre("synced"));
  ASSERT_TRUE((*writer)->Append("again").ok());
  ASSERT_TRUE((*writer)->Sync().ok());
  contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_THAT(contents->records, ElementsAre("synced", "again"));
}

TEST_F(RecordLogTest, ConcurrentAppendsAreWholeRecordsInEachThreadsOrder) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  {
    auto writer = RecordLogWriter::Open(path_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    RecordLogWriter* log = writer->get();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([log, t] {
        for (int i = 0; i < kPerThread; ++i) {
          EXPECT_TRUE(log->Append(absl::StrCat(t, ":", i, ":", Payload(i % 200, i))).ok());
          if (i % 50 == 0) {
            EXPECT_TRUE(log->Sync().ok());
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    ASSERT_TRUE(log->Sync().ok());
  }
  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->records.size(), static_cast<size_t>(kThreads * kPerThread));
  std::vector<int> next(kThreads, 0);
  for (const std::string& record : contents->records) {
    const int t = record[0] - '0';
    ASSERT_TRUE(t >= 0 && t < kThreads) << record.substr(0, 10);
    const int i = next[t]++;
    EXPECT_EQ(record, absl::StrCat(t, ":", i, ":", Payload(i % 200, i)));
  }
  EXPECT_FALSE(contents->torn_tail);
}

TEST_F(RecordLogTest, MissingFileIsNotFound) {
  auto contents = ReadRecordLog(path_);
  EXPECT_EQ(contents.status().code(), absl::StatusCode::kNotFound) << contents.status();
  EXPECT_THAT(contents.status().message(), HasSubstr(path_));
}

TEST_F(RecordLogTest, OpenInAMissingDirectoryFails) {
  auto writer = RecordLogWriter::Open(dir_ + "/no/such/dir/wal-0.log");
  EXPECT_FALSE(writer.ok());
}

TEST_F(RecordLogTest, TruncatedLastRecordIsATornTail) {
  const std::vector<std::string> intact = {"one", Payload(1000, 2), ""};
  const std::string last = Payload(20, 9);
  std::vector<std::string> all = intact;
  all.push_back(last);
  for (uint64_t cut = 1; cut < Framed(last); ++cut) {
    SCOPED_TRACE(absl::StrCat("cut ", cut, " bytes"));
    WriteLog(all);
    std::filesystem::resize_file(path_, OffsetOf(all, all.size()) - cut);
    ExpectTornTailAfter(intact);
    std::filesystem::remove(path_);
  }
}

TEST_F(RecordLogTest, TruncatedLargeLastRecordIsATornTail) {
  const std::vector<std::string> intact = {"one", "two"};
  const std::string last = Payload(1 << 20, 3);
  std::vector<std::string> all = intact;
  all.push_back(last);
  for (uint64_t cut :
       {uint64_t{1}, uint64_t{4}, uint64_t{5}, uint64_t{4096}, Framed(last) - kHeaderBytes,
        Framed(last) - kHeaderBytes + 1, Framed(last) - 1}) {
    SCOPED_TRACE(absl::StrCat("cut ", cut, " bytes"));
    WriteLog(all);
    std::filesystem::resize_file(path_, OffsetOf(all, all.size()) - cut);
    ExpectTornTailAfter(intact);
    std::filesystem::remove(path_);
  }
}

TEST_F(RecordLogTest, ZeroedLastRecordIsATornTail) {
  const std::vector<std::string> intact = {"one", Payload(300, 2), "three"};
  std::vector<std::string> all = intact;
  all.push_back(Payload(5000, 4));
  const uint64_t start = OffsetOf(all, 3);
  const uint64_t payload = start + kHeaderBytes;
  const uint64_t trailer = payload + all[3].size();
  const uint64_t end = trailer + kTrailerBytes;
  struct Range {
    const char* what;
    uint64_t from, to;
  };
  for (const Range& zeroed :
       {Range{"the payload", payload, trailer},
        Range{"the payload's second half", payload + 2500, trailer},
        Range{"the payload and its checksum", payload, end}, Range{"the whole record", start, end},
        Range{"the header", start, payload}}) {
    SCOPED_TRACE(zeroed.what);
    WriteLog(all);
    std::string bytes = ReadBytes(path_);
    for (uint64_t i = zeroed.from; i < zeroed.to; ++i) bytes[i] = '\0';
    WriteBytes(path_, bytes);
    ExpectTornTailAfter(intact);
    std::filesystem::remove(path_);
  }
}

TEST_F(RecordLogTest, ZerosAfterTheLastRecordAreATornTail) {
  const std::vector<std::string> records = {"one", "", Payload(70, 3)};
  for (size_t zeros : {1, 3, 4, 7, 8, 11, 12, 13, 4096}) {
    SCOPED_TRACE(absl::StrCat(zeros, " zero bytes"));
    WriteLog(records);
    WriteBytes(path_, ReadBytes(path_) + std::string(zeros, '\0'));
    ExpectTornTailAfter(records);
    std::filesystem::remove(path_);
  }
}

// A crash can leave the start of the last record's payload written and the rest zeros. When the
// written part holds bytes that happen to form a valid record header (here an empty record's:
// length 0, crc32 of four zero bytes), the record is still the last thing in the file.
TEST_F(RecordLogTest, TornLastRecordWithAHeaderLikePayloadIsATornTail) {
  const std::vector<std::string> intact = {"one", "two"};
  const std::string header_like("\x00\x00\x00\x00\x1c\xdf\x44\x21", 8);
  // E.g. the packed losses {0.0f, 6.6e-19f} of a state::Losses record.
  const std::string last = Payload(100, 5) + header_like + Payload(5000, 6);
  std::vector<std::string> all = intact;
  all.push_back(last);
  WriteLog(all);
  std::string bytes = ReadBytes(path_);
  const uint64_t payload = OffsetOf(all, 2) + kHeaderBytes;
  for (uint64_t i = payload + 200; i < payload + last.size(); ++i) bytes[i] = '\0';
  WriteBytes(path_, bytes);
  ExpectTornTailAfter(intact);
}

TEST_F(RecordLogTest, CorruptPayloadInTheMiddleIsDataLoss) {
  const std::vector<std::string> records = FiveRecords();
  const uint64_t payload = OffsetOf(records, 1) + kHeaderBytes;
  for (uint64_t at : {payload, payload + 50, payload + records[1].size() - 1}) {
    SCOPED_TRACE(absl::StrCat("byte ", at));
    WriteLog(records, /*synced=*/true);
    std::string bytes = ReadBytes(path_);
    bytes[at] ^= 0x01;
    WriteBytes(path_, bytes);
    ExpectDataLoss();
    std::filesystem::remove(path_);
  }
}

TEST_F(RecordLogTest, CorruptHeaderOrChecksumInTheMiddleIsDataLoss) {
  const std::vector<std::string> records = FiveRecords();
  const uint64_t start = OffsetOf(records, 1);
  std::vector<uint64_t> positions;
  for (uint64_t i = 0; i < kHeaderBytes; ++i) positions.push_back(start + i);  // Length, crc.
  for (uint64_t i = 0; i < kTrailerBytes; ++i) {
    positions.push_back(start + kHeaderBytes + records[1].size() + i);  // Payload crc.
  }
  for (uint64_t at : positions) {
    for (char mask : {'\x01', '\x80', '\xff'}) {
      SCOPED_TRACE(absl::StrCat("byte ", at, " ^ ", static_cast<int>(mask & 0xff)));
      WriteLog(records, /*synced=*/true);
      std::string bytes = ReadBytes(path_);
      bytes[at] ^= mask;
      WriteBytes(path_, bytes);
      ExpectDataLoss();
      std::filesystem::remove(path_);
    }
  }
}

TEST_F(RecordLogTest, CorruptFirstRecordIsDataLoss) {
  const std::vector<std::string> records = FiveRecords();
  WriteLog(records, /*synced=*/true);
  std::string bytes = ReadBytes(path_);
  bytes[kRecordLogHeadBytes + kHeaderBytes + 1] ^= 0x20;
  WriteBytes(path_, bytes);
  ExpectDataLoss();
}

// After a power loss, writes that were never synced may have reached the disk in any order: a
// damaged record followed by intact ones is still the torn tail, if no sync covered it.
TEST_F(RecordLogTest, DamageAfterTheLastSyncIsATornTailWhateverFollows) {
  const std::vector<std::string> records = FiveRecords();
  WriteLog(records);  // Never synced.
  std::string bytes = ReadBytes(path_);
  const uint64_t second = OffsetOf(records, 1);
  for (uint64_t i = second; i < second + Framed(records[1]); ++i) bytes[i] = '\0';
  WriteBytes(path_, bytes);
  ExpectTornTailAfter({records[0]});
}

TEST_F(RecordLogTest, OnlyDamageCoveredByASyncIsCorruption) {
  // Two records synced, then three more that were not: damage in the fourth is a torn tail,
  // damage in the second is corruption.
  const std::vector<std::string> records = FiveRecords();
  {
    auto writer = RecordLogWriter::Open(path_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(records[0]).ok());
    ASSERT_TRUE((*writer)->Append(records[1]).ok());
    ASSERT_TRUE((*writer)->Sync().ok());
    for (size_t i = 2; i < records.size(); ++i) ASSERT_TRUE((*writer)->Append(records[i]).ok());
  }
  const std::string pristine = ReadBytes(path_);
  const uint64_t fourth = OffsetOf(records, 3);
  std::string bytes = pristine;
  bytes[fourth + kHeaderBytes] ^= 0x01;
  WriteBytes(path_, bytes);
  auto contents = ReadRecordLog(path_);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_THAT(contents->records, ElementsAre(records[0], records[1], records[2]));
  EXPECT_TRUE(contents->torn_tail);

  bytes = pristine;
  bytes[OffsetOf(records, 1) + kHeaderBytes] ^= 0x01;
  WriteBytes(path_, bytes);
  ExpectDataLoss();
}

// The head says how far the file had been synced: after each Sync the older head block is
// rewritten (alternately), and a Sync with nothing new writes nothing.
TEST_F(RecordLogTest, TheHeadSaysHowManyBytesWereSynced) {
  auto writer = RecordLogWriter::Open(path_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto head = [&] {
    auto h = ReadRecordLogHead(path_);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : RecordLogHead();
  };
  EXPECT_EQ(head().sequence, 1u);
  ASSERT_TRUE((*writer)->Append("abc").ok());
  EXPECT_EQ(head().synced_bytes, kRecordLogHeadBytes);  // Appended, not synced.
  ASSERT_TRUE((*writer)->Sync().ok());
  const uint64_t one = kRecordLogHeadBytes + kHeaderBytes + 3 + kTrailerBytes;
  EXPECT_EQ((*writer)->synced_bytes(), one);
  EXPECT_EQ(head().synced_bytes, one);
  EXPECT_EQ(head().sequence, 2u);  // In block 0.
  const std::string after_one = ReadBytes(path_);
  ASSERT_TRUE((*writer)->Sync().ok());  // Nothing new: the head stays as it is.
  EXPECT_EQ(ReadBytes(path_), after_one);
  ASSERT_TRUE((*writer)->Append("de").ok());
  ASSERT_TRUE((*writer)->Sync().ok());
  EXPECT_EQ(head().synced_bytes, one + kHeaderBytes + 2 + kTrailerBytes);
  EXPECT_EQ(head().sequence, 3u);  // In block 1; block 0 still says `one`.
  const std::string bytes = ReadBytes(path_);
  EXPECT_EQ(bytes.substr(0, 4096), after_one.substr(0, 4096));
  EXPECT_EQ(bytes.size(), one + kHeaderBytes + 2 + kTrailerBytes);
}

// A log cut short of what had been synced lost acknowledged records: wherever the cut, even
// inside the first record (no record after it is left to say anything).
TEST_F(RecordLogTest, ALogCutShortOfItsSyncedBytesIsDataLoss) {
  const std::vector<std::string> records = FiveRecords();
  const uint64_t end = OffsetOf(records, records.size());
  for (uint64_t cut : {kRecordLogHeadBytes, kRecordLogHeadBytes + 1, OffsetOf(records, 1) - 1,
                       OffsetOf(records, 1), OffsetOf(records, 3) + 5, end - 1}) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    WriteLog(records, /*synced=*/true);
    std::filesystem::resize_file(path_, cut);
    ExpectDataLoss();
    auto contents = ReadRecordLog(path_);
    EXPECT_THAT(contents.status().message(),
                HasSubstr(absl::StrCat("cut short: ", cut, " bytes, but its first ", end,
                                       " bytes had been synced")));
    std::filesystem::remove(path_);
  }
}

// Zeroed or damaged synced records are corruption too, also the last one.
TEST_F(RecordLogTest, DamageToTheLastSyncedRecordIsDataLoss) {
  const std::vector<std::string> records = FiveRecords();
  WriteLog(records, /*synced=*/true);
  std::string bytes = ReadBytes(path_);
  for (uint64_t i = OffsetOf(records, 4); i < bytes.size(); ++i) bytes[i] = '\0';
  WriteBytes(path_, bytes);
  ExpectDataLoss();
}

// A caller that knows a larger synced length (a closed log's, kept elsewhere) passes it: damage
// the head's claim does not cover is then corruption too.
TEST_F(RecordLogTest, ASyncedLengthKnownElsewhereCoversMore) {
  const std::vector<std::string> records = FiveRecords();
  WriteLog(records);  // Never synced: the head claims the head only.
  std::filesystem::resize_file(path_, OffsetOf(records, 4) + 3);
  auto torn = ReadRecordLog(path_);
  ASSERT_TRUE(torn.ok()) << torn.status();
  EXPECT_EQ(torn->records.size(), 4u);
  auto known = ReadRecordLog(path_, OffsetOf(records, 5));
  EXPECT_EQ(known.status().code(), absl::StatusCode::kDataLoss) << known.status();
  EXPECT_THAT(known.status().message(), HasSubstr(path_));
  auto smaller = ReadRecordLog(path_, OffsetOf(records, 4));
  EXPECT_TRUE(smaller.ok()) << smaller.status();
}

// A crash can tear the head block being rewritten: the other one, durable, still holds the
// previous claim, and the reader falls back to it.
TEST_F(RecordLogTest, ATornHeadBlockFallsBackToTheOtherOne) {
  const std::vector<std::string> records = FiveRecords();
  {
    auto writer = RecordLogWriter::Open(path_, "h");
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE((*writer)->Append(records[i]).ok());
      ASSERT_TRUE((*writer)->Sync().ok());  // Sequences 2..5; the last in block 1.
    }
  }
  std::string bytes = ReadBytes(path_);
  for (uint64_t i = 4096 + 30; i < 4096 + 40; ++i) bytes[i] = '\0';  // Block 1: its crc.
  // The last synced record, then cut: no longer covered (block 0 says 3 records).
  bytes.resize(OffsetOf(records, 3) + 7);
  WriteBytes(path_, bytes);
  auto head = ReadRecordLogHead(path_);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->sequence, 4u);
  EXPECT_EQ(head->synced_bytes, OffsetOf(records, 3));
  EXPECT_EQ(head->header, "h");
  ExpectTornTailAfter({records[0], records[1], records[2]});
}

TEST_F(RecordLogTest, ALogWithoutAnIntactHeadIsDataLoss) {
  WriteLog({"one"}, /*synced=*/true);
  std::string bytes = ReadBytes(path_);
  bytes[30] ^= 1;  // In each head block, a byte of the synced length.
  bytes[4096 + 30] ^= 1;
  WriteBytes(path_, bytes);
  ExpectDataLoss();
  EXPECT_THAT(ReadRecordLog(path_).status().message(), HasSubstr("no intact head"));
  auto damaged = ReadRecordLogHead(path_);  // Records follow it: its creation had completed.
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_THAT(damaged.status().message(), HasSubstr("it is damaged"));
  // A file no longer than the head: a creation cut by a crash looks the same.
  for (uint64_t size : {uint64_t{0}, uint64_t{10}, uint64_t{4096}, kRecordLogHeadBytes}) {
    WriteBytes(path_, std::string(size, '\0'));
    auto head = ReadRecordLogHead(path_);
    EXPECT_EQ(head.status().code(), absl::StatusCode::kDataLoss) << head.status();
    EXPECT_THAT(head.status().message(), HasSubstr("creation never completed"));
  }
  std::filesystem::remove(path_);
  EXPECT_EQ(ReadRecordLogHead(path_).status().code(), absl::StatusCode::kNotFound);
}

// Damage and a file from another version look alike but for the checksum.
TEST_F(RecordLogTest, AnotherFormatVersionIsFailedPrecondition) {
  WriteLog({"one"});
  std::string bytes = ReadBytes(path_);
  for (uint64_t block : {0, 1}) {
    std::string b = bytes.substr(block * 4096, 4096);
    b[8] = 4;  // Format version 4, with a matching crc32.
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const unsigned char*>(b.data()), 16 + 0 + 16));
    std::memcpy(&b[32], &crc, 4);
    bytes.replace(block * 4096, 4096, b);
  }
  WriteBytes(path_, bytes);
  auto contents = ReadRecordLog(path_);
  EXPECT_EQ(contents.status().code(), absl::StatusCode::kFailedPrecondition) << contents.status();
  EXPECT_THAT(contents.status().message(), HasSubstr("log format version 4"));
}

}  // namespace
}  // namespace samplerd
