#include "server/persistence/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/metrics/process_metrics.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

constexpr absl::string_view kMagic = "SMPLRDSN";
static_assert(sizeof(SampleLossStats) == 8, "the snapshot stores 8-byte loss statistics");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the snapshot format is little-endian");

// crc32 of a sequence of byte ranges, as written or read.
class RunningCrc {
 public:
  void Add(const void* data, size_t size) {
    // Never a null buffer: zlib's crc32_z(crc, NULL, 0) returns the initial value, not crc.
    if (size > 0) crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), size);
  }
  uint32_t value() const { return static_cast<uint32_t>(crc_); }

 private:
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

// Closes the descriptor on every path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

absl::Status ReadExact(int fd, void* out, size_t size, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read", path, errno);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": truncated snapshot"));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Whether the trailing crc32 of the file matches the bytes before it (read with pread).
bool WholeFileChecksumMatches(int fd, uint64_t file_size) {
  if (file_size < 4) return false;
  RunningCrc crc;
  std::vector<char> buffer(1 << 20);
  uint64_t at = 0;
  const uint64_t body = file_size - 4;
  while (at < body) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), body - at));
    const ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(at));
    if (n <= 0) return false;
    crc.Add(buffer.data(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  uint32_t stored = 0;
  if (::pread(fd, &stored, 4, static_cast<off_t>(body)) != 4) return false;
  return stored == crc.value();
}

}  // namespace

absl::Status StageSnapshot(const std::string& path, state::SnapshotHeader header,
                           absl::Span<const float> base, absl::Span<const float> weights,
                           absl::Span<const SampleLossStats> loss_stats,
                           absl::Span<const float> irreducible) {
  header.set_format_version(kSnapshotFormatVersion);
  header.set_base_count(base.size());
  header.set_weights_count(weights.size());
  header.set_loss_stats_count(loss_stats.size());
  header.set_irreducible_count(irreducible.size());
  const absl::Time start = absl::Now();
  const std::string header_bytes = header.SerializeAsString();
  const uint32_t header_length = static_cast<uint32_t>(header_bytes.size());

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return PosixError("open", tmp, errno);
  RunningCrc crc;
  auto put = [&](const void* data, size_t size) {
    crc.Add(data, size);
    return WriteAll(fd.get(), absl::string_view(static_cast<const char*>(data), size), tmp);
  };
  absl::Status s = put(kMagic.data(), kMagic.size());
  if (s.ok()) s = put(&header_length, 4);
  if (s.ok()) s = put(header_bytes.data(), header_bytes.size());
  if (s.ok()) s = put(base.data(), base.size() * sizeof(float));
  if (s.ok()) s = put(weights.data(), weights.size() * sizeof(float));
  if (s.ok()) s = put(loss_stats.data(), loss_stats.size() * sizeof(SampleLossStats));
  if (s.ok()) s = put(irreducible.data(), irreducible.size() * sizeof(float));
  const uint32_t checksum = crc.value();
  if (s.ok()) {
    s = WriteAll(fd.get(), absl::string_view(reinterpret_cast<const char*>(&checksum), 4), tmp);
  }
  if (::close(fd.release()) != 0 && s.ok()) s = PosixError("close", tmp, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  if (s.ok()) {
    metrics::Process().snapshot_write_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return s;
}

absl::Status CommitSnapshot(const std::string& path) {
  const absl::Time start = absl::Now();
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return PosixError("open", tmp, errno);
  if (::fsync(fd.get()) != 0) return PosixError("fsync", tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("rename", tmp, errno);
  const size_t slash = path.rfind('/');
  absl::Status s = SyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash));
  if (s.ok()) {
    metrics::Process().snapshot_commit_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return s;
}

absl::Status WriteSnapshot(const std::string& path, state::SnapshotHeader header,
                           absl::Span<const float> base, absl::Span<const float> weights,
                           absl::Span<const SampleLossStats> loss_stats,
                           absl::Span<const float> irreducible) {
  if (absl::Status s =
          StageSnapshot(path, std::move(header), base, weights, loss_stats, irreducible);
      !s.ok()) {
    return s;
  }
  return CommitSnapshot(path);
}

absl::StatusOr<Snapshot> ReadSnapshot(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return PosixError("open", path, errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return PosixError("stat", path, errno);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt snapshot (", what, ")"));
  };
  RunningCrc crc;
  auto get = [&](void* out, size_t size) {
    absl::Status s = ReadExact(fd.get(), out, size, path);
    if (s.ok()) crc.Add(out, size);
    return s;
  };
  char magic[8];
  uint32_t header_length = 0;
  if (file_size < kMagic.size() + 8) return corrupt(absl::StrCat(file_size, " bytes"));
  if (absl::Status s = get(magic, sizeof(magic)); !s.ok()) return s;
  if (absl::string_view(magic, 8) != kMagic) return corrupt("not a samplerd snapshot");
  if (absl::Status s = get(&header_length, 4); !s.ok()) return s;
  if (header_length > file_size) return corrupt(absl::StrCat("header length ", header_length));
  std::string header_bytes(header_length, '\0');
  if (absl::Status s = get(header_bytes.data(), header_length); !s.ok()) return s;
  Snapshot snapshot;
  if (!snapshot.header.ParseFromString(header_bytes)) return corrupt("malformed header");
  const state::SnapshotHeader& h = snapshot.header;
  if (h.format_version() != kSnapshotFormatVersion) {
    // Damage and a file from another version look alike here: the checksum tells them apart.
    if (!WholeFileChecksumMatches(fd.get(), file_size)) return corrupt("checksum mismatch");
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": snapshot format_version = ", h.format_version(), "; this samplerd reads version ",
        kSnapshotFormatVersion, kOtherFormatVersionAdvice));
  }
  // Check the sizes against the file before allocating anything they ask for.
  const unsigned __int128 expected = static_cast<unsigned __int128>(kMagic.size()) + 4 +
                                     header_length +
                                     4 * static_cast<unsigned __int128>(h.base_count()) +
                                     4 * static_cast<unsigned __int128>(h.weights_count()) +
                                     8 * static_cast<unsigned __int128>(h.loss_stats_count()) +
                                     4 * static_cast<unsigned __int128>(h.irreducible_count()) + 4;
  if (expected != file_size) {
    return corrupt(absl::StrCat(file_size, " bytes where the header describes ",
                                static_cast<uint64_t>(expected)));
  }
  snapshot.base.resize(h.base_count());
  snapshot.weights.resize(h.weights_count());
  snapshot.loss_stats.resize(h.loss_stats_count());
  snapshot.irreducible.resize(h.irreducible_count());
  absl::Status s = get(snapshot.base.data(), snapshot.base.size() * sizeof(float));
  if (s.ok()) s = get(snapshot.weights.data(), snapshot.weights.size() * sizeof(float));
  if (s.ok()) {
    s = get(snapshot.loss_stats.data(), snapshot.loss_stats.size() * sizeof(SampleLossStats));
  }
  if (s.ok()) s = get(snapshot.irreducible.data(), snapshot.irreducible.size() * sizeof(float));
  if (!s.ok()) return s;
  const uint32_t computed = crc.value();
  uint32_t stored = 0;
  if (absl::Status r = ReadExact(fd.get(), &stored, 4, path); !r.ok()) return r;
  if (stored != computed) return corrupt("checksum mismatch");
  return snapshot;
}

}  // namespace samplerd
