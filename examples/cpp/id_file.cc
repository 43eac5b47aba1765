#include "examples/cpp/id_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace samplerd {
namespace examples {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status Errno(const std::string& what, const std::string& path, int error) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(error)));
}

}  // namespace

absl::Status PublishIdFile(const std::string& path, const std::string& bytes) {
  if (Exists(path)) {
    return absl::AlreadyExistsError(
        absl::StrCat("NCCL id file ", path,
                     " already exists (left by an earlier run that did not finish?): remove it "
                     "or pass another --nccl_id_file"));
  }
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return Errno("cannot create", temporary, errno);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return Errno("cannot write", temporary, errno);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    return Errno(absl::StrCat("cannot rename ", temporary, " to"), path, error);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadIdFile(const std::string& path, size_t expected_size,
                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Exists(path)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL id file ", path, " did not appear within ", absl::FormatDuration(timeout),
          " (is rank 0 running, with the same --nccl_id_file?)"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Errno("cannot open", path, errno);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() != expected_size) {
    return absl::DataLossError(absl::StrCat("NCCL id file ", path, " has ", bytes.size(),
                                            " bytes, expected ", expected_size));
  }
  return bytes;
}

absl::Status RemoveIdFile(const std::string& path) {
  if (std::remove(path.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot remove", path, errno);
  }
  return absl::OkStatus();
}

}  // namespace examples
}  // namespace samplerd
