// SaturationMonitor: says, through the gRPC health status, when samplerd cannot take the calls
// that open an epoch (EndEpoch, and the StreamShard calls that follow it).
//
// With the callback API no number of waiting ranks starves EndEpoch (sampler_service.h); what
// still can: no file descriptor left for a rank's new connection, or the handler threads all
// blocked (a disk that stopped answering fsync) so that work waits in their queue. Every
// `period` the monitor looks at both; when one passes its limit it sets the health status of
// every service NOT_SERVING (a load balancer or a Kubernetes readiness probe then sends no new
// ranks, an operator's alert on samplerd_saturated fires) and logs event=saturated with the
// reason; when both are back under their limits it sets SERVING again and logs
// event=saturation_cleared. Calls are still served meanwhile: NOT_SERVING is a signal, not a
// refusal.
//
// Thread-safe; one thread of its own, stopped by the destructor.
#ifndef SAMPLERD_SERVER_SATURATION_MONITOR_H_
#define SAMPLERD_SERVER_SATURATION_MONITOR_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/process_metrics.h"
#include "server/metrics/registry.h"
#include "server/work_pool.h"

namespace samplerd {

class SaturationMonitor {
 public:
  struct Limits {
    // Saturated while fewer descriptors than this are left under RLIMIT_NOFILE.
    int64_t fd_reserve = 64;
    // Saturated while the oldest work in the handler queue has waited this long.
    absl::Duration max_queue_wait = absl::Seconds(5);
    absl::Duration period = absl::Seconds(1);
  };

  // Why the server is saturated with these readings ("" if it is not), e.g. "file descriptors:
  // 19990 of 20000 open (fewer than 64 left for new connections; raise RLIMIT_NOFILE)".
  static std::string Saturation(const metrics::ProcessResources& process,
                                const WorkPool::Load& handlers, int max_handler_threads,
                                const Limits& limits);

  // `handlers` reads the WorkPool's load, `set_serving` sets the health status; both are called
  // from the monitor's thread and must outlive it. The gauge samplerd_saturated goes to
  // `registry` (which must outlive this).
  SaturationMonitor(std::function<WorkPool::Load()> handlers, int max_handler_threads,
                    std::function<void(bool serving)> set_serving, metrics::Registry* registry,
                    Limits limits);
  SaturationMonitor() = delete;
  // Stops the thread; the health status stays as it was last set.
  ~SaturationMonitor();

  SaturationMonitor(const SaturationMonitor&) = delete;
  SaturationMonitor& operator=(const SaturationMonitor&) = delete;

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<WorkPool::Load()> handlers_;
  const int max_handler_threads_;
  const std::function<void(bool)> set_serving_;
  const Limits limits_;
  std::shared_ptr<metrics::Gauge> saturated_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: started once the rest is set.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SATURATION_MONITOR_H_
