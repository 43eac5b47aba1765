// ServiceMetrics: the per-job counters that SamplerService updates as it serves (what only the
// service sees: the indices it sends, the loss pairs it hands to the jobs and what became of
// them). State the jobs hold (epoch, ranks ended, memory) is read at scrape time instead
// (Server's gauges), so the jobs carry no instrumentation.
//
//   samplerd_indices_streamed_total{job_name}      shard indices sent to ranks
//   samplerd_loss_pairs_total{job_name, outcome}   (index, loss) pairs reported, by outcome:
//                                                  accepted, stale (an older epoch), duplicate
//
// The label is job_name, not job: Prometheus sets `job` (and `instance`) on every series it
// scrapes, and would rename ours to exported_job.
//
// A deleted job's series are removed (ForgetJob); a job's counters start at 0 with the process.
//
// Thread-safe.
#ifndef SAMPLERD_SERVER_SERVICE_METRICS_H_
#define SAMPLERD_SERVER_SERVICE_METRICS_H_

#include <memory>
#include <string>

#include "proto/samplerd.pb.h"
#include "server/metrics/registry.h"

namespace samplerd {

class ServiceMetrics {
 public:
  // Adds the families to `registry` (which must outlive this); with nullptr, to a registry of
  // its own that nothing exports (a service built without metrics, e.g. in tests).
  explicit ServiceMetrics(metrics::Registry* registry);

  // The counter of `job`'s streamed indices: take it once per stream.
  std::shared_ptr<metrics::Counter> IndicesStreamed(const std::string& job);
  // Counts what one ReportLosses batch of `job` added to the call's running summary.
  void CountLosses(const std::string& job, const v1::LossReportSummary& before,
                   const v1::LossReportSummary& after);
  // Removes `job`'s series (the job was deleted).
  void ForgetJob(const std::string& job);

 private:
  std::unique_ptr<metrics::Registry> own_registry_;
  metrics::Family<metrics::Counter>* const streamed_;
  metrics::Family<metrics::Counter>* const loss_pairs_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SERVICE_METRICS_H_
