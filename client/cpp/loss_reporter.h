// LossReporter: reports one data-parallel rank's per-sample losses to samplerd in the background.
//
// A trainer calls Report() (host arrays) or ReportFromDevice() (device arrays, copied on the
// trainer's CUDA stream) after each step; the call copies the pairs and returns, and a background
// thread sends them in batches on ReportLosses streams through a SamplerClient. Flush() waits
// until the server has acknowledged (made durable) everything reported so far; call it before
// EndEpoch and before a checkpoint records a shard position.
//
// Exactly once: every loss carries its identity (epoch, rank, shard position) on the wire
// (LossBatch.first_position / positions in proto/samplerd.proto). A stream whose acknowledgement
// is lost (the connection drops, the server restarts) is sent again whole by the SamplerClient's
// retries (ClientOptions::retry_budget, with backoff); the server counts the positions it had
// already applied as duplicates. The same holds across a trainer restart: a new LossReporter that
// reports positions the dead process had reported gets duplicates, and the positions it never
// sent are applied. Duplicates also count a sample that already has a loss in this epoch from
// another position (drawn twice with replacement, or padding). So after a retry, `accepted` in
// counts() can be lower than what the server applied (a lost summary's accepted pairs come back
// as duplicates); accepted + duplicates + stale is always the number of pairs acknowledged.
//
// Errors:
//   * Arguments the reporter can check itself are refused at the call with INVALID_ARGUMENT
//     naming the field and the value (a NaN, infinite or negative loss; an index >= the job's
//     num_samples; indices, losses and positions of different lengths; at Create, rank >=
//     world_size). Nothing of a refused call is reported.
//   * Everything else is found later (by the server, or, for ReportFromDevice, when the copy
//     lands on the host): the reporter stops at the first such error and every later call
//     (Report, ReportAt, ReportFromDevice, Flush, Close) returns it, naming the batch (epoch,
//     positions) and carrying the server's code and message (INVALID_ARGUMENT for an index not
//     served at its position, FAILED_PRECONDITION for an epoch not open, NOT_FOUND, or
//     UNAVAILABLE once the client's retries are spent). The pairs not yet acknowledged then are
//     dropped: make a new LossReporter and report again from the last checkpointed position
//     (resending what was applied is harmless).
//
// Memory and back-pressure: at most `max_buffered_pairs` pairs are held (reported and not yet
// acknowledged: they are kept until the server's summary arrives, to be resent). A Report that
// does not fit BLOCKS until the server has acknowledged enough (or the reporter fails, which it
// then returns). ReportFromDevice blocks likewise while all of its pinned staging slots are in
// use. Memory: at most about 3 x 12 bytes (3 x 20 with positions) x max_buffered_pairs (the
// pairs, their arrays' growth, and acknowledged arrays kept for reuse so that a Report in the
// steady state only copies): ~38 MB with the defaults.
//
// Thread safety: every method is safe to call from several threads at once. Pairs one thread
// reports with Report/ReportAt are sent in the order reported; ReportFromDevice's join them when
// their copies land (the order plays no part in what the server counts). Flush waits for the pairs
// every thread reported, including those reported while it waits.
//
// Cost: a Report of 512 pairs takes ~3 us of the caller's time (bench/RESULTS.md): validation
// and one copy under the reporter's lock. Debian's libabsl is built with absl::Mutex deadlock
// detection on, which puts a process-wide spinlock into every lock of every absl::Mutex (gRPC's
// included) and raised the p99 of Report in our runs (7-17 us against 6-8 us without); a
// trainer that cares should call
// absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore) at start-up (a process
// setting, so the library does not change it).
//
// Ownership: `client` must outlive the reporter. The reporter owns its threads and buffers; the
// destructor is Close() with its status dropped.
#ifndef SAMPLERD_CLIENT_CPP_LOSS_REPORTER_H_
#define SAMPLERD_CLIENT_CPP_LOSS_REPORTER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/device_port.h"  // DeviceStream: cudaStream_t, without the CUDA headers.
#include "client/cpp/sampler_client.h"

