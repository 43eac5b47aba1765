// JobConfig: a validated job specification with every default filled in.
//
// The one place that turns a client's v1::JobSpec into the engine's plain parameters (PlanSpec,
// ShardSpec, WeightPolicyParams) and back into the normalised spec that the server stores and
// returns. Two specs are "the same" (CreateJob is idempotent) iff their normalised forms are
// equal. Pure functions; no gRPC.
#ifndef SAMPLERD_SERVER_JOB_CONFIG_H_
#define SAMPLERD_SERVER_JOB_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/plan.h"
#include "kernels/shard.h"
#include "kernels/weight_policy.h"
#include "proto/samplerd.pb.h"
#include "server/mixture_config.h"

namespace samplerd {

// Server-wide limits and settings applied to every job.
struct JobLimits {
  uint64_t max_samples_per_job = uint64_t{1} << 32;
  // Epoch starts kept for RewindJob (--rewind_epochs), the current one's included; 0: none.
  uint32_t rewind_epochs = 3;
};

struct JobConfig {
  PlanSpec plan;  // samples_per_epoch resolved (0 -> N).
  ShardSpec shard;
  WeightPolicyParams policy;
  v1::JobSpec normalized;  // The spec with defaults filled in, as returned to clients.
  // The server's setting (JobLimits::rewind_epochs), not part of the spec.
  uint32_t rewind_epochs = 0;
  // A mixture job's groups and weights (spec.mixture set); null for other jobs.
  std::shared_ptr<const MixtureConfig> mixture;
};

// Validates `spec` and fills defaults. INVALID_ARGUMENT names the field and value
// ("spec.world_size = 0: must be >= 1"); RESOURCE_EXHAUSTED for num_samples over the limit.
// A mixture job (spec.mixture set): MakeMixtureConfig's checks; num_samples 0 becomes the sum
// of the group sizes and --max_samples_per_job does not apply (nothing is kept per sample);
// samples_per_epoch (the window) must be in [1, 2^34]; replacement, order and policy must keep
// their defaults (INVALID_ARGUMENT naming them otherwise).
absl::StatusOr<JobConfig> MakeJobConfig(const v1::JobSpec& spec, const JobLimits& limits);

// Job names: [A-Za-z0-9._-], 1 to 128 characters, not "." or ".." (a job name is a directory
// name under --data_dir). INVALID_ARGUMENT otherwise.
absl::Status ValidateJobName(const std::string& name);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_CONFIG_H_
