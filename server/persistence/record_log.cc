#include "server/persistence/record_log.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

constexpr size_t kHeaderBytes = 8;          // length, crc(length)
constexpr size_t kTrailerBytes = 4;         // crc(payload)
constexpr uint32_t kMarkerFlag = 1u << 31;  // In the length word: a sync marker.
constexpr uint32_t kLengthMask = kMarkerFlag - 1;

uint32_t Crc(absl::string_view bytes) {
  const uLong initial = crc32(0L, Z_NULL, 0);
  // Never a null buffer: zlib's crc32_z(crc, NULL, 0) returns the initial value.
  if (bytes.empty()) return static_cast<uint32_t>(initial);
  return static_cast<uint32_t>(
      crc32_z(initial, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

// Records are written in the host's byte order, which the format fixes as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the log format is little-endian");

uint32_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void Store32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }

}  // namespace

absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  const absl::string_view file = *data;
  auto header_ok = [&](size_t at) {
    return at + kHeaderBytes <= file.size() && Crc(file.substr(at, 4)) == Load32(&file[at + 4]);
  };
  // The length of an intact record at `at`, or -1.
  auto intact_length = [&](size_t at) -> int64_t {
    if (!header_ok(at)) return -1;
    const uint64_t length = Load32(&file[at]) & kLengthMask;
    if (file.size() - at < kHeaderBytes + length + kTrailerBytes) return -1;
    const absl::string_view payload = file.substr(at + kHeaderBytes, length);
    if (Crc(payload) != Load32(&file[at + kHeaderBytes + length])) return -1;
    return static_cast<int64_t>(length);
  };
  // The bad record at `at` is corruption if an intact sync marker after it covers it.
  auto corrupt_or_tail = [&](size_t at, absl::string_view what) -> absl::Status {
    for (size_t probe = at + 1; probe + kHeaderBytes + 8 + kTrailerBytes <= file.size(); ++probe) {
      if ((Load32(&file[probe]) & kMarkerFlag) == 0 || intact_length(probe) != 8) continue;
      uint64_t synced = 0;
      std::memcpy(&synced, &file[probe + kHeaderBytes], 8);
      if (synced > at) {
        return absl::DataLossError(absl::StrCat(path, ": corrupt record at byte ", at, " of ",
                                                file.size(), " (", what,
                                                "; the bytes had been synced up to ", synced, ")"));
      }
    }
    return absl::OkStatus();
  };
  RecordLogContents contents;
  size_t at = 0;
  while (at < file.size()) {
    const int64_t length = intact_length(at);
    if (length < 0) {
      if (absl::Status s = corrupt_or_tail(
              at, header_ok(at) ? "payload checksum mismatch" : "header checksum mismatch");
          !s.ok()) {
        return s;
      }
      contents.torn_tail = true;
      break;
    }
    if ((Load32(&file[at]) & kMarkerFlag) == 0) {
      contents.records.emplace_back(file.substr(at + kHeaderBytes, static_cast<size_t>(length)));
    }
    at += kHeaderBytes + static_cast<size_t>(length) + kTrailerBytes;
  }
  contents.valid_bytes = at;
  return contents;
}

absl::StatusOr<std::unique_ptr<RecordLogWriter>> RecordLogWriter::Open(const std::string& path) {
  uint64_t valid_bytes = 0;
  absl::StatusOr<RecordLogContents> existing = ReadRecordLog(path);
  if (existing.ok()) {
    valid_bytes = existing->valid_bytes;
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError("open", path, errno);
  // Drop a torn tail so that new records follow the last intact one.
  if (::ftruncate(fd, static_cast<off_t>(valid_bytes)) != 0 ||
      ::lseek(fd, static_cast<off_t>(valid_bytes), SEEK_SET) < 0) {
    const int error_number = errno;
    ::close(fd);
    return PosixError("truncate", path, error_number);
  }
  return std::unique_ptr<RecordLogWriter>(new RecordLogWriter(path, fd, valid_bytes));
}

RecordLogWriter::~RecordLogWriter() { ::close(fd_); }

absl::Status RecordLogWriter::Failed(absl::Status status) {
  error_ = status;
  return status;
}

absl::Status RecordLogWriter::Write(uint32_t length_word, absl::string_view payload) {
  std::string record(kHeaderBytes + payload.size() + kTrailerBytes, '\0');
  char* p = record.data();
  Store32(p, length_word);
  Store32(p + 4, Crc(absl::string_view(p, 4)));
  std::memcpy(p + kHeaderBytes, payload.data(), payload.size());
  Store32(p + kHeaderBytes + payload.size(), Crc(payload));
  if (absl::Status s = WriteAll(fd_, record, path_); !s.ok()) return Failed(s);
  size_ += record.size();
  return absl::OkStatus();
}

absl::Status RecordLogWriter::Append(absl::string_view payload) {
  if (payload.size() > kLengthMask) {
    return absl::InvalidArgumentError(
        absl::StrCat("a log record of ", payload.size(), " bytes; at most 2 GiB - 1"));
  }
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  return Write(static_cast<uint32_t>(payload.size()), payload);
}

absl::Status RecordLogWriter::Sync() {
  uint64_t synced = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    synced = size_;
  }
  // Not under mu_: appends go on while the disk syncs (fdatasync covers what was written
  // before it started).
  if (::fdatasync(fd_) != 0) {
    const absl::Status s = PosixError("fdatasync", path_, errno);
    absl::MutexLock lock(&mu_);
    return Failed(s);
  }
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (synced > marked_) {
    char payload[8];
    std::memcpy(payload, &synced, 8);
    if (absl::Status s = Write(kMarkerFlag | 8u, absl::string_view(payload, 8)); !s.ok()) {
      return s;
    }
    marked_ = size_;  // The marker itself needs no marker of its own.
  }
  return absl::OkStatus();
}

}  // namespace samplerd
