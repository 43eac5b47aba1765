// The CUDA ComputeBackend (kernels/compute_backend.h): weights recomputed, losses applied and
// epochs planned on one GPU, bit-identical to the CPU backend (docs/SAMPLING.md).
//
// A job's base weights, W_e and loss statistics live in device memory between epochs
// (BackendWeights / BackendLossStats made by this backend). Applied losses are decided on the
// host at the call (a 2-byte epoch marker per sample: the first loss of a sample in an epoch
// wins) and queued in pinned batches that a device kernel applies; the queue is drained before
// anything reads the statistics. A plan is computed on the device and copied to the host once.
//
// Device errors (out of memory, a failed launch) come back as statuses carrying the CUDA error
// name and string (cuda_status.h: RESOURCE_EXHAUSTED for out of memory, INTERNAL otherwise,
// a device lost since startup included) on the call that
// met them; the backend never switches to the CPU. A loss statistics object that met a device
// error returns it from every later call (its state is unknown): the job fails with it.
//
// Concurrency: every call holds a stream of its own for its duration (a pool of lanes,
// cuda_context.h) and waits for that stream only; nothing synchronises the whole device.
//
// Device memory per sample of a job (N samples; every array comes from the device's default
// stream-ordered pool, so the pool's high-water mark is the whole truth: CudaMemoryPeaks):
//   between epochs   loss statistics 8.25 B (gpu::DeviceLossStats), W_e 4 B, base weights 4 B
//                    (if not uniform): 12.25-16.25 B.
//   RecomputeWeights + W_{e+1} 4 B while W_e is alive (the server frees W_e after the swap),
//                    + the recompute's per-chunk sums (~N / 4096 * 32 B): 16.25-20.25 B.
//   PlanEpoch        + the plan, M * 4 B (N <= 2^32; 8 B beyond), copied to the host and freed;
//                    + the kernels' scratch: without replacement M < N the selection (a bitmap
//                    of N bits and the selected M indices, then the shuffle of M), M = N the
//                    shuffle's partition (4 B per entry besides the plan, plus ~0.2 B of
//                    counts), with replacement the quantised prefix sums of blocks
//                    of 8 samples (1 B per sample) and a guide table over the blocks (~0.1 B).
//                    At M = N / 10 (the benchmark's epoch boundary) a loss-policy job with base
//                    weights peaks at ~16.25 + 0.4 + 0.125 + scratch of M: ~19 B; M = N without
//                    replacement: 16.25 + 4 + 4.2 = ~24.5 B (the shuffle; ~36 B before 2026-11-23,
//                    with CUB's radix sort); with replacement,
//                    weighted, M = N: 16.25 + 4 + 1.1 = ~21.4 B (~28 B before 2026-11-23, with the
//                    prefix sums of every sample).
//   PlanMixtureWindow  nothing per sample: per window entry the window (8 B, copied to the host
//                    and freed), its entries before the shuffle (8 B) and the shuffle's
//                    partition (~8 B), plus 40 B per group (offsets, sizes, cursors, the counts'
//                    prefix sums, uploaded); counted in CudaMemoryPeaks::plan_epoch. Not measured
//                    on a GPU yet (cuda_backend_test's MixtureWindows checks the bits).
//   Apply            0 B: the queued pairs are pinned host memory that the kernel reads
//                    directly (mapped), 2 x 3 MiB per loss statistics object (not measured:
//                    Apply allocates nothing on the device).
// Host memory besides the server's: 2 B per sample (the epoch markers of the loss statistics)
// and 16 MiB per lane (staging).
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"

namespace samplerd {

struct CudaBackendOptions {
  int device = 0;
  // At startup, the device must have at least this much free memory.
  uint64_t min_free_bytes = uint64_t{1} << 30;
};

// Checks the device (gpu_presence.h: driver, device, free memory) and makes the backend.
// FAILED_PRECONDITION naming what is missing (no driver, driver too old, no device, too little
// free memory) with the runtime's own error.
absl::StatusOr<std::unique_ptr<ComputeBackend>> NewCudaBackend(const CudaBackendOptions& options);

// Device memory of a CUDA backend's operations, in bytes: for the benchmark and the tests (not
// part of ComputeBackend). Each peak is the highest use of the device's default pool (every
// allocation of this process on that device, all jobs together) seen while an operation of that
// kind ran, since the last reset. Exact for one operation at a time; with operations running at
// once it is the peak of all of them together.
struct CudaMemoryPeaks {
  uint64_t in_use = 0;  // Now (when read), not a peak.
  uint64_t make_weights = 0;
  uint64_t new_loss_stats = 0;
  uint64_t recompute_weights = 0;
  uint64_t plan_epoch = 0;  // PlanEpoch and PlanMixtureWindow.
  uint64_t importance_weights = 0;
  uint64_t to_host = 0;  // ToHost of weights and of loss statistics.
  uint64_t restore = 0;
};

// The peaks of `backend` (nullopt if NewCudaBackend did not make it); `reset`: clears them.
std::optional<CudaMemoryPeaks> CudaMemoryPeaksOf(const ComputeBackend& backend, bool reset);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_
