// The NCCL unique id's rendezvous through a shared file: rank 0 makes the id
// (ncclGetUniqueId) and publishes it with PublishIdFile; every other rank waits for it with
// ReadIdFile. Any filesystem all ranks see works (local /tmp on one machine, NFS across
// machines). Plain bytes here (NCCL_UNIQUE_ID_BYTES of them), so this is host code, tested
// without NCCL or a GPU.
//
// A stale file would hand the other ranks a dead id (and hang their ncclCommInitRank), so rank 0
// refuses to publish over an existing file and removes its file once every rank has joined
// (RemoveIdFile after the communicator is made). A run that crashed may leave the file behind:
// the error says to remove it.
#ifndef SAMPLERD_EXAMPLES_CPP_ID_FILE_H_
#define SAMPLERD_EXAMPLES_CPP_ID_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace samplerd {
namespace examples {

// Writes `bytes` to a temporary file beside `path` and renames it to `path` (readers see the
// whole file or none). ALREADY_EXISTS if `path` exists; the OS error (naming the path) if the
// file cannot be written.
absl::Status PublishIdFile(const std::string& path, const std::string& bytes);

// Waits (polling) until `path` exists and returns its contents, which must be exactly
// `expected_size` bytes (DATA_LOSS otherwise). DEADLINE_EXCEEDED naming the path after
// `timeout`.
absl::StatusOr<std::string> ReadIdFile(const std::string& path, size_t expected_size,
                                       absl::Duration timeout);

// Removes `path`; OK if it is already gone.
absl::Status RemoveIdFile(const std::string& path);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_ID_FILE_H_
