#include "server/persistence/job_journal.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compute_backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/loss_stats.h"
#include "server/persistence/record_log.h"
#include "server/persistence/snapshot.h"
#include "server/persistence/state.pb.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::WriteBytes;

state::WalRecord Losses(uint64_t epoch, uint32_t rank, uint64_t seq) {
  state::WalRecord record;
  state::Losses* losses = record.mutable_losses();
  losses->set_epoch(epoch);
  losses->set_rank(rank);
  losses->set_seq(seq);
  for (uint64_t i = 0; i < 3; ++i) {
    losses->add_indices(seq * 10 + i);
    losses->add_losses(static_cast<float>(seq) + 0.25f * i);
  }
  return record;
}

state::WalRecord RankEnded(uint64_t epoch, uint32_t rank) {
  state::WalRecord record;
  record.mutable_rank_ended()->set_epoch(epoch);
  record.mutable_rank_ended()->set_rank(rank);
  return record;
}

state::WalRecord Streamed(uint64_t epoch, uint32_t rank, uint64_t position) {
  state::WalRecord record;
  record.mutable_streamed()->set_epoch(epoch);
  record.mutable_streamed()->set_rank(rank);
  record.mutable_streamed()->set_position(position);
  return record;
}

// The records as serialised, to compare them.
std::vector<std::string> Serialized(const std::vector<state::WalRecord>& records) {
  std::vector<std::string> out;
  for (const state::WalRecord& record : records) out.push_back(record.SerializeAsString());
  return out;
}

std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class JobJournalTest : public ::testing::Test {
 protected:
  static state::SnapshotHeader Header(uint64_t epoch) {
    state::SnapshotHeader header;
    header.set_job("j");
    header.set_spec("spec");
    header.set_epoch(epoch);
    header.set_planned(true);
    header.set_samples_seen(100 + epoch);
    return header;
  }

  // The weights of epoch `epoch`'s snapshot: distinct per epoch.
  static std::vector<float> Weights(uint64_t epoch) {
    return {1.0f + epoch, 2.0f + epoch, 3.0f + epoch};
  }

  std::unique_ptr<JobJournal> Create() {
    auto journal = JobJournal::Create(dir_);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return journal.ok() ? *std::move(journal) : nullptr;
  }

  static void WriteEpochSnapshot(JobJournal& journal, uint64_t epoch) {
    const std::vector<float> weights = Weights(epoch);
    const std::vector<SampleLossStats> stats = {{0.5f, 1, 1}, {1.5f, 2, 1}, {0.0f, 0, 0}};
    ASSERT_TRUE(journal.StageSnapshot(Header(epoch), {}, weights, stats).ok());
    ASSERT_TRUE(journal.CommitSnapshot(epoch).ok());
  }

  static void AppendAll(JobJournal& journal, const std::vector<state::WalRecord>& records) {
    for (const state::WalRecord& record : records) {
      ASSERT_TRUE(journal.Append(record.SerializeAsString()).ok());
    }
  }

  // Writes epoch `epoch`'s log file directly with the record log, its header as a journal
  // writes it.
  void WriteLogFile(uint64_t epoch, const std::vector<state::WalRecord>& records,
                    uint64_t previous_log_bytes = 0) {
    state::LogHeader header;
    header.set_epoch(epoch);
    header.set_previous_log_bytes(previous_log_bytes);
    auto writer = RecordLogWriter::Open(LogPath(epoch), header.SerializeAsString());
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const state::WalRecord& record : records) {
      ASSERT_TRUE((*writer)->Append(record.SerializeAsString()).ok());
    }
    ASSERT_TRUE((*writer)->Sync().ok());
  }

  // Writes a snapshot file directly.
  void WriteSnapshotFile(uint64_t epoch) {
    ASSERT_TRUE(WriteSnapshot(SnapshotPath(epoch), Header(epoch), {}, Weights(epoch), {}).ok());
  }

  std::string SnapshotPath(uint64_t epoch) const {
    return absl::StrCat(dir_, "/snapshot-", epoch, ".bin");
  }
  std::string LogPath(uint64_t epoch) const { return absl::StrCat(dir_, "/wal-", epoch, ".log"); }

  absl::StatusOr<JobJournal::Recovered> Recover() { return JobJournal::Recover(dir_); }

  // A new journal in epoch 0 (its snapshot committed, its log open) where each of `calls` was
  // appended and synced, as acknowledged calls are.
  std::unique_ptr<JobJournal> JournalInEpoch0(
      const std::vector<std::vector<state::WalRecord>>& calls) {
    auto journal = Create();
    if (journal == nullptr) return nullptr;
    WriteEpochSnapshot(*journal, 0);
    EXPECT_TRUE(journal->OpenEpoch(0).ok());
    for (const auto& call : calls) {
      AppendAll(*journal, call);
      EXPECT_TRUE(journal->Sync().ok());
    }
    return journal;
  }

  testutil::TestDir test_dir_;
  const std::string root_ = test_dir_.path();
  const std::string dir_ = root_ + "/jobs/j";  // Not created: JobJournal::Create makes it.
};

