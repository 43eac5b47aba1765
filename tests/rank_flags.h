// The flags every rank tool of the process tests shares (shard_reader_tool, loss_reporter_rank,
// epoch_loop_rank: one trainer rank each, started by a test as a process of its own), and its
// client made from them.
#ifndef SAMPLERD_TESTS_RANK_FLAGS_H_
#define SAMPLERD_TESTS_RANK_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "client/cpp/sampler_client.h"

ABSL_DECLARE_FLAG(std::string, address);  // samplerd host:port.
ABSL_DECLARE_FLAG(int, max_retries);      // ClientOptions::max_retries (default: a trainer's).
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(uint32_t, rank);
ABSL_DECLARE_FLAG(uint32_t, world_size);

namespace samplerd {
namespace testutil {

// A client of --address with a trainer's default options but --max_retries.
absl::StatusOr<std::unique_ptr<SamplerClient>> RankClient();

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_TESTS_RANK_FLAGS_H_
