#include "server/auth/token_table.h"

#include <sys/stat.h>

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "openssl/crypto.h"
#include "openssl/sha.h"
#include "server/job_config.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

constexpr size_t kMinTokenLength =
    16;  // Shorter is guessable; generate with `openssl rand -hex 32`.
constexpr size_t kMaxTokenLength = 4096;
constexpr absl::string_view kJobsPrefix = "jobs=";

// Why `token` cannot be a token, or "" if it can. Never quotes the token (it may be a real one
// with a typo, and error messages end up in logs).
std::string TokenProblem(absl::string_view token) {
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
    return absl::StrCat("the token has ", token.size(), " characters; it must have ",
                        kMinTokenLength, " to ", kMaxTokenLength);
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) return "the token must be printable ASCII without spaces";
  }
  return "";
}

// The grant of a line: "admin" or "jobs=NAME[,NAME...]". The messages never quote the field:
// when a line's columns are swapped ("jobs=train TOKEN") it is the token.
absl::StatusOr<TokenGrant> ParseGrant(absl::string_view grant) {
  TokenGrant result;
  if (grant == "admin") {
    result.admin = true;
    return result;
  }
  if (!absl::StartsWith(grant, kJobsPrefix)) {
    return absl::InvalidArgumentError(
        "the grant (second field) is neither \"admin\" nor \"jobs=NAME[,NAME...]\" (not quoted "
        "here: it may be a token)");
  }
  int position = 0;
  for (absl::string_view job : absl::StrSplit(grant.substr(kJobsPrefix.size()), ',')) {
    ++position;
    if (!ValidateJobName(std::string(job)).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job name ", position, " of the grant is not a job name (see CreateJob's `name`)"));
    }
    result.jobs.insert(std::string(job));
  }
  return result;
}

// Whether `field` reads as a grant: a line whose first field does has its columns swapped.
bool LooksLikeGrant(absl::string_view field) {
  return field == "admin" || absl::StartsWith(field, kJobsPrefix);
}

}  // namespace

absl::Status CheckTokenFileMode(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();
  const std::string mode = absl::StrFormat("%04o", st.st_mode & 07777);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(flag, " = \"", path, "\": writable by ",
                     (st.st_mode & S_IWOTH) != 0 ? "every user" : "its group", " (mode ", mode,
                     "): whoever may write it may put in a token of their own; chmod go-w it"));
  }
  if ((st.st_mode & S_IROTH) != 0) {
    LOG(WARNING) << flag << " = \"" << path << "\" is readable by every user of this machine (mode "
                 << mode << "): chmod o-r it";
  }
  return absl::OkStatus();
}

TokenTable::Digest TokenTable::Sha256(absl::string_view data) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view source) {
  TokenTable table;
  absl::flat_hash_map<std::string, int> line_of_digest;  // Finds a token listed twice.
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": line ", line_number, ": ", why));
    };
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return bad(absl::StrCat("expected \"TOKEN admin\" or \"TOKEN jobs=NAME[,NAME...]\", got ",
                              fields.size(), " fields"));
    }
    if (LooksLikeGrant(fields[0])) {
      return bad("the first field is a grant: a line is \"TOKEN GRANT\", token first");
    }
    if (std::string problem = TokenProblem(fields[0]); !problem.empty()) return bad(problem);
    absl::StatusOr<TokenGrant> grant = ParseGrant(fields[1]);
    if (!grant.ok()) return bad(grant.status().message());
    const Digest digest = Sha256(fields[0]);
    const std::string key(digest.begin(), digest.end());
    if (auto [it, inserted] = line_of_digest.emplace(key, line_number); !inserted) {
      return bad(absl::StrCat("the token of line ", it->second, " again"));
    }
    table.entries_.push_back(Entry{digest, std::make_shared<const TokenGrant>(*std::move(grant))});
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

absl::StatusOr<TokenTable> TokenTable::LoadSingle(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  const absl::string_view token = absl::StripAsciiWhitespace(*text);
  if (std::string problem = TokenProblem(token); !problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": must hold one token and nothing else: ", problem));
  }
  TokenTable table;
  auto grant = std::make_shared<TokenGrant>();
  grant->admin = true;
  table.entries_.push_back(Entry{Sha256(token), std::move(grant)});
  return table;
}

std::shared_ptr<const TokenGrant> TokenTable::Find(absl::string_view token) const {
  const Digest digest = Sha256(token);
  std::shared_ptr<const TokenGrant> found;
  // Every entry is compared, in constant time each, whether or not one matched already.
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0) {
      found = entry.grant;
    }
  }
  return found;
}

}  // namespace samplerd