TEST_F(JobJournalTest, CreateMakesTheDirectory) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(journal->dir(), dir_);
  ASSERT_TRUE(std::filesystem::is_directory(dir_));
  EXPECT_TRUE(FileNames(dir_).empty());
}

TEST_F(JobJournalTest, CreateRemovesWhatAPreviousJobLeft) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteLogFile(0, {RankEnded(0, 1)});
  WriteBytes(dir_ + "/snapshot-0.bin.tmp", "partial");
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  EXPECT_TRUE(FileNames(dir_).empty());
}

TEST_F(JobJournalTest, RecoverReturnsTheSnapshotAndTheRecordsInOrder) {
  const std::vector<state::WalRecord> records = {
      Streamed(0, 1, 10), Losses(0, 1, 1), Losses(0, 0, 1), RankEnded(0, 1), state::WalRecord()};
  {
    auto journal = Create();
    ASSERT_NE(journal, nullptr);
    WriteEpochSnapshot(*journal, 0);
    ASSERT_TRUE(journal->OpenEpoch(0).ok());
    AppendAll(*journal, records);
    ASSERT_TRUE(journal->Sync().ok());
  }
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_NE(recovered->journal, nullptr);
  EXPECT_EQ(recovered->journal->dir(), dir_);
  const Snapshot& snapshot = recovered->snapshot;
  EXPECT_EQ(snapshot.header.job(), "j");
  EXPECT_EQ(snapshot.header.epoch(), 0u);
  EXPECT_EQ(snapshot.header.samples_seen(), 100u);
  EXPECT_TRUE(snapshot.base.empty());
  EXPECT_EQ(snapshot.weights, Weights(0));
  ASSERT_EQ(snapshot.loss_stats.size(), 3u);
  EXPECT_EQ(snapshot.loss_stats[1].ema_loss, 1.5f);
  EXPECT_EQ(snapshot.loss_stats[1].count, 2);
  EXPECT_EQ(Serialized(recovered->records), Serialized(records));
  EXPECT_EQ(recovered->records[1].losses().seq(), 1u);
  EXPECT_EQ(recovered->records[3].rank_ended().rank(), 1u);
}

TEST_F(JobJournalTest, ARecoveredJournalAppendsToItsEpochLog) {
  {
    auto journal = Create();
    ASSERT_NE(journal, nullptr);
    WriteEpochSnapshot(*journal, 0);
    ASSERT_TRUE(journal->OpenEpoch(0).ok());
    AppendAll(*journal, {Losses(0, 0, 1)});
    ASSERT_TRUE(journal->Sync().ok());
  }
  {
    auto recovered = Recover();
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    JobJournal& journal = *recovered->journal;
    ASSERT_TRUE(journal.OpenEpoch(0).ok());
    AppendAll(journal, {Losses(0, 0, 2)});
    ASSERT_TRUE(journal.Sync().ok());
  }
  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(0, 0, 1), Losses(0, 0, 2)}));
}

