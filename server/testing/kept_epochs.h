// Waiting for a persisted job's epoch starts, for server tests that rewind a Job.
#ifndef SAMPLERD_SERVER_TESTING_KEPT_EPOCHS_H_
#define SAMPLERD_SERVER_TESTING_KEPT_EPOCHS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/job.h"

namespace samplerd {
namespace testutil {

// Waits until the start of `epoch` is kept (a journal writes snapshots in the background, so a
// persisted job keeps an epoch's start some time after the epoch opened). A start not kept
// within 30 s is a test failure.
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

#endif  // SAMPLERD_SERVER_TESTING_KEPT_EPOCHS_H_
