#include "tests/rank_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, address, "", "samplerd host:port");
ABSL_FLAG(int, max_retries, samplerd::ClientOptions{}.max_retries,
          "ClientOptions::max_retries (its default: a trainer's)");
ABSL_FLAG(std::string, job, "", "job name");
ABSL_FLAG(uint32_t, rank, 0, "data-parallel rank");
ABSL_FLAG(uint32_t, world_size, 1, "world size");

namespace samplerd {
namespace testutil {

absl::StatusOr<std::unique_ptr<SamplerClient>> RankClient() {
  ClientOptions options;
  options.max_retries = absl::GetFlag(FLAGS_max_retries);
  return SamplerClient::Create(absl::GetFlag(FLAGS_address), options);
}

}  // namespace testutil
}  // namespace samplerd