TEST_F(JobJournalTest, WriteSnapshotAndOpenEpochRemoveTheOlderEpochsFiles) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  AppendAll(*journal, {Losses(0, 0, 1), RankEnded(0, 0)});
  ASSERT_TRUE(journal->Sync().ok());
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));
  WriteEpochSnapshot(*journal, 1);  // Its log is created first.
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-1.bin", "wal-1.log"));
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-1.bin", "wal-1.log"));
  AppendAll(*journal, {Losses(1, 0, 1)});
  ASSERT_TRUE(journal->Sync().ok());

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 1u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(1));
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(1, 0, 1)}));
}

TEST_F(JobJournalTest, CommitSnapshotAfterOpenEpochRemovesTheOlderEpochsFiles) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  AppendAll(*journal, {Losses(0, 0, 1)});
  std::vector<float> weights = Weights(1);
  ASSERT_TRUE(journal->StageSnapshot(Header(1), {}, weights, {}).ok());
  weights.assign(3, -1.0f);  // Free to change once staged.
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  // Not committed yet: epoch 0's files are what a crash would recover from.
  EXPECT_THAT(FileNames(dir_),
              ElementsAre("snapshot-0.bin", "snapshot-1.bin.tmp", "wal-0.log", "wal-1.log"));
  AppendAll(*journal, {Losses(1, 0, 1)});
  ASSERT_TRUE(journal->CommitSnapshot(1).ok());
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-1.bin", "wal-1.log"));
  AppendAll(*journal, {Losses(1, 0, 2)});
  ASSERT_TRUE(journal->Sync().ok());

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 1u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(1));
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(1, 0, 1), Losses(1, 0, 2)}));
}

TEST_F(JobJournalTest, OpenEpochOfACommittedSnapshotRemovesTheOlderEpochsFiles) {
  // A crash in CommitSnapshot(1) after the rename, before epoch 0's files were removed.
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  WriteLogFile(0, {Losses(0, 0, 1)});
  WriteLogFile(1, {});  // Created before the snapshot was committed.
  WriteSnapshotFile(1);
  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 1u);
  EXPECT_TRUE(recovered->records.empty());
  ASSERT_TRUE(recovered->journal->OpenEpoch(1).ok());
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-1.bin", "wal-1.log"));
}

TEST_F(JobJournalTest, ACrashBeforeTheCommitRecoversFromTheOlderSnapshotAndBothLogs) {
  {
    auto journal = Create();
    ASSERT_NE(journal, nullptr);
    WriteEpochSnapshot(*journal, 0);
    ASSERT_TRUE(journal->OpenEpoch(0).ok());
    AppendAll(*journal, {Losses(0, 0, 1), RankEnded(0, 0)});
    ASSERT_TRUE(journal->StageSnapshot(Header(1), {}, Weights(1), {}).ok());
    ASSERT_TRUE(journal->OpenEpoch(1).ok());
    AppendAll(*journal, {Streamed(1, 0, 5), Losses(1, 0, 1)});
    ASSERT_TRUE(journal->Sync().ok());
  }  // A crash: CommitSnapshot(1) never ran.

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 0u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(0));
  EXPECT_EQ(Serialized(recovered->records),
            Serialized({Losses(0, 0, 1), RankEnded(0, 0), Streamed(1, 0, 5), Losses(1, 0, 1)}));
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log", "wal-1.log"));
}

TEST_F(JobJournalTest, CommitSnapshotWithoutAStagedOneFailsAndKeepsTheFiles) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  EXPECT_FALSE(journal->CommitSnapshot(1).ok());
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));
}

