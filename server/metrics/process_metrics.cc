#include "server/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace samplerd {
namespace metrics {
namespace {

// The one series of a family without labels: the family keeps it (it is never removed).
template <typename T>
T* Only(Family<T>* family) {
  return family->WithLabels({}).get();
}

// /proc/self or /proc/<pid>.
std::string ProcDir(int pid) { return pid == 0 ? "/proc/self" : absl::StrCat("/proc/", pid); }

// A field of the process's status ("VmRSS", in kB; "Threads"); -1 if absent.
int64_t StatusField(int pid, const std::string& name) {
  std::ifstream in(ProcDir(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace());
    int64_t value = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &value)) return value;
  }
  return -1;
}

int64_t OpenFds(int pid) {
  DIR* dir = opendir((ProcDir(pid) + "/fd").c_str());
  if (dir == nullptr) return -1;
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return pid == 0 ? count - 1 : count;  // Ours counts the directory's own descriptor.
}

void AddResourceGauge(Registry& r, const char* name, const char* help,
                      int64_t ProcessResources::*field) {
  r.AddGaugeCallback(name, help, {}, [field] {
    return std::vector<GaugeSample>{{{}, static_cast<double>(ReadProcessResources().*field)}};
  });
}

}  // namespace

ProcessResources ReadProcessResources(int pid) {
  ProcessResources resources;
  if (const int64_t kib = StatusField(pid, "VmRSS"); kib >= 0) {
    resources.resident_bytes = kib * 1024;
  }
  resources.threads = StatusField(pid, "Threads");
  resources.open_fds = OpenFds(pid);
  rlimit limit{};
  if (pid == 0 && getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    resources.max_fds = static_cast<int64_t>(limit.rlim_cur);
  }
  return resources;
}

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
    AddResourceGauge(r, "samplerd_process_resident_memory_bytes",
                     "Resident memory of samplerd, in bytes.", &ProcessResources::resident_bytes);
    AddResourceGauge(r, "samplerd_process_threads", "Threads of samplerd.",
                     &ProcessResources::threads);
    AddResourceGauge(r, "samplerd_process_open_fds",
                     "Open file descriptors of samplerd (each client connection holds one).",
                     &ProcessResources::open_fds);
    AddResourceGauge(r, "samplerd_process_max_fds",
                     "Most file descriptors samplerd may open (RLIMIT_NOFILE).",
                     &ProcessResources::max_fds);
    return m;
  }();
  return *metrics;
}

}  // namespace metrics
}  // namespace samplerd
