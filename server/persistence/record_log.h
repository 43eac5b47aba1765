// RecordLog: an append-only file of checksummed records, the write-ahead log of a job's epoch.
//
// Format (little-endian), format version 3:
//   head: two 4096-byte blocks, each
//     "SMPLRDWL" | u32 format version | u32 header length | header | u64 sequence |
//     u64 synced bytes | u32 crc32(everything before it in the block) | zeros
//   records, from byte 8192:
//     u32 length | u32 crc32(length bytes) | payload (length bytes) | u32 crc32(payload)
// The header is the caller's (a job's log says which epoch it holds); both blocks carry it. A
// record header has its own checksum so that a corrupted length is detected where it is, instead
// of being taken for the end of the file. (Format 1 had no head and kept sync markers among the
// records; format 2's loss records had no shard positions. Neither is read.)
//
// How far the file had been synced: after each completed fdatasync the writer rewrites one head
// block in place (alternately, the one with the older sequence) with "the first N bytes of this
// file are on disk". That claim is true when written, and it is not itself synced: the next Sync
// makes it durable. A block is rewritten only once the previous rewrite is durable, so a crash
// can tear at most one block; the reader takes the intact block with the higher sequence. Since
// the claim is at the head, it survives a file cut short.
//
// Torn tail vs corruption: records written after the last completed sync were never acknowledged
// (acknowledgment follows Sync), and a crash or power loss can leave any of them cut short,
// zeroed or stale, in any order. So a bad record is corruption -- DATA_LOSS naming the file and
// the offset -- only when it lies within the synced bytes (the head's claim, or a larger one the
// caller knows of); a file shorter than its synced bytes is corruption too; anything else is the
// torn tail of a crash: reading stops there and the writer truncates it.
//
// What this cannot see: after a power loss (not a process crash: the page cache then survives)
// the claim on disk may be the one written after the previous Sync, so the records made durable
// by the last Sync(s) before the power loss are not covered: if they are later damaged or cut,
// they read as a torn tail. (Concurrent Syncs can leave the claim further behind: a block is not
// rewritten while the previous rewrite is not durable.) A caller that must cover them keeps the
// synced length elsewhere (JobJournal puts a closed log's length in the next log's header).
#ifndef SAMPLERD_SERVER_PERSISTENCE_RECORD_LOG_H_
#define SAMPLERD_SERVER_PERSISTENCE_RECORD_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {

inline constexpr uint32_t kRecordLogFormatVersion = 3;
// Bytes before the first record: the two head blocks.
inline constexpr uint64_t kRecordLogHeadBytes = 8192;
// The largest header a log can carry.
inline constexpr size_t kRecordLogMaxHeaderBytes = 4096 - 36;

// What a log's head says.
struct RecordLogHead {
  std::string header;         // The caller's, as given when the log was created.
  uint64_t synced_bytes = 0;  // The file's first synced_bytes bytes had been synced.
  uint64_t sequence = 0;      // Of the head block read (the newer intact one).
};

// Reads the head of `path`. NOT_FOUND if the file does not exist. DATA_LOSS naming the file when
// neither head block is intact: the file is damaged, or its creation never completed (a file of
// at most kRecordLogHeadBytes bytes: records are appended only after the head was synced).
// FAILED_PRECONDITION for an intact head of another format version.
absl::StatusOr<RecordLogHead> ReadRecordLogHead(const std::string& path);

struct RecordLogContents {
  RecordLogHead head;
  std::vector<std::string> records;
  uint64_t valid_bytes = 0;  // Length of the prefix made of the head and whole, intact records.
  bool torn_tail = false;    // Bytes after valid_bytes were dropped (an unfinished record).
};

// Reads every intact record of `path`. NOT_FOUND if the file does not exist; the errors of
// ReadRecordLogHead; DATA_LOSS naming the file and the offset for a damaged record within the
// synced bytes, or a file cut short of them. `synced_bytes`: a length the caller knows had been
// synced (e.g. recorded elsewhere), if larger than the head's claim.
absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path, uint64_t synced_bytes = 0);

// Appends records to one file. Thread-safe: Append calls are serialised; Sync may run
// concurrently with Append. After any I/O error the writer is failed: every later call returns
// that error (a record may be half written; nothing more is acknowledged).
class RecordLogWriter {
 public:
  // Opens `path` for appending. An existing file is read first (its errors as ReadRecordLog's;
  // its header is kept, `header` ignored), a torn tail truncated and the rest synced. A missing
  // file is created with `header` (INVALID_ARGUMENT beyond kRecordLogMaxHeaderBytes) and its head
  // synced before Open returns; the caller syncs the directory.
  static absl::StatusOr<std::unique_ptr<RecordLogWriter>> Open(const std::string& path,
                                                               absl::string_view header = "");
  ~RecordLogWriter();

  RecordLogWriter(const RecordLogWriter&) = delete;
  RecordLogWriter& operator=(const RecordLogWriter&) = delete;

  const std::string& path() const { return path_; }
  const std::string& header() const { return header_; }

  // Writes one record to the file (the page cache: durable after Sync). INVALID_ARGUMENT for a
  // payload of 2 GiB or more.
  absl::Status Append(absl::string_view payload) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every record appended before the call durable (fdatasync; none if nothing new), then
  // records in the head that they are (durable itself with the next Sync).
  absl::Status Sync() ABSL_LOCKS_EXCLUDED(mu_);

  // The file's length after the last completed Sync: its first synced_bytes() bytes are on disk.
  uint64_t synced_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RecordLogWriter(std::string path, int fd, std::string header, uint64_t size,
                  uint64_t head_sequence);
  absl::Status Failed(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites the older head block: "the first synced_ bytes are on disk", if the previous
  // rewrite is durable (else a later Sync does it).
  absl::Status WriteSyncedClaim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int fd_;
  const std::string header_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  uint64_t size_ ABSL_GUARDED_BY(mu_);           // Bytes written so far.
  uint64_t synced_ ABSL_GUARDED_BY(mu_);         // Bytes covered by a completed fdatasync.
  uint64_t claimed_ ABSL_GUARDED_BY(mu_);        // The synced bytes the newest head block claims.
  uint64_t head_sequence_ ABSL_GUARDED_BY(mu_);  // The newest head block's sequence.
  // Head rewrites so far, and how many of them a completed fdatasync covers: a block may be
  // rewritten only when the other one's last rewrite is durable.
  uint64_t head_writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t head_writes_synced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_RECORD_LOG_H_