TEST_F(JobJournalTest, RecordsOfLaterEpochLogsFollowInOrder) {
  // A crash after epoch 1's log was opened but before snapshot-1 was written (or survived).
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  WriteLogFile(0, {Losses(0, 0, 1), RankEnded(0, 0)});
  WriteLogFile(1, {Streamed(1, 0, 5), Losses(1, 0, 1)});

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 0u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(0));
  EXPECT_EQ(Serialized(recovered->records),
            Serialized({Losses(0, 0, 1), RankEnded(0, 0), Streamed(1, 0, 5), Losses(1, 0, 1)}));
}

TEST_F(JobJournalTest, LogsAreReplayedInNumericEpochOrder) {
  // "wal-10.log" sorts before "wal-9.log" as a string.
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(9);
  WriteLogFile(10, {Losses(10, 0, 1)});
  WriteLogFile(9, {Losses(9, 0, 1)});
  WriteLogFile(11, {Losses(11, 0, 1)});

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 9u);
  EXPECT_EQ(Serialized(recovered->records),
            Serialized({Losses(9, 0, 1), Losses(10, 0, 1), Losses(11, 0, 1)}));
}

TEST_F(JobJournalTest, LogsOlderThanTheNewestSnapshotAreIgnored) {
  // A crash inside OpenEpoch(10), before it removed epoch 9's files.
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(9);
  WriteLogFile(9, {Losses(9, 0, 1)});
  WriteSnapshotFile(10);
  WriteLogFile(10, {Losses(10, 0, 1)});

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 10u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(10));
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(10, 0, 1)}));
}

TEST_F(JobJournalTest, TheNewestSnapshotWithAnEmptyLogHasNoRecords) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteLogFile(2, {});
  WriteSnapshotFile(2);
  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 2u);
  EXPECT_TRUE(recovered->records.empty());
}

TEST_F(JobJournalTest, ATornTailIsDroppedAndCutByOpenEpoch) {
  {
    auto journal = Create();
    ASSERT_NE(journal, nullptr);
    WriteEpochSnapshot(*journal, 0);
    ASSERT_TRUE(journal->OpenEpoch(0).ok());
    // Not synced: the crash may cut these (the head claims only what a Sync covered).
    AppendAll(*journal, {Losses(0, 0, 1), Losses(0, 0, 2)});
  }
  const uint64_t size = std::filesystem::file_size(LogPath(0));
  std::filesystem::resize_file(LogPath(0), size - 3);  // Inside Losses(0, 0, 2).
  {
    auto recovered = Recover();
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(0, 0, 1)}));
    ASSERT_TRUE(recovered->journal->OpenEpoch(0).ok());
    AppendAll(*recovered->journal, {Losses(0, 0, 3)});
    ASSERT_TRUE(recovered->journal->Sync().ok());
  }
  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(0, 0, 1), Losses(0, 0, 3)}));
}

TEST_F(JobJournalTest, NoSnapshotIsNotFoundAndTheDirectoryIsRemoved) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteLogFile(0, {Losses(0, 0, 1)});
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kNotFound) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(dir_));
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

TEST_F(JobJournalTest, AnEmptyDirectoryIsNotFoundAndRemoved) {
  auto journal = Create();  // Created, never acknowledged.
  ASSERT_NE(journal, nullptr);
  journal.reset();
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kNotFound) << recovered.status();
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

TEST_F(JobJournalTest, ALeftoverTemporarySnapshotIsIgnoredAndRemoved) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(2);
  WriteLogFile(2, {Losses(2, 0, 1)});
  WriteBytes(dir_ + "/snapshot-3.bin.tmp", "half a snapshot");

  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 2u);
  EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(2, 0, 1)}));
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-2.bin", "wal-2.log"));
}

TEST_F(JobJournalTest, OnlyATemporarySnapshotIsNotFound) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteBytes(dir_ + "/snapshot-0.bin.tmp", "half a snapshot");
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kNotFound) << recovered.status();
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

