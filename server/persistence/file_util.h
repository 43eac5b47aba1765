// Small POSIX file helpers for the persistence layer: whole-buffer writes, durable renames.
// Errors are absl::Status naming the path and strerror(errno).
#ifndef SAMPLERD_SERVER_PERSISTENCE_FILE_UTIL_H_
#define SAMPLERD_SERVER_PERSISTENCE_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace samplerd {

// An error for a failed system call on `path`: `what` ("write", "fsync", ...) and errno's text.
// ENOSPC and EDQUOT map to RESOURCE_EXHAUSTED, ENOENT to NOT_FOUND, anything else to INTERNAL.
absl::Status PosixError(absl::string_view what, const std::string& path, int error_number);

// Writes all of `data` to `fd` (retrying short writes and EINTR).
absl::Status WriteAll(int fd, absl::string_view data, const std::string& path);

// Reads the whole file. NOT_FOUND if it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// fsyncs a directory, so that a rename or a new file in it is durable.
absl::Status SyncDirectory(const std::string& dir);

// Ends the error of a file of another format version (snapshot or log): what the operator does.
inline constexpr absl::string_view kOtherFormatVersionAdvice =
    " (written by another samplerd release: run that release until the job ends, or move the "
    "job's directory away; docs/PERSISTENCE.md, Upgrade and rollback)";

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_FILE_UTIL_H_
