#include "server/persistence/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status PosixError(absl::string_view what, const std::string& path, int error_number) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error_number));
  if (error_number == ENOSPC || error_number == EDQUOT) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  if (error_number == ENOENT) return absl::NotFoundError(std::move(message));
  return absl::InternalError(std::move(message));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError("open", path, errno);
  std::string data;
  struct stat st;
  if (::fstat(fd, &st) == 0) data.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(fd);
      return PosixError("read", path, error_number);
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PosixError("open", dir, errno);
  const bool ok = ::fsync(fd) == 0;
  const int error_number = errno;
  ::close(fd);
  if (!ok) return PosixError("fsync", dir, error_number);
  return absl::OkStatus();
}

}  // namespace samplerd