TEST_F(JobJournalTest, ACorruptSnapshotIsDataLossNamingIt) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  std::filesystem::resize_file(SnapshotPath(0), std::filesystem::file_size(SnapshotPath(0)) - 1);
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(SnapshotPath(0)));
  EXPECT_TRUE(std::filesystem::exists(SnapshotPath(0)));  // Kept for inspection.
}

TEST_F(JobJournalTest, ASnapshotOfAnotherEpochIsDataLoss) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  ASSERT_TRUE(WriteSnapshot(SnapshotPath(4), Header(3), {}, {}, {}).ok());
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(SnapshotPath(4)));
}

TEST_F(JobJournalTest, ACorruptLogIsDataLossNamingIt) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  WriteLogFile(0, {Losses(0, 0, 1), Losses(0, 0, 2), Losses(0, 0, 3)});
  std::string bytes;
  {
    std::ifstream in(LogPath(0), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[kRecordLogHeadBytes + 10] ^= 0x04;  // In the first record's payload.
  WriteBytes(LogPath(0), bytes);
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(0)));
}

TEST_F(JobJournalTest, AMalformedRecordIsDataLossNamingTheLog) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  {
    state::LogHeader header;
    header.set_epoch(0);
    auto writer = RecordLogWriter::Open(LogPath(0), header.SerializeAsString());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(Losses(0, 0, 1).SerializeAsString()).ok());
    ASSERT_TRUE((*writer)->Append("\xff\xff\xff").ok());  // Intact framing, not a WalRecord.
    ASSERT_TRUE((*writer)->Sync().ok());
  }
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(0)));
}

TEST_F(JobJournalTest, RemoveDeletesTheDirectory) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  AppendAll(*journal, {Losses(0, 0, 1)});
  ASSERT_TRUE(journal->Sync().ok());
  WriteBytes(dir_ + "/snapshot-1.bin.tmp", "half a snapshot");
  ASSERT_TRUE(journal->Remove().ok());
  EXPECT_FALSE(std::filesystem::exists(dir_));
  EXPECT_TRUE(std::filesystem::is_directory(root_ + "/jobs"));
  EXPECT_EQ(Recover().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobJournalTest, AppendBeforeOpenEpochIsFailedPrecondition) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(journal->Append(Losses(0, 0, 1).SerializeAsString()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(journal->Sync().ok());  // Nothing to sync.
  WriteEpochSnapshot(*journal, 0);    // Creates its log, but does not open it.
  EXPECT_EQ(journal->Append(Losses(0, 0, 1).SerializeAsString()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  EXPECT_TRUE(journal->Append(Losses(0, 0, 1).SerializeAsString()).ok());
}

TEST_F(JobJournalTest, AppendOnARecoveredJournalBeforeOpenEpochIsFailedPrecondition) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteLogFile(0, {});
  WriteSnapshotFile(0);
  auto recovered = Recover();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->journal->Append("x").code(), absl::StatusCode::kFailedPrecondition);
}

// ---- Lost or cut logs (a log is created, its header synced, before its epoch's snapshot is
// committed; the head says how far it had been synced; the next log's header how long it was) --

TEST_F(JobJournalTest, CommittingASnapshotCreatesItsLogFirst) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);  // As a creation or an upload does, before OpenEpoch.
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));
  auto head = ReadRecordLogHead(LogPath(0));
  ASSERT_TRUE(head.ok()) << head.status();
  state::LogHeader header;
  ASSERT_TRUE(header.ParseFromString(head->header));
  EXPECT_EQ(header.epoch(), 0u);
  EXPECT_EQ(header.previous_log_bytes(), 0u);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());  // The same log.
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));
}

TEST_F(JobJournalTest, TheSnapshotsLogDeletedIsDataLossNamingIt) {
  ASSERT_NE(JournalInEpoch0({{Losses(0, 0, 1)}, {RankEnded(0, 0)}}), nullptr);
  std::filesystem::remove(LogPath(0));
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(),
              HasSubstr(absl::StrCat(LogPath(0), " is missing, but ", SnapshotPath(0))));
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin"));  // Left for the operator.
}

