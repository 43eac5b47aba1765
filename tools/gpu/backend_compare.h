// Compares two running samplerd servers (e.g. one with --backend=cpu, one with --backend=cuda)
// through the real client: the same jobs are created on both, every rank's shard (indices and
// importance weights) is streamed from both, the same losses are reported to both and the epochs
// are ended on both, and the shards and the GetJobStatus weight summaries must be equal bit for
// bit, epoch by epoch. The first difference ends the comparison, named (job, epoch, rank,
// position, both values).
//
// The jobs: for each N of CompareOptions::sizes, one SEQUENTIAL job, and WEIGHTED_RANDOM jobs for
// every base policy (UNIFORM, STATIC with uploaded weights, CLASS_BALANCED with uploaded labels)
// x loss policy (NONE, LOSS, MULTIPLICATIVE) x replacement (with, without) x M (N / 10, N), and
// two mixture jobs (five groups, two of them smaller than the window; static weights changed by
// SetGroupWeights after epoch 1, and EXP3 weights learned from the losses; their GetJobStatus
// groups -- weights, window counts, cursors -- compared too): 39 jobs per N, world sizes 2 and 3
// alternating, partitions and uneven policies varied among them. Inputs come from
// tools/gpu/synthetic_inputs.h.
//
// Not thread-safe; the servers must not be used by anyone else meanwhile (job names are
// `job_prefix`-...: a job of the same name left over from an earlier run is an error).
#ifndef SAMPLERD_TOOLS_GPU_BACKEND_COMPARE_H_
#define SAMPLERD_TOOLS_GPU_BACKEND_COMPARE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/sampler_client.h"

namespace samplerd {
namespace gpu_e2e {

struct CompareOptions {
  // Dataset sizes N, each >= 10 (so that M = N / 10 >= 1).
  std::vector<uint64_t> sizes = {1000, 100000};
  // Epochs each job trains (losses reported, ended); the shards of one more epoch are compared
  // at the end, so the last recompute is checked too. >= 1.
  int epochs = 3;
  std::string job_prefix = "cmp";
  // If not empty, only the jobs whose name contains one of these (e.g. "-m1000000-": the jobs
  // with M = 1e6); the others are skipped, unreported.
  std::vector<std::string> job_filter;
  // Test-only perturbations of what server b receives, so that a test can see a difference
  // found: the seed of every job on b is XORed with this; and the first loss reported to b for
  // each job (rank 0, epoch 0) is increased by 1.
  uint64_t testonly_b_seed_xor = 0;
  bool testonly_b_loss_changed = false;
  // Called with one line per job compared (and nothing else).
  std::function<void(const std::string&)> log;
};

struct CompareSummary {
  int jobs_compared = 0;  // Jobs found equal.
  uint64_t indices_compared = 0;
  std::string backend_a;  // JobStatus.backend of each server.
  std::string backend_b;
  // Empty when everything was equal; else the first difference: "job=J epoch=E rank=R
  // position=P: a ... | b ..." (or the field of JobStatus that differs).
  std::string difference;
};

// INVALID_ARGUMENT (naming the option) for bad options; another error when an RPC fails (its
// status, with the server, job and epoch prepended); otherwise the summary, whose `difference`
// says whether the servers agreed.
absl::StatusOr<CompareSummary> CompareBackends(SamplerClient& a, SamplerClient& b,
                                               const CompareOptions& options);

}  // namespace gpu_e2e
}  // namespace samplerd

#endif  // SAMPLERD_TOOLS_GPU_BACKEND_COMPARE_H_
