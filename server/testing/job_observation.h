// What server tests observe of a Job, without what the timing of its background work decides
// (a persisted job's snapshots are written off the caller's thread).
#ifndef SAMPLERD_SERVER_TESTING_JOB_OBSERVATION_H_
#define SAMPLERD_SERVER_TESTING_JOB_OBSERVATION_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/job.h"

namespace samplerd {
namespace testutil {

// Everything a client can observe of `job` (its Status), but for timings and the epoch starts
// kept: which are kept depends on when the snapshots were committed (AwaitKept waits for one).
inline std::string Observable(const Job& job) {
  v1::JobStatus status = job.Status();
  status.clear_last_recompute_ms();
  status.clear_last_plan_ms();
  status.mutable_job()->clear_rewindable_epochs();
  return status.DebugString();
}

// Waits until the start of `epoch` is kept (listed by RewindableEpochs: from the moment the
// epoch is served, also for a persisted job, whose snapshot is written in the background). A
// start not kept within 30 s is a test failure.
inline void AwaitKept(const Job& job, uint64_t epoch) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    const std::vector<uint64_t> kept = job.RewindableEpochs();
    if (std::find(kept.begin(), kept.end(), epoch) != kept.end()) return;
    ASSERT_LT(absl::Now(), deadline) << "the start of epoch " << epoch << " was never kept";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_JOB_OBSERVATION_H_