TEST_F(JobJournalTest, ALogMissingBetweenTwoIsDataLoss) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  WriteLogFile(0, {Losses(0, 0, 1), RankEnded(0, 0)});
  WriteLogFile(2, {Losses(2, 0, 1)});
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(),
              HasSubstr(absl::StrCat(LogPath(1), " is missing, but ", LogPath(2), " exists")));
  // Also when the log after the gap looks like a creation cut by a crash: it is not removed,
  // since the log before it is missing too.
  WriteBytes(LogPath(2), "");
  recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(absl::StrCat(LogPath(1), " is missing")));
  EXPECT_TRUE(std::filesystem::exists(LogPath(2)));
}

// The acknowledged losses and EndEpoch of the issue: a log cut inside its first record (nothing
// after the cut is left to say that it had been synced) is DATA_LOSS, not a torn tail.
TEST_F(JobJournalTest, ALogCutInsideItsFirstSyncedRecordIsDataLoss) {
  // Acknowledged: a ReportLosses, then an EndEpoch.
  ASSERT_NE(JournalInEpoch0({{Losses(0, 0, 1)}, {RankEnded(0, 0)}}), nullptr);
  for (uint64_t cut : {kRecordLogHeadBytes + 5, kRecordLogHeadBytes}) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    std::filesystem::resize_file(LogPath(0), cut);
    auto recovered = Recover();
    EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
    EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(0)));
    EXPECT_THAT(recovered.status().message(), HasSubstr("cut short"));
    EXPECT_EQ(std::filesystem::file_size(LogPath(0)), cut);  // Not truncated further.
  }
}

// After a power loss the head may still say what the Sync before the last one covered (its
// rewrite after the last Sync not on disk yet): here its newer block is torn. A log that a later
// one closed is covered anyway, by the length in that log's header.
TEST_F(JobJournalTest, AClosedLogCutShortIsDataLossThroughTheNextLogsHeader) {
  uint64_t closed_length = 0;
  {
    auto journal = JournalInEpoch0({{Losses(0, 0, 1)}, {RankEnded(0, 0)}});
    ASSERT_NE(journal, nullptr);
    closed_length = std::filesystem::file_size(LogPath(0));
    ASSERT_TRUE(journal->StageSnapshot(Header(1), {}, Weights(1), {}).ok());
    ASSERT_TRUE(journal->OpenEpoch(1).ok());
    AppendAll(*journal, {Losses(1, 0, 1)});
    ASSERT_TRUE(journal->Sync().ok());
  }  // A crash before CommitSnapshot(1).
  auto head = ReadRecordLogHead(LogPath(1));
  ASSERT_TRUE(head.ok()) << head.status();
  state::LogHeader header;
  ASSERT_TRUE(header.ParseFromString(head->header));
  EXPECT_EQ(header.epoch(), 1u);
  EXPECT_EQ(header.previous_log_bytes(), closed_length);

  // wal-0's newer head block torn, and its last record (the EndEpoch) cut.
  auto wal0 = ReadRecordLogHead(LogPath(0));
  ASSERT_TRUE(wal0.ok()) << wal0.status();
  std::string bytes = testutil::ReadBytes(LogPath(0));
  bytes[(wal0->sequence % 2) * 4096 + 20] ^= 1;
  bytes.resize(closed_length - 3);
  WriteBytes(LogPath(0), bytes);
  auto without_header = ReadRecordLog(LogPath(0));  // The head alone: a torn tail.
  ASSERT_TRUE(without_header.ok()) << without_header.status();
  EXPECT_TRUE(without_header->torn_tail);
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(0)));
  EXPECT_THAT(recovered.status().message(),
              HasSubstr(absl::StrCat("its first ", closed_length, " bytes had been synced")));
}

