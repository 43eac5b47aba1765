// RecordLog: an append-only file of checksummed records, the write-ahead log of a job's epoch.
//
// Format, per record (little-endian):
//   u32 length | u32 crc32(length bytes) | payload (length bytes) | u32 crc32(payload)
// The header has its own checksum so that a corrupted length is detected where it is, instead of
// being taken for the end of the file. Bit 31 of the length marks a sync marker: an 8-byte
// payload, u64 N, written after an fdatasync returned, saying that the file's first N bytes were
// on disk. Markers are framing: readers never see them as records.
//
// Torn tail vs corruption: records written after the last completed sync were never acknowledged
// (acknowledgment follows Sync), and a crash or power loss can leave any of them cut short,
// zeroed or stale, in any order. So a bad record is corruption -- DATA_LOSS naming the file and
// the offset -- only when an intact sync marker after it says that its bytes had been synced;
// otherwise it is the torn tail of a crash: reading stops there and the writer truncates it.
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

struct RecordLogContents {
  std::vector<std::string> records;
  uint64_t valid_bytes = 0;  // Length of the prefix made of whole, intact records.
  bool torn_tail = false;    // Bytes after valid_bytes were dropped (an unfinished record).
};

// Reads every intact record of `path`. NOT_FOUND if the file does not exist; DATA_LOSS for a
// corrupt record that is not the last thing in the file.
absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path);

// Appends records to one file. Thread-safe: Append calls are serialised; Sync may run
// concurrently with Append. After any I/O error the writer is failed: every later call returns
// that error (a record may be half written; nothing more is acknowledged).
class RecordLogWriter {
 public:
  // Opens `path` for appending, creating it if absent. An existing file is scanned first and a
  // torn tail truncated (DATA_LOSS if it is corrupt before its end).
  static absl::StatusOr<std::unique_ptr<RecordLogWriter>> Open(const std::string& path);
  ~RecordLogWriter();

  RecordLogWriter(const RecordLogWriter&) = delete;
  RecordLogWriter& operator=(const RecordLogWriter&) = delete;

  const std::string& path() const { return path_; }

  // Writes one record to the file (the page cache: durable after Sync). INVALID_ARGUMENT for a
  // payload of 2 GiB or more.
  absl::Status Append(absl::string_view payload) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every record appended before the call durable (fdatasync), then appends a sync marker
  // for them (itself durable only with the next Sync).
  absl::Status Sync() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RecordLogWriter(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  absl::Status Failed(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Write(uint32_t length_word, absl::string_view payload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int fd_;
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  uint64_t size_ ABSL_GUARDED_BY(mu_);  // Bytes written so far.
  // The file size after the last sync marker: a Sync with nothing appended since writes none.
  uint64_t marked_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_RECORD_LOG_H_
