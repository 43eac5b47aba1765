// TokenTable: the bearer tokens of --auth_tokens_file and what each grants (docs/SECURITY.md).
//
// File format, one token per line; blank lines and lines starting with '#' are skipped:
//
//   # token                              grant
//   3f9c1a7e0b5d4c2a8e6f1d9b7a5c3e1f     admin
//   a1b2c3d4e5f60718293a4b5c6d7e8f90     jobs=train,eval
//
// A token is 16 to 4096 printable ASCII characters without spaces (it travels in an HTTP/2
// header); the grant is `admin` (every job, and the server-wide calls) or `jobs=` followed by a
// comma-separated list of job names (server/job_config.h's rule: [A-Za-z0-9._-], so a comma
// cannot be part of a name). A token may appear only once, and may not start with `jobs=` or be
// `admin` (a line whose first field reads as a grant has its columns swapped).
//
// The table keeps only the SHA-256 digest of each token, and Find compares the digest of the
// presented token with every entry without stopping early, so the time it takes says nothing
// about which bytes of a guess were right.
//
// Immutable after Parse: safe for concurrent use.
#ifndef SAMPLERD_SERVER_AUTH_TOKEN_TABLE_H_
#define SAMPLERD_SERVER_AUTH_TOKEN_TABLE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace samplerd {

// What one token may do.
struct TokenGrant {
  // Every job, and the calls that are not about one job (ListJobs, DeleteJob).
  bool admin = false;
  // The jobs a non-admin token may use (create, read, stream, report, end epochs).
  absl::flat_hash_set<std::string> jobs;
};

// The file-mode rule of every file holding tokens (--auth_tokens_file, --metrics_token_file):
// one that its group or every user may write is refused, PERMISSION_DENIED naming `flag`, the
// path and the mode (as ssh refuses a writable authorized_keys: whoever may write it may put in
// a token of their own); one every user may read is accepted with a WARNING (Kubernetes mounts
// Secrets 0644 unless told otherwise, and there the container's only user is samplerd's). OK
// when the file cannot be examined: its loader then names that error.
absl::Status CheckTokenFileMode(absl::string_view flag, const std::string& path);

class TokenTable {
 public:
  // Parses the text of a tokens file. INVALID_ARGUMENT naming `source` (the file's path, for
  // messages) and the line number of the first bad line; the message quotes no field of the
  // file, so that it never contains a token, whatever the file holds (swapped columns, a token
  // pasted as a job name).
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view source);
  // Reads and parses the file at `path`. NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT, each
  // naming the path.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The file at `path` holding one token and nothing else (surrounding whitespace ignored), as
  // Prometheus's `credentials_file` reads it: a table of that token, granting admin. NOT_FOUND /
  // PERMISSION_DENIED / INVALID_ARGUMENT, each naming the path, never the token.
  static absl::StatusOr<TokenTable> LoadSingle(const std::string& path);

  // The grant of `token`, or nullptr if the table has no such token. Constant time in the
  // token's content (see the file comment); linear in the number of entries.
  std::shared_ptr<const TokenGrant> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    Digest digest;
    std::shared_ptr<const TokenGrant> grant;
  };
  static Digest Sha256(absl::string_view data);

  std::vector<Entry> entries_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_AUTH_TOKEN_TABLE_H_