// A crash inside OpenEpoch(1), while creating the log: nothing was appended to it, nothing of
// it acknowledged. It is removed and created again when the replay opens epoch 1.
TEST_F(JobJournalTest, ANewestLogWhoseCreationWasCutIsRemoved) {
  for (uint64_t size : {uint64_t{0}, uint64_t{100}, kRecordLogHeadBytes}) {
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    ASSERT_TRUE(std::filesystem::create_directories(dir_));
    WriteSnapshotFile(0);
    WriteLogFile(0, {Losses(0, 0, 1), RankEnded(0, 0)});
    WriteBytes(LogPath(1), std::string(size, '\0'));
    auto recovered = Recover();
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(Serialized(recovered->records), Serialized({Losses(0, 0, 1), RankEnded(0, 0)}));
    EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-0.bin", "wal-0.log"));
    ASSERT_TRUE(recovered->journal->OpenEpoch(0).ok());
    ASSERT_TRUE(recovered->journal->OpenEpoch(1).ok());
    EXPECT_TRUE(ReadRecordLogHead(LogPath(1)).ok());
    recovered->journal.reset();
    std::filesystem::remove_all(dir_);
  }
}

TEST_F(JobJournalTest, AHeadlessLogIsDataLossWhereItsCreationHadCompleted) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(0);
  WriteLogFile(0, {Losses(0, 0, 1), RankEnded(0, 0)});
  WriteLogFile(1, {Losses(1, 0, 1)});
  std::string bytes = testutil::ReadBytes(LogPath(1));
  for (size_t i = 0; i < kRecordLogHeadBytes; ++i) bytes[i] = '\0';  // Records follow it.
  WriteBytes(LogPath(1), bytes);
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(1)));
  EXPECT_THAT(recovered.status().message(), HasSubstr("no intact head"));

  // The snapshot's own log: created before the snapshot was committed, so never unfinished.
  std::filesystem::remove(LogPath(1));
  WriteBytes(LogPath(0), "");
  recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr(LogPath(0)));
}

TEST_F(JobJournalTest, ALogOfAnotherEpochIsDataLoss) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteSnapshotFile(1);
  WriteLogFile(0, {Losses(0, 0, 1)});
  std::filesystem::rename(LogPath(0), LogPath(1));
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss) << recovered.status();
  EXPECT_THAT(recovered.status().message(),
              HasSubstr(absl::StrCat(LogPath(1), ": its header is not that of epoch 1's log")));
}

// Not ours: a directory with a job's name but files samplerd never writes, and no snapshot.
TEST_F(JobJournalTest, ADirectoryWithForeignFilesIsNotFoundAndLeftAlone) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_));
  WriteBytes(dir_ + "/notes.txt", "mine");
  WriteLogFile(0, {});
  auto recovered = Recover();
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kNotFound) << recovered.status();
  EXPECT_THAT(recovered.status().message(), HasSubstr("not a job directory"));
  EXPECT_THAT(recovered.status().message(), HasSubstr("notes.txt"));
  EXPECT_THAT(FileNames(dir_), ElementsAre("notes.txt", "wal-0.log"));
}

}  // namespace
}  // namespace samplerd

namespace samplerd {
namespace {

JobJournal::EpochStart PlannedStart(uint64_t epoch, std::vector<float> weights) {
  JobJournal::EpochStart start;
  start.job = "j";
  start.spec = "spec";
  start.epoch = epoch;
  start.planned = true;
  start.weights = std::make_shared<const std::vector<float>>(std::move(weights));
  return start;
}

TEST_F(JobJournalTest, AScheduledSnapshotIsWrittenAfterALaterEpochOpened) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  ASSERT_TRUE(journal->OpenEpoch(2).ok());
  // Epoch 1's snapshot, scheduled after epoch 2 opened (a short epoch), is still written.
  journal->ScheduleEpochSnapshot(PlannedStart(1, Weights(1)));
  journal.reset();  // Waits for what was scheduled.
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-1.bin", "wal-1.log", "wal-2.log"));
}

TEST_F(JobJournalTest, ScheduledSnapshotsEndAtTheNewest) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  ASSERT_TRUE(journal->OpenEpoch(2).ok());
  journal->ScheduleEpochSnapshot(PlannedStart(1, Weights(1)));
  journal->ScheduleEpochSnapshot(PlannedStart(2, Weights(2)));
  journal.reset();
  EXPECT_THAT(FileNames(dir_), ElementsAre("snapshot-2.bin", "wal-2.log"));
  absl::StatusOr<JobJournal::Recovered> recovered = JobJournal::Recover(dir_);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->snapshot.header.epoch(), 2u);
  EXPECT_EQ(recovered->snapshot.weights, Weights(2));
}

