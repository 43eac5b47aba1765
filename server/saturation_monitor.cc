#include "server/saturation_monitor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "server/log_fields.h"

namespace samplerd {

std::string SaturationMonitor::Saturation(const metrics::ProcessResources& process,
                                          const WorkPool::Load& handlers, int max_handler_threads,
                                          const Limits& limits) {
  if (process.max_fds > 0 && process.open_fds >= 0 &&
      process.max_fds - process.open_fds < limits.fd_reserve) {
    return absl::StrCat("file descriptors: ", process.open_fds, " of ", process.max_fds,
                        " open (fewer than ", limits.fd_reserve,
                        " left for new connections; raise RLIMIT_NOFILE)");
  }
  if (handlers.queued > 0 && handlers.oldest_queued >= limits.max_queue_wait) {
    return absl::StrCat("handler threads: ", handlers.busy, " of ", max_handler_threads,
                        " busy and work has waited ", absl::FormatDuration(handlers.oldest_queued),
                        " for one (", handlers.queued,
                        " queued; a blocked disk, or raise --max_server_threads)");
  }
  return "";
}

SaturationMonitor::SaturationMonitor(std::function<WorkPool::Load()> handlers,
                                     int max_handler_threads, std::function<void(bool)> set_serving,
                                     metrics::Registry* registry, Limits limits)
    : handlers_(std::move(handlers)),
      max_handler_threads_(max_handler_threads),
      set_serving_(std::move(set_serving)),
      limits_(limits),
      saturated_(registry
                     ->AddGauge("samplerd_saturated",
                                "1 while samplerd cannot take the calls that open an epoch (no "
                                "file descriptor left, or its handler threads blocked); its "
                                "health status is NOT_SERVING meanwhile.")
                     ->WithLabels({})),
      thread_([this] { Run(); }) {}

SaturationMonitor::~SaturationMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SaturationMonitor::Run() {
  std::string reason;  // Why saturated now; "" while not.
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), limits_.period)) {
    std::string now =
        Saturation(metrics::ReadProcessResources(), handlers_(), max_handler_threads_, limits_);
    if (now.empty() == reason.empty()) {
      reason = std::move(now);
      continue;
    }
    if (!now.empty()) {
      LOG(WARNING) << "event=saturated health=NOT_SERVING reason=" << LogValue(now);
    } else {
      LOG(INFO) << "event=saturation_cleared health=SERVING";
    }
    saturated_->Set(now.empty() ? 0 : 1);
    set_serving_(now.empty());
    reason = std::move(now);
  }
}

}  // namespace samplerd
