// Which data-parallel rank this trainer process is: from its flags, else from the environment
// variables torchrun and most launchers set (RANK, WORLD_SIZE, LOCAL_RANK), else rank 0 of 1.
#ifndef SAMPLERD_EXAMPLES_CPP_RANK_INFO_H_
#define SAMPLERD_EXAMPLES_CPP_RANK_INFO_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace samplerd {
namespace examples {

struct RankInfo {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The GPU of this process (cudaSetDevice): its rank among the processes of its machine.
  int local_rank = 0;
};

// Flag values: -1 (rank, local_rank) or 0 (world_size) mean "not given".
struct RankFlags {
  int64_t rank = -1;
  int64_t world_size = 0;
  int64_t local_rank = -1;
};

// Looks up an environment variable: nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
std::optional<std::string> GetEnv(const std::string& name);

// Each value from its flag if given, else its variable (RANK, WORLD_SIZE, LOCAL_RANK) if set,
// else the default: rank 0, world size 1, local rank = rank (one machine). INVALID_ARGUMENT
// naming the flag or variable and its value for: a variable that is not a decimal integer,
// world_size outside [1, MAX_WORLD_SIZE (proto)], rank outside [0, world_size), a negative
// local rank.
absl::StatusOr<RankInfo> ResolveRankInfo(const RankFlags& flags, const EnvLookup& env);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_RANK_INFO_H_
