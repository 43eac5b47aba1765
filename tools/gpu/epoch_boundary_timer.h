// Times the epoch boundary of a loss-policy job through a running samplerd (issue 10's "epoch
// boundary through the real server, last EndEpoch to first chunk, loss policy, M = N / 10"):
// the wall time from the moment the last rank's EndEpoch call returns (the server then
// recomputes the weights and plans the next epoch) to the moment the first chunk of the next
// epoch's shard arrives at rank 0, seen by a real client over gRPC.
//
// Each epoch, every rank streams the first `losses_per_rank` positions of its shard and reports
// a synthetic loss for each (tools/gpu/synthetic_inputs.h); the recompute of a loss policy reads
// every sample's statistics whatever their number, so a prefix is enough to make the boundary do
// its full work without a client streaming 1e8 indices per epoch.
#ifndef SAMPLERD_TOOLS_GPU_EPOCH_BOUNDARY_TIMER_H_
#define SAMPLERD_TOOLS_GPU_EPOCH_BOUNDARY_TIMER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/sampler_client.h"

namespace samplerd {
namespace gpu_e2e {

struct BoundaryOptions {
  uint64_t num_samples = 0;        // N, >= 10.
  uint64_t samples_per_epoch = 0;  // M; 0 means N / 10.
  uint32_t world_size = 2;         // >= 1.
  int boundaries = 3;              // Epoch boundaries timed (epochs 0 -> 1, 1 -> 2, ...), >= 1.
  uint64_t losses_per_rank = uint64_t{1} << 20;  // Per epoch, >= 1.
  std::string job = "boundary";                  // Deleted at the end; must not exist before.
};

struct BoundaryTiming {
  std::string backend;               // JobStatus.backend.
  std::vector<double> boundary_ms;   // One per boundary, in order.
  std::vector<double> recompute_ms;  // The server's own JobStatus figures, per boundary.
  std::vector<double> plan_ms;
  double create_ms = 0;  // CreateJob (plans epoch 0).
  double median_ms() const;
};

// INVALID_ARGUMENT naming the option for bad options; an RPC's error (annotated with the job and
// epoch) if one fails. The job is deleted before returning, also after an error when possible.
absl::StatusOr<BoundaryTiming> TimeEpochBoundaries(SamplerClient& client,
                                                   const BoundaryOptions& options);

// One line for logs and check.sh's table: "BOUNDARY backend=... n=... m=... world=...
// boundaries=... median_ms=... min_ms=... max_ms=... recompute_ms=... plan_ms=... create_ms=...".
std::string FormatBoundaryTiming(const BoundaryOptions& options, const BoundaryTiming& timing);

}  // namespace gpu_e2e
}  // namespace samplerd

#endif  // SAMPLERD_TOOLS_GPU_EPOCH_BOUNDARY_TIMER_H_
