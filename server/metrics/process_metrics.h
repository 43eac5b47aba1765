// The process-wide instruments: those of modules that no single Server owns (the epoch
// planner, the persistence layer), in metrics::Registry::Default(). One home for their names
// (docs/OPERATIONS.md lists them).
//
// Process() registers every family on its first call, so they are exported (at 0) from the
// start; Server::Create calls it. Thread-safe.
#ifndef SAMPLERD_SERVER_METRICS_PROCESS_METRICS_H_
#define SAMPLERD_SERVER_METRICS_PROCESS_METRICS_H_

#include <cstdint>

#include "server/metrics/registry.h"

namespace samplerd {
namespace metrics {

struct ProcessMetrics {
  // Epoch boundaries (server/epoch_planner.cc): the weight recompute W_e -> W_{e+1}, and the
  // planning of an epoch's index list.
  Histogram* recompute_seconds;
  Histogram* plan_seconds;
  // Snapshots (server/persistence/snapshot.cc): writing the file, then making it durable and
  // visible (fsync, rename, directory sync).
  Histogram* snapshot_write_seconds;
  Histogram* snapshot_commit_seconds;
  // Write-ahead logs (server/persistence/record_log.cc): bytes appended, and each fdatasync.
  Counter* wal_bytes;
  Histogram* wal_fsync_seconds;
};

const ProcessMetrics& Process();

// A process's resources now, from /proc (Linux); -1 where unreadable. `pid` 0: this process
// (and max_fds from getrlimit); another process's max_fds is -1.
// Process() exports them as gauges:
//   samplerd_process_resident_memory_bytes, samplerd_process_threads, samplerd_process_open_fds,
//   samplerd_process_max_fds.
struct ProcessResources {
  int64_t resident_bytes = -1;
  int64_t threads = -1;
  int64_t open_fds = -1;
  int64_t max_fds = -1;  // RLIMIT_NOFILE's soft limit.
};
ProcessResources ReadProcessResources(int pid = 0);

}  // namespace metrics
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METRICS_PROCESS_METRICS_H_
