#include "examples/cpp/rank_info.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/samplerd.pb.h"

namespace samplerd {
namespace examples {
namespace {

// The flag's value if given (`given`), else the variable's, else `fallback`; `source` says which
// (for error messages).
absl::StatusOr<int64_t> Pick(bool given, int64_t flag_value, const char* flag_name,
                             const char* variable, const EnvLookup& env, int64_t fallback,
                             std::string* source) {
  if (given) {
    *source = absl::StrCat("--", flag_name);
    return flag_value;
  }
  if (const std::optional<std::string> text = env(variable); text.has_value()) {
    *source = absl::StrCat("environment variable ", variable);
    int64_t value = 0;
    if (!absl::SimpleAtoi(*text, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(*source, " = '", *text, "' is not a decimal integer"));
    }
    return value;
  }
  *source = "default";
  return fallback;
}

}  // namespace

std::optional<std::string> GetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<RankInfo> ResolveRankInfo(const RankFlags& flags, const EnvLookup& env) {
  std::string world_source, rank_source, local_source;
  const absl::StatusOr<int64_t> world = Pick(flags.world_size != 0, flags.world_size, "world_size",
                                             "WORLD_SIZE", env, 1, &world_source);
  if (!world.ok()) return world.status();
  const int64_t max_world = v1::MAX_WORLD_SIZE;
  if (*world < 1 || *world > max_world) {
    return absl::InvalidArgumentError(
        absl::StrCat(world_source, ": world size ", *world, " is outside [1, ", max_world, "]"));
  }
  const absl::StatusOr<int64_t> rank =
      Pick(flags.rank >= 0, flags.rank, "rank", "RANK", env, 0, &rank_source);
  if (!rank.ok()) return rank.status();
  if (*rank < 0 || *rank >= *world) {
    return absl::InvalidArgumentError(
        absl::StrCat(rank_source, ": rank ", *rank, " is outside [0, world size ", *world, ")"));
  }
  const absl::StatusOr<int64_t> local = Pick(flags.local_rank >= 0, flags.local_rank, "local_rank",
                                             "LOCAL_RANK", env, *rank, &local_source);
  if (!local.ok()) return local.status();
  if (*local < 0 || *local > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(local_source, ": local rank ", *local, " is negative or absurdly large"));
  }
  RankInfo info;
  info.rank = static_cast<uint32_t>(*rank);
  info.world_size = static_cast<uint32_t>(*world);
  info.local_rank = static_cast<int>(*local);
  return info;
}

}  // namespace examples
}  // namespace samplerd
