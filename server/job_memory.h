// How much memory a job needs, estimated from its spec alone, so that the server can admit jobs
// by memory before allocating anything (JobRegistry, --max_memory_bytes).
//
// The estimate is the job's peak: at an epoch boundary the served plan, the next plan being
// computed (or computed ahead) with its planning scratch, and the weights before and after the
// recompute are all alive at once. Per sample (N) and per plan position (M), with b = 4 bytes
// per index when N <= 2^32 and 8 beyond:
//
//   plans          2 b M      the plan served and the next one (computed one epoch ahead when
//                             plans ignore the weights, else at the boundary while the served
//                             one is still read)
//   base weights   8 N        STATIC / CLASS_BALANCED: the base, and an upload being installed
//   epoch weights  8 N        with a loss policy: W_e and W_{e+1} during the recompute
//   loss stats     8 N        with a loss policy only; 24 N + 44 M when persisted: after a
//                             boundary the journal derives the epoch's snapshot from the
//                             previous one (16 B/sample read back) and the closed epoch's log
//                             (read whole: ~2 x 22 B per reported pair) (job_journal.h)
//   plan scratch   backend    ComputeBackend::PlanScratchBytes: for the CPU backend ~10 N for a
//                             weighted draw with replacement (the draw table), 9 N + 9 M (or
//                             2 N + 17 M) for a selection without replacement (M < N), nothing
//                             for uniform draws with replacement, sequential order or M == N
//   ranks          64 R +     per-rank bookkeeping, and the reported shard positions of the
//                  M / 8      epoch (one bit per position, PositionSet)
//   rewind         K (8 N     without --data_dir, with a loss policy: the K = --rewind_epochs
//                  + 4 N)     epoch starts kept in memory, each a copy of the loss statistics
//                             and (but the current one) its epoch's weights; on disk otherwise
//
// A mixture job (spec.mixture) keeps nothing per sample: 2 b M for its plans, 88 bytes per group
// for its config (MixtureConfig::Bytes) and ~1 MiB of weight history, its planner's scratch
// (MixturePlanner::ScratchBytes: the groups' states, 80 bytes per group each with their weights,
// the backend's window scratch -- ComputeBackend::MixtureWindowScratchBytes: the CPU backend's
// shuffle scratch, the CUDA backend's upload and staging -- and 8 M when b = 4), the ranks, and
// without --data_dir ~80 bytes per group and a weight history per kept epoch start; its driving
// field is spec.samples_per_epoch, or spec.mixture.group_sizes (its value K) when the groups weigh
// more.
//
// So a UNIFORM job with replacement needs 2 b M (8 kB for M = 1000, whatever N); a STATIC job
// with replacement 2 b M + 18 N; a LOSS job 2 b M + 16 N + its scratch. Not counted: the plan a
// slow reader of the previous epoch may still hold and stream buffers (bounded server-wide).
//
// Pure functions; thread-safe.
#ifndef SAMPLERD_SERVER_JOB_MEMORY_H_
#define SAMPLERD_SERVER_JOB_MEMORY_H_

#include <cstdint>
#include <string>

#include "kernels/compute_backend.h"
#include "server/job_config.h"

namespace samplerd {

struct JobMemoryEstimate {
  uint64_t plans = 0;
  uint64_t weights = 0;  // Base and epoch weights.
  uint64_t loss_stats = 0;
  uint64_t scratch = 0;  // The backend's planning scratch.
  uint64_t ranks = 0;
  uint64_t rewind = 0;  // Epoch starts kept in memory for RewindJob.

  // The spec field that drives the estimate, for error messages: "spec.samples_per_epoch" when
  // the plans weigh more than the rest and M != N, else "spec.num_samples"; and its value.
  std::string driving_field;
  uint64_t driving_value = 0;

  // The sum, saturating at UINT64_MAX.
  uint64_t total() const;
  // "plans 512.0 GiB, weights 0 B, loss statistics 0 B, planning scratch 0 B, ranks 64 B,
  // rewind 0 B".
  std::string ToString() const;
};

// The estimate for `config` planned by `backend` (see the table above); `persisted`: the job has
// a journal (--data_dir).
JobMemoryEstimate EstimateJobMemory(const JobConfig& config, const ComputeBackend& backend,
                                    bool persisted);

// The default of --max_memory_bytes: 80% of the memory this process may use, the smaller of
// the physical memory (sysconf) and the cgroup limit of its container (cgroup v2 memory.max or
// v1 memory.limit_in_bytes), so that a server in a Kubernetes pod sizes itself by the pod.
uint64_t DefaultMaxMemoryBytes();

// "549755813888 bytes (512.0 GiB)".
std::string FormatBytes(uint64_t bytes);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_MEMORY_H_
