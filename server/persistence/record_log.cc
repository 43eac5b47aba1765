#include "server/persistence/record_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/metrics/process_metrics.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

constexpr absl::string_view kMagic("SMPLRDWL", 8);
constexpr size_t kBlockBytes = 4096;  // One head block: a page, rewritten whole.
static_assert(2 * kBlockBytes == kRecordLogHeadBytes);
// magic | version | header length | header | sequence | synced bytes | crc
constexpr size_t kBlockFixedBytes = 8 + 4 + 4 + 8 + 8 + 4;
static_assert(kBlockFixedBytes + kRecordLogMaxHeaderBytes == kBlockBytes);
constexpr size_t kHeaderBytes = 8;   // length, crc(length)
constexpr size_t kTrailerBytes = 4;  // crc(payload)
// Bit 31 of a length word is never set (format 1 used it for sync markers).
constexpr uint32_t kMaxLength = (1u << 31) - 1;

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

uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void Store32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Store64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }

// One head block (kBlockBytes, zero-padded).
std::string EncodeHeadBlock(absl::string_view header, uint64_t sequence, uint64_t synced_bytes) {
  std::string block(kBlockBytes, '\0');
  char* p = block.data();
  std::memcpy(p, kMagic.data(), kMagic.size());
  Store32(p + 8, kRecordLogFormatVersion);
  Store32(p + 12, static_cast<uint32_t>(header.size()));
  std::memcpy(p + 16, header.data(), header.size());
  char* q = p + 16 + header.size();
  Store64(q, sequence);
  Store64(q + 8, synced_bytes);
  Store32(q + 16, Crc(absl::string_view(p, static_cast<size_t>(q + 16 - p))));
  return block;
}

// The head of `path`, from `file` (its first bytes, at least the head's if it has them) and
// `file_size`: see ReadRecordLogHead.
absl::StatusOr<RecordLogHead> DecodeHead(absl::string_view file, uint64_t file_size,
                                         const std::string& path) {
  bool found = false;
  RecordLogHead head;
  for (size_t at = 0; at + kBlockBytes <= std::min<size_t>(file.size(), kRecordLogHeadBytes);
       at += kBlockBytes) {
    const absl::string_view block = file.substr(at, kBlockBytes);
    if (block.substr(0, 8) != kMagic) continue;
    const uint32_t header_length = Load32(&block[12]);
    if (header_length > kRecordLogMaxHeaderBytes) continue;
    const size_t crc_at = 16 + header_length + 16;
    if (Crc(block.substr(0, crc_at)) != Load32(&block[crc_at])) continue;
    const uint32_t version = Load32(&block[8]);
    if (version != kRecordLogFormatVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": log format version ", version, "; this samplerd reads version ",
                       kRecordLogFormatVersion, kOtherFormatVersionAdvice));
    }
    const uint64_t sequence = Load64(&block[16 + header_length]);
    if (found && sequence <= head.sequence) continue;
    found = true;
    head.header = std::string(block.substr(16, header_length));
    head.sequence = sequence;
    head.synced_bytes = Load64(&block[16 + header_length + 8]);
  }
  if (!found) {
    return absl::DataLossError(
        absl::StrCat(path, ": no intact head (the file is ", file_size, " bytes; ",
                     file_size <= kRecordLogHeadBytes
                         ? "its creation never completed, or it is damaged"
                         : absl::StrCat("it is damaged, or not a samplerd log of format version ",
                                        kRecordLogFormatVersion),
                     ")"));
  }
  return head;
}

}  // namespace

