#include "examples/cpp/trainer_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace samplerd {
namespace examples {
namespace {

constexpr absl::string_view kHeader = "samplerd.TrainerCheckpoint version=1";
constexpr absl::string_view kModelBytes = "model_bytes=";

absl::Status OsError(absl::string_view call, const std::string& path, int error_number) {
  const std::string message =
      absl::StrCat("trainer checkpoint ", path, ": ", call, ": ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  if (error_number == ENOSPC || error_number == EDQUOT) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("trainer checkpoint ", path, " is damaged: ", what,
                                          " (remove it to start the rank afresh)"));
}

// Writes `data` to a new file `path` and fsyncs it.
absl::Status WriteSynced(const std::string& path, absl::string_view data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return OsError("open", path, errno);
  absl::Status status;
  while (!data.empty() && status.ok()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = OsError("write", path, errno);
    } else {
      data.remove_prefix(static_cast<size_t>(n));
    }
  }
  if (status.ok() && fsync(fd) != 0) status = OsError("fsync", path, errno);
  if (close(fd) != 0 && status.ok()) status = OsError("close", path, errno);
  return status;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Takes the line at the front of `rest` (without its newline); false if there is no newline.
bool TakeLine(absl::string_view& rest, absl::string_view& line) {
  const size_t end = rest.find('\n');
  if (end == absl::string_view::npos) return false;
  line = rest.substr(0, end);
  rest.remove_prefix(end + 1);
  return true;
}

}  // namespace

absl::Status SaveTrainerCheckpoint(const std::string& path, const TrainerCheckpoint& checkpoint) {
  const std::string text =
      absl::StrCat(kHeader, "\n", checkpoint.position.Serialize(), "\n", kModelBytes,
                   checkpoint.model.size(), "\n", checkpoint.model);
  const std::string temporary = path + ".tmp";
  if (absl::Status s = WriteSynced(temporary, text); !s.ok()) {
    unlink(temporary.c_str());
    return s;
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    unlink(temporary.c_str());
    return OsError("rename", path, error_number);
  }
  const std::string dir = DirectoryOf(path);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return OsError("open directory", dir, errno);
  const int synced = fsync(fd);
  const int error_number = errno;
  close(fd);
  if (synced != 0) return OsError("fsync directory", dir, error_number);
  return absl::OkStatus();
}

absl::StatusOr<TrainerCheckpoint> LoadTrainerCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return OsError("open", path, errno);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return OsError("read", path, errno);
  const std::string text = contents.str();
  absl::string_view rest = text;
  absl::string_view line;
  if (!TakeLine(rest, line) || line != kHeader) {
    return DataLoss(path, absl::StrCat("its first line is not \"", kHeader, "\""));
  }
  TrainerCheckpoint checkpoint;
  if (!TakeLine(rest, line)) return DataLoss(path, "no position line");
  absl::StatusOr<ReaderPosition> position = ReaderPosition::Parse(line);
  if (!position.ok()) return DataLoss(path, position.status().message());
  checkpoint.position = *std::move(position);
  uint64_t model_bytes = 0;
  if (!TakeLine(rest, line) || !absl::ConsumePrefix(&line, kModelBytes) ||
      !absl::SimpleAtoi(line, &model_bytes)) {
    return DataLoss(path, absl::StrCat("no \"", kModelBytes, "<n>\" line"));
  }
  if (model_bytes != rest.size()) {
    return DataLoss(path, absl::StrCat(kModelBytes, model_bytes, " but ", rest.size(),
                                       " bytes follow"));
  }
  checkpoint.model = std::string(rest);
  return checkpoint;
}

}  // namespace examples
}  // namespace samplerd