namespace samplerd {

struct LossReporterOptions {
  // Most pairs held: reported and not yet acknowledged by the server (see back-pressure above).
  // A single Report of more pairs than this is INVALID_ARGUMENT.
  size_t max_buffered_pairs = size_t{1} << 20;
  // Most pairs in one LossBatch message, 1 to MAX_LOSS_BATCH_PAIRS. Consecutive Reports of one
  // epoch are merged into one batch up to this size.
  size_t max_batch_pairs = size_t{1} << 16;
  // Most pairs sent on one ReportLosses stream (one acknowledgement, one sync on the server).
  // Half the buffer by default, so that the next stream fills while one is in flight.
  size_t max_stream_pairs = size_t{1} << 19;
  // How long reported pairs may wait for more before a partial batch is sent (Flush sends at
  // once). Report itself never wakes the sender thread, so the sender polls at this period
  // while the reporter is idle.
  absl::Duration linger = absl::Milliseconds(5);
  // ReportFromDevice: pinned host staging slots and the pairs each holds (allocated at the first
  // ReportFromDevice; 12 bytes per pair each). A larger call uses several slots; a slot is
  // filled with at most max_buffered_pairs pairs.
  size_t device_slots = 4;
  size_t device_slot_pairs = size_t{1} << 16;
  // The rank's claim (client/cpp/rank_claim.h; must outlive the reporter), whose incarnation
  // every batch carries; null: batches are refused (FAILED_PRECONDITION) while another process
  // holds the rank. EpochLoop sets it.
  ClaimSource* claim = nullptr;
};

// What the server's summaries said about the pairs sent so far (LossReportSummary).
struct LossCounts {
  uint64_t reported = 0;      // Pairs accepted by Report/ReportAt/ReportFromDevice calls.
  uint64_t acknowledged = 0;  // Pairs the server acknowledged: accepted + duplicates + stale.
  uint64_t accepted = 0;      // Applied to the job's loss statistics.
  uint64_t duplicates = 0;    // Position (or sample, this epoch) already reported.
  uint64_t stale = 0;         // Epoch older than the job's current one: ignored.
  uint64_t batches = 0;       // LossBatch messages acknowledged.
  uint64_t streams = 0;       // ReportLosses calls that succeeded.
};

class LossReporter {
 public:
  // A reporter for data-parallel rank `rank` of `world_size` on job `job`. Asks the server for
  // the job (NOT_FOUND if it does not exist; its num_samples bounds the indices checked at each
  // call). INVALID_ARGUMENT naming the field: rank >= world_size, world_size 0 or above
  // MAX_WORLD_SIZE, option values out of range (each named with its value).
  // FAILED_PRECONDITION if the job's current epoch is dealt to another world size (elastic
  // groups: the first rank resizes the job first). Losses of the current epoch are reported in
  // its current deal (v1::Job::deal), those of later epochs in deal 0.
  static absl::StatusOr<std::unique_ptr<LossReporter>> Create(SamplerClient* client,
                                                              const std::string& job, uint32_t rank,
                                                              uint32_t world_size,
                                                              LossReporterOptions options = {});

  ~LossReporter();
  LossReporter(const LossReporter&) = delete;
  LossReporter& operator=(const LossReporter&) = delete;

  // Reports losses[k] for indices[k], served at shard position first_position + k of this rank's
  // shard of `epoch` (the usual case: a batch of consecutive positions). Copies and returns;
  // blocks only while the buffer is full. An empty call reports nothing.
  absl::Status Report(uint64_t epoch, uint64_t first_position, absl::Span<const uint64_t> indices,
                      absl::Span<const float> losses);

  // As Report, with each pair's shard position given: indices[k] was served at positions[k].
  absl::Status ReportAt(uint64_t epoch, absl::Span<const uint64_t> positions,
                        absl::Span<const uint64_t> indices, absl::Span<const float> losses);

  // As Report, for `n` pairs in device memory (d_indices: int64, as torch keeps indices). Enqueues
  // the copies into pinned host memory on `stream` (after whatever the trainer enqueued there to
  // compute the losses) and an event after them, then returns: it never synchronises `stream` or
  // the device. The reporter's device thread waits on that event alone and then reports the pairs
  // as Report would; what Report refuses at the call (a NaN loss, an index out of range) is found
  // only then and stops the reporter (the next call returns it). The arrays must stay unchanged
  // until the copies ran on `stream` (as with any cudaMemcpyAsync). Every call of one reporter
  // must use streams of one device: the device current at the first call. A call of more than
  // device_slot_pairs pairs uses several slots one after another; if an enqueue fails midway,
  // the slots enqueued before it stay reported.
  // FAILED_PRECONDITION (with the CUDA runtime's message) when no GPU is usable, and in the
  // CPU-only library (//client/cpp:trainer_cpu: client/cpp/device_port.h); the CUDA runtime's
  // error for a bad pointer or stream.
  absl::Status ReportFromDevice(uint64_t epoch, uint64_t first_position, const int64_t* d_indices,
                                const float* d_losses, size_t n, DeviceStream stream);

  // Waits until every pair reported so far is acknowledged by the server (durable where the
  // server persists), or returns the reporter's error.
  absl::Status Flush();

  // Flush, then stops the threads. Later calls return FAILED_PRECONDITION ("closed") or the
  // error that stopped the reporter. Idempotent.
  absl::Status Close();

  // Counts so far (a consistent snapshot).
  LossCounts counts() const;

 private:
  class Impl;
  explicit LossReporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_LOSS_REPORTER_H_
