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

constexpr size_t kHeaderBytes = 8;   // length, crc(length)
constexpr size_t kTrailerBytes = 4;  // crc(payload)

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
  // A whole, intact record starts at `at`.
  auto record_ok = [&](size_t at) {
    if (!header_ok(at)) return false;
    const uint64_t length = Load32(&file[at]);
    if (file.size() - at < kHeaderBytes + length + kTrailerBytes) return false;
    return Crc(file.substr(at + kHeaderBytes, length)) == Load32(&file[at + kHeaderBytes + length]);
  };
  // A bad record is the torn tail of a crash (the file grew before all of its data reached the
  // disk: zeros or old bytes) unless an intact record follows it, from `from` on: then it is
  // corruption.
  auto corrupt_or_tail = [&](size_t at, size_t from, absl::string_view what) -> absl::Status {
    for (size_t probe = from; probe + kHeaderBytes + kTrailerBytes <= file.size(); ++probe) {
      if (record_ok(probe)) {
        return absl::DataLossError(absl::StrCat(path, ": corrupt record at byte ", at, " of ",
                                                file.size(), " (", what, ")"));
      }
    }
    return absl::OkStatus();
  };
  RecordLogContents contents;
  size_t at = 0;
  while (at < file.size()) {
    const size_t left = file.size() - at;
    if (!header_ok(at)) {
      if (left >= kHeaderBytes) {
        // The length is unknown: look for an intact record anywhere after it.
        if (absl::Status s = corrupt_or_tail(at, at + 1, "header checksum mismatch"); !s.ok()) {
          return s;
        }
      }
      contents.torn_tail = true;
      break;
    }
    const uint64_t length = Load32(&file[at]);
    if (left < kHeaderBytes + length + kTrailerBytes) {  // Payload or checksum cut short.
      contents.torn_tail = true;
      break;
    }
    const absl::string_view payload = file.substr(at + kHeaderBytes, length);
    if (Crc(payload) != Load32(&file[at + kHeaderBytes + length])) {
      // The length is trusted (its checksum matched): look after this record only.
      const size_t next = at + kHeaderBytes + length + kTrailerBytes;
      if (absl::Status s = corrupt_or_tail(at, next, "payload checksum mismatch"); !s.ok()) {
        return s;
      }
      contents.torn_tail = true;
      break;
    }
    contents.records.emplace_back(payload);
    at += kHeaderBytes + length + kTrailerBytes;
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
  return std::unique_ptr<RecordLogWriter>(new RecordLogWriter(path, fd));
}

RecordLogWriter::~RecordLogWriter() { ::close(fd_); }

absl::Status RecordLogWriter::Failed(absl::Status status) {
  error_ = status;
  return status;
}

absl::Status RecordLogWriter::Append(absl::string_view payload) {
  if (payload.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("a log record of ", payload.size(), " bytes; at most 4 GiB"));
  }
  std::string record(kHeaderBytes + payload.size() + kTrailerBytes, '\0');
  char* p = record.data();
  Store32(p, static_cast<uint32_t>(payload.size()));
  Store32(p + 4, Crc(absl::string_view(p, 4)));
  std::memcpy(p + kHeaderBytes, payload.data(), payload.size());
  Store32(p + kHeaderBytes + payload.size(), Crc(payload));
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (absl::Status s = WriteAll(fd_, record, path_); !s.ok()) return Failed(s);
  return absl::OkStatus();
}

absl::Status RecordLogWriter::Sync() {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  // Not under mu_: appends go on while the disk syncs (fdatasync covers what was written
  // before it started).
  if (::fdatasync(fd_) != 0) {
    const absl::Status s = PosixError("fdatasync", path_, errno);
    absl::MutexLock lock(&mu_);
    return Failed(s);
  }
  return absl::OkStatus();
}

}  // namespace samplerd
