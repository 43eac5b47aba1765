#include "client/cpp/reader_position.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace samplerd {
namespace {

constexpr absl::string_view kHeader = "samplerd.ReaderPosition";

absl::Status Invalid(absl::string_view field, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("reader position: ", field, " = \"", value.substr(0, 140), "\": ", why));
}

// `fields[name]` as an unsigned number of type T (removed from `fields`).
template <typename T>
absl::Status TakeNumber(absl::flat_hash_map<absl::string_view, absl::string_view>* fields,
                        absl::string_view name, T* out) {
  auto it = fields->find(name);
  if (it == fields->end()) return Invalid(name, "", "missing");
  const absl::string_view text = it->second;
  fields->erase(it);
  // SimpleAtoi accepts a sign and surrounding spaces; a position is digits only.
  uint64_t value = 0;
  if (text.empty() || text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(text, &value)) {
    return Invalid(name, text, "not an unsigned decimal number");
  }
  if (value > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return Invalid(name, text, absl::StrCat("does not fit in ", sizeof(T) * 8, " bits"));
  }
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

}  // namespace

std::string ReaderPosition::Serialize() const {
  std::string text =
      absl::StrCat(kHeader, " version=", kVersion, " job=", job, " epoch=", epoch, " deal=", deal,
                   " rank=", rank, " world_size=", world_size, " position=", position);
  if (shard_length.has_value()) absl::StrAppend(&text, " shard_length=", *shard_length);
  return text;
}

absl::Status ReaderPosition::CheckOwner(absl::string_view owner_job, uint32_t owner_rank,
                                        uint32_t owner_world_size) const {
  // Named as the loading reader: job "j" rank R, and the position's epoch.
  const std::string loading =
      absl::StrCat("job \"", owner_job, "\" rank ", owner_rank, ": the position of epoch ", epoch);
  if (job != owner_job) {
    return absl::InvalidArgumentError(absl::StrCat(
        loading, " has position.job = \"", job, "\" (rank ", rank, "): this reader reads job \"",
        owner_job, "\"; resume this job's own position"));
  }
  if (rank != owner_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(loading, " has position.rank = ", rank, ": this reader reads rank ",
                     owner_rank, "; each rank resumes its own position (saved by that rank)"));
  }
  if (world_size != owner_world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        loading, " has position.world_size = ", world_size, ": this reader's world size is ",
        owner_world_size, " (the shards of another world size are other positions)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReaderPosition> ReaderPosition::Parse(absl::string_view text) {
  std::vector<absl::string_view> tokens = absl::StrSplit(text, ' ');
  if (tokens.empty() || tokens[0] != kHeader) {
    return Invalid("header", tokens.empty() ? "" : tokens[0],
                   absl::StrCat("expected \"", kHeader, "\" (not a ReaderPosition)"));
  }
  absl::flat_hash_map<absl::string_view, absl::string_view> fields;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const size_t eq = tokens[i].find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return Invalid("field", tokens[i], "expected name=value");
    }
    const absl::string_view name = tokens[i].substr(0, eq);
    if (!fields.emplace(name, tokens[i].substr(eq + 1)).second) {
      return Invalid(name, tokens[i].substr(eq + 1), "given twice");
    }
  }
  // The version first: a newer writer's fields are only meaningful to a reader of its version.
  int version = 0;
  if (absl::Status s = TakeNumber(&fields, "version", &version); !s.ok()) return s;
  if (version < 1 || version > kVersion) {
    return Invalid("version", absl::StrCat(version),
                   absl::StrCat("this client reads 1 to ", kVersion));
  }
  ReaderPosition p;
  auto job = fields.find("job");
  if (job == fields.end()) return Invalid("job", "", "missing");
  if (job->second.empty()) return Invalid("job", "", "must not be empty");
  p.job = std::string(job->second);
  fields.erase(job);
  if (absl::Status s = TakeNumber(&fields, "epoch", &p.epoch); !s.ok()) return s;
  if (version >= 2) {
    if (absl::Status s = TakeNumber(&fields, "deal", &p.deal); !s.ok()) return s;
  }
  if (absl::Status s = TakeNumber(&fields, "rank", &p.rank); !s.ok()) return s;
  if (absl::Status s = TakeNumber(&fields, "world_size", &p.world_size); !s.ok()) return s;
  if (absl::Status s = TakeNumber(&fields, "position", &p.position); !s.ok()) return s;
  if (version >= 3 && fields.contains("shard_length")) {  // Optional: where the writer knew it.
    uint64_t length = 0;
    if (absl::Status s = TakeNumber(&fields, "shard_length", &length); !s.ok()) return s;
    p.shard_length = length;
  }
  if (!fields.empty()) {
    return Invalid(fields.begin()->first, fields.begin()->second, "unknown field");
  }
  if (p.world_size == 0) return Invalid("world_size", "0", "must be >= 1");
  if (p.rank >= p.world_size) {
    return Invalid("rank", absl::StrCat(p.rank),
                   absl::StrCat("must be < world_size = ", p.world_size));
  }
  if (p.shard_length.has_value() && p.position > *p.shard_length) {
    return Invalid("position", absl::StrCat(p.position),
                   absl::StrCat("past shard_length = ", *p.shard_length));
  }
  return p;
}

}  // namespace samplerd
