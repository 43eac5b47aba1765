#include "server/service_metrics.h"

namespace samplerd {
namespace {

constexpr const char* kOutcomes[] = {"accepted", "stale", "duplicate"};

}  // namespace

ServiceMetrics::ServiceMetrics(metrics::Registry* registry)
    : own_registry_(registry == nullptr ? std::make_unique<metrics::Registry>() : nullptr),
      streamed_((registry != nullptr ? registry : own_registry_.get())
                    ->AddCounter("samplerd_indices_streamed_total",
                                 "Shard indices sent to ranks by StreamShard.", {"job_name"})),
      loss_pairs_((registry != nullptr ? registry : own_registry_.get())
                      ->AddCounter("samplerd_loss_pairs_total",
                                   "(index, loss) pairs reported by ReportLosses, by outcome: "
                                   "accepted, stale (an older epoch's), duplicate (already "
                                   "applied).",
                                   {"job_name", "outcome"})) {}

std::shared_ptr<metrics::Counter> ServiceMetrics::IndicesStreamed(const std::string& job) {
  return streamed_->WithLabels({job});
}

void ServiceMetrics::CountLosses(const std::string& job, const v1::LossReportSummary& before,
                                 const v1::LossReportSummary& after) {
  const uint64_t added[] = {after.accepted() - before.accepted(), after.stale() - before.stale(),
                            after.duplicates() - before.duplicates()};
  for (int i = 0; i < 3; ++i) {
    // Series are created by their first pair, so a job's outcomes all appear together.
    loss_pairs_->WithLabels({job, kOutcomes[i]})->Increment(static_cast<double>(added[i]));
  }
}

void ServiceMetrics::ForgetJob(const std::string& job) {
  streamed_->Remove({job});
  for (const char* outcome : kOutcomes) loss_pairs_->Remove({job, outcome});
}

}  // namespace samplerd