absl::StatusOr<RecordLogHead> ReadRecordLogHead(const std::string& path) {
  // The head only: a log may be large.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError("open", path, errno);
  std::string head(kRecordLogHeadBytes, '\0');
  size_t done = 0;
  while (done < head.size()) {
    const ssize_t n = ::pread(fd, head.data() + done, head.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error_number = errno;
      ::close(fd);
      return PosixError("read", path, error_number);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  struct stat st;
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int error_number = errno;
  ::close(fd);
  if (!stat_ok) return PosixError("stat", path, error_number);
  head.resize(done);
  return DecodeHead(head, static_cast<uint64_t>(st.st_size), path);
}

absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path, uint64_t synced_bytes) {
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  const absl::string_view file = *data;
  RecordLogContents contents;
  absl::StatusOr<RecordLogHead> head = DecodeHead(file, file.size(), path);
  if (!head.ok()) return head.status();
  contents.head = *std::move(head);
  // Whatever lies within the synced bytes was on disk before anything was acknowledged; the head
  // itself always was (Open syncs it before returning), whatever a damaged head claims.
  const uint64_t synced = std::max({synced_bytes, contents.head.synced_bytes, kRecordLogHeadBytes});
  if (file.size() < synced) {
    return absl::DataLossError(absl::StrCat(path, ": cut short: ", file.size(),
                                            " bytes, but its first ", synced,
                                            " bytes had been synced"));
  }
  auto header_ok = [&](size_t at) {
    return at + kHeaderBytes <= file.size() && Crc(file.substr(at, 4)) == Load32(&file[at + 4]) &&
           Load32(&file[at]) <= kMaxLength;
  };
  // The length of an intact record at `at`, or -1.
  auto intact_length = [&](size_t at) -> int64_t {
    if (!header_ok(at)) return -1;
    const uint64_t length = Load32(&file[at]);
    if (file.size() - at < kHeaderBytes + length + kTrailerBytes) return -1;
    const absl::string_view payload = file.substr(at + kHeaderBytes, length);
    if (Crc(payload) != Load32(&file[at + kHeaderBytes + length])) return -1;
    return static_cast<int64_t>(length);
  };
  size_t at = kRecordLogHeadBytes;
  while (at < file.size()) {
    const int64_t length = intact_length(at);
    if (length < 0) {
      if (at < synced) {
        return absl::DataLossError(
            absl::StrCat(path, ": corrupt record at byte ", at, " of ", file.size(), " (",
                         header_ok(at) ? "payload checksum mismatch" : "header checksum mismatch",
                         "; the first ", synced, " bytes had been synced)"));
      }
      contents.torn_tail = true;
      break;
    }
    contents.records.emplace_back(file.substr(at + kHeaderBytes, static_cast<size_t>(length)));
    at += kHeaderBytes + static_cast<size_t>(length) + kTrailerBytes;
  }
  contents.valid_bytes = at;
  return contents;
}

RecordLogWriter::RecordLogWriter(std::string path, int fd, std::string header, uint64_t size,
                                 uint64_t head_sequence)
    : path_(std::move(path)),
      fd_(fd),
      header_(std::move(header)),
      size_(size),
      synced_(size),
      claimed_(size),
      head_sequence_(head_sequence) {}

absl::StatusOr<std::unique_ptr<RecordLogWriter>> RecordLogWriter::Open(const std::string& path,
                                                                       absl::string_view header) {
  absl::StatusOr<RecordLogContents> existing = ReadRecordLog(path);
  if (absl::IsNotFound(existing.status())) {
    if (header.size() > kRecordLogMaxHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a log header of ", header.size(),
                                                     " bytes; at most ", kRecordLogMaxHeaderBytes));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open", path, errno);
    // Both blocks claim the head itself; the head is durable before any record follows it.
    const std::string head = absl::StrCat(EncodeHeadBlock(header, 0, kRecordLogHeadBytes),
                                          EncodeHeadBlock(header, 1, kRecordLogHeadBytes));
    absl::Status s = WriteAll(fd, head, path);
    if (s.ok() && ::fdatasync(fd) != 0) s = PosixError("fdatasync", path, errno);
    if (!s.ok()) {
      ::close(fd);
      return s;
    }
    return std::unique_ptr<RecordLogWriter>(
        new RecordLogWriter(path, fd, std::string(header), kRecordLogHeadBytes, 1));
  }
  if (!existing.ok()) return existing.status();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return PosixError("open", path, errno);
  // Drop a torn tail so that new records follow the last intact one, and make what is kept
  // durable (a crashed process's writes may still be in the page cache only): it is replayed,
  // so it must stay.
  const uint64_t valid_bytes = existing->valid_bytes;
  if (::ftruncate(fd, static_cast<off_t>(valid_bytes)) != 0 ||
      ::lseek(fd, static_cast<off_t>(valid_bytes), SEEK_SET) < 0 || ::fdatasync(fd) != 0) {
    const int error_number = errno;
    ::close(fd);
    return PosixError("truncate", path, error_number);
  }
  std::unique_ptr<RecordLogWriter> writer(new RecordLogWriter(
      path, fd, std::move(existing->head.header), valid_bytes, existing->head.sequence));
  absl::MutexLock lock(&writer->mu_);
  writer->claimed_ = existing->head.synced_bytes;
  if (absl::Status s = writer->WriteSyncedClaim(); !s.ok()) return s;
  return writer;
}

RecordLogWriter::~RecordLogWriter() { ::close(fd_); }

absl::Status RecordLogWriter::Failed(absl::Status status) {
  error_ = status;
  return status;
}

absl::Status RecordLogWriter::Append(absl::string_view payload) {
  if (payload.size() > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("a log record of ", payload.size(), " bytes; at most 2 GiB - 1"));
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
  size_ += record.size();
  metrics::Process().wal_bytes->Increment(record.size());
  return absl::OkStatus();
}

absl::Status RecordLogWriter::Sync() {
  uint64_t target = 0;
  uint64_t head_writes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    target = size_;
    head_writes = head_writes_;
    if (target <= synced_ && claimed_ >= synced_ && head_writes_synced_ == head_writes_) {
      return absl::OkStatus();  // Everything, the head's claim included, is on disk.
    }
  }
  // Not under mu_: appends go on while the disk syncs (fdatasync covers what was written
  // before it started).
  const absl::Time sync_start = absl::Now();
  if (::fdatasync(fd_) != 0) {
    const absl::Status s = PosixError("fdatasync", path_, errno);
    absl::MutexLock lock(&mu_);
    return Failed(s);
  }
  metrics::Process().wal_fsync_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - sync_start));
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  synced_ = std::max(synced_, target);
  head_writes_synced_ = std::max(head_writes_synced_, head_writes);
  return WriteSyncedClaim();
}

absl::Status RecordLogWriter::WriteSyncedClaim() {
  // The other block must be durable before this one is rewritten: a crash may tear the block
  // being written, never both.
  if (synced_ <= claimed_ || head_writes_synced_ != head_writes_) return absl::OkStatus();
  const uint64_t sequence = head_sequence_ + 1;
  const std::string block = EncodeHeadBlock(header_, sequence, synced_);
  const off_t offset = static_cast<off_t>((sequence % 2) * kBlockBytes);
  for (size_t done = 0; done < block.size();) {
    const ssize_t n =
        ::pwrite(fd_, block.data() + done, block.size() - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Failed(PosixError("write", path_, errno));
    }
    done += static_cast<size_t>(n);
  }
  head_sequence_ = sequence;
  claimed_ = synced_;
  ++head_writes_;
  return absl::OkStatus();
}

uint64_t RecordLogWriter::synced_bytes() const {
  absl::MutexLock lock(&mu_);
  return synced_;
}

}  // namespace samplerd
