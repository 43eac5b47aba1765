#include "server/metrics/process_metrics.h"

namespace samplerd {
namespace metrics {
namespace {

// The one series of a family without labels: the family keeps it (it is never removed).
template <typename T>
T* Only(Family<T>* family) {
  return family->WithLabels({}).get();
}

}  // namespace

const ProcessMetrics& Process() {
  static const ProcessMetrics* const metrics = [] {
    Registry& r = Registry::Default();
    auto* m = new ProcessMetrics;
    m->recompute_seconds = Only(r.AddHistogram(
        "samplerd_epoch_recompute_seconds",
        "Weight recompute at an epoch boundary (W_e to W_e+1 from the losses), in seconds.", {}));
    m->plan_seconds = Only(r.AddHistogram("samplerd_epoch_plan_seconds",
                                          "Planning of an epoch's index list, in seconds.", {}));
    m->snapshot_write_seconds = Only(r.AddHistogram("samplerd_snapshot_write_seconds",
                                                    "Writing a snapshot file, in seconds.", {}));
    m->snapshot_commit_seconds = Only(r.AddHistogram(
        "samplerd_snapshot_commit_seconds",
        "Making a written snapshot durable and current (fsync, rename, directory sync), in "
        "seconds.",
        {}));
    m->wal_bytes = Only(r.AddCounter("samplerd_wal_bytes_total",
                                     "Bytes appended to the write-ahead logs of all jobs."));
    m->wal_fsync_seconds = Only(r.AddHistogram(
        "samplerd_wal_fsync_seconds",
        "One fdatasync of a write-ahead log (a ReportLosses or EndEpoch waits for it), in "
        "seconds.",
        {}));
    return m;
  }();
  return *metrics;
}

}  // namespace metrics
}  // namespace samplerd