TEST_F(JobJournalTest, RemoveWaitsForAScheduledSnapshotAndLeavesNothing) {
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  journal->ScheduleEpochSnapshot(PlannedStart(1, std::vector<float>(1 << 20, 1.0f)));
  ASSERT_TRUE(journal->Remove().ok());
  // A snapshot committed after the removal would bring the deleted job back at a restart.
  EXPECT_FALSE(std::filesystem::exists(dir_));
  journal->ScheduleEpochSnapshot(PlannedStart(1, Weights(1)));  // Ignored once removed.
  journal.reset();
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

// Epoch 1 closed right after it opened: its snapshot is still being written when epoch 2's is
// scheduled. Both starts are kept from the moment they are scheduled, whichever is on disk yet.
// Before (fixed in 490ce89) only the committed snapshots were listed, and a rewind to epoch 1 right
// after epoch 2 opened was refused as "not kept": the race behind job_persistence_test's
// RewindsRightAfterEpochBoundaries... failing "kept: 0, 2" (docs/HARDENING.md, flaky tests).
// Epoch 1's snapshot is held on the snapshot thread (its loss statistics are derived there, through
// the caller's `loss_stats_from_logs`) until the test has looked: no timing involved.
TEST_F(JobJournalTest, SnapshotsScheduledAndNotYetWrittenAreKept) {
  // Declared before the journal, whose snapshot thread uses them until it is joined.
  absl::Notification writing_one;
  absl::Notification release_one;
  const std::unique_ptr<ComputeBackend> cpu = NewCpuBackend(1);
  auto journal = Create();
  ASSERT_NE(journal, nullptr);
  journal->KeepEpochStarts(3);
  WriteEpochSnapshot(*journal, 0);
  ASSERT_TRUE(journal->OpenEpoch(0).ok());
  ASSERT_TRUE(journal->OpenEpoch(1).ok());
  ASSERT_TRUE(journal->OpenEpoch(2).ok());
  JobJournal::EpochStart one = PlannedStart(1, Weights(1));
  one.loss_stats_from_logs = [&] {
    writing_one.Notify();
    release_one.WaitForNotification();
    return cpu->NewLossStats(Weights(1).size(), /*ema_decay=*/0.5);
  };
  journal->ScheduleEpochSnapshot(std::move(one));
  journal->ScheduleEpochSnapshot(PlannedStart(2, Weights(2)));
  writing_one.WaitForNotification();
  const std::vector<uint64_t> unwritten = journal->UnwrittenEpochStarts();
  absl::StatusOr<std::vector<uint64_t>> kept = journal->KeptEpochStarts();
  release_one.Notify();  // Before any assertion can return.
  EXPECT_THAT(unwritten, ElementsAre(1, 2));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_THAT(*kept, ElementsAre(0, 1, 2));  // Only snapshot-0.bin was on disk.
  journal->AwaitScheduledSnapshots();
  EXPECT_THAT(journal->UnwrittenEpochStarts(), ElementsAre());
  kept = journal->KeptEpochStarts();
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_THAT(*kept, ElementsAre(0, 1, 2));  // Now on disk.
  absl::StatusOr<JobJournal::EpochStart> read = journal->ReadEpochStart(1);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read->weights, Weights(1));
}

}  // namespace
}  // namespace samplerd
