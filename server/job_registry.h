// JobRegistry: the server's jobs by name, with the server-wide limits.
//
// Thread-safe. Jobs are shared_ptr: a call that looked a job up keeps it alive even if it is
// deleted meanwhile (its waiters are woken with NOT_FOUND). The registry lock is never held while
// a job plans or closes; it is taken before any job's lock (lock order: JobRegistry::mu_, then
// Job's locks; in practice the two are never nested).
#ifndef SAMPLERD_SERVER_JOB_REGISTRY_H_
#define SAMPLERD_SERVER_JOB_REGISTRY_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job.h"
#include "server/job_config.h"
#include "server/job_memory.h"

namespace samplerd {

class JobRegistry {
 public:
  struct Limits {
    size_t max_jobs = 64;
    JobLimits job;
    // The server's memory budget (--max_memory_bytes); default: 80% of the memory of this
    // machine or container. The sum of the jobs' estimates (server/job_memory.h) may not exceed
    // it less `serving_reserve_bytes`.
    uint64_t max_memory_bytes = DefaultMaxMemoryBytes();
    // What serving holds back from the jobs: the stream and transport buffers
    // (server/memory_budget.h). Less than max_memory_bytes.
    uint64_t serving_reserve_bytes = 0;
  };

  // `backend` must outlive the registry. With a `data_dir`, every job is persisted in
  // <data_dir>/jobs/<name>/ (see server/persistence/job_journal.h); call Recover first.
  JobRegistry(Limits limits, ComputeBackend* backend, std::string data_dir = "");
  ~JobRegistry();

  // Locks data_dir (FAILED_PRECONDITION if another samplerd holds it) and loads every job
  // persisted there (a no-op without a data_dir). On any error (a corrupt file, a spec beyond
  // this server's limits) nothing is loaded and the error names the job and file: the server
  // must not start with part of its state. Restored jobs count against the jobs' budget but are
  // never refused for it (a warning is logged when they exceed it). Call once, before any other
  // method.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // Creates a job, or returns the existing one if `spec` normalises to the same spec.
  // ALREADY_EXISTS for a different spec, INVALID_ARGUMENT for a bad name or spec, UNAVAILABLE
  // after CloseAll. RESOURCE_EXHAUSTED at max_jobs, when the job's memory estimate does not fit
  // in what the live and pending jobs leave of the jobs' budget, max_memory_bytes less the
  // serving reserve (decided from the spec before anything is allocated; the message names the
  // field that drives the estimate, the estimate, the budget and the reserve), or when an
  // allocation fails while the job is created anyway. On every error nothing is left behind: the
  // name, the max_jobs slot, the memory and the job's directory are free again. The job is planned
  // outside the registry lock; concurrent creates of one name (every rank creating the job at
  // start-up) wait for the first and share its job: one plan is computed and one max_jobs slot is
  // used. Such a wait ends at `deadline` with DEADLINE_EXCEEDED (the first call goes on). A job of
  // this name and spec that is past epoch 0 is returned only with `resume` (a run continuing it);
  // without, FAILED_PRECONDITION says to resume, rewind or delete it.
  absl::StatusOr<std::shared_ptr<Job>> Create(const std::string& name, const v1::JobSpec& spec,
                                              absl::Time deadline = absl::InfiniteFuture(),
                                              bool resume = false) ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND naming the job.
  absl::StatusOr<std::shared_ptr<Job>> Get(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

  // All jobs ordered by name.
  std::vector<std::shared_ptr<Job>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the job (and its persisted state) and wakes its waiters with NOT_FOUND. NOT_FOUND if
  // absent.
  absl::Status Delete(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiter with UNAVAILABLE and refuses new jobs (server shutdown).
  void CloseAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::string JobDir(const std::string& name) const;
  // The jobs' budget: max_memory_bytes less serving_reserve_bytes.
  uint64_t JobsBudget() const;
  // "--max_memory_bytes = B less the serving reserve R": the jobs' budget, for messages.
  std::string JobsBudgetText() const;
  // RESOURCE_EXHAUSTED unless `memory` fits in what the reserved jobs leave of the budget.
  absl::Status CheckMemory(const std::string& name, const JobMemoryEstimate& memory) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reserve(const std::string& name, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unreserve(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  ComputeBackend* const backend_;
  const std::string data_dir_;  // Empty: jobs live in memory only.
  int lock_fd_ = -1;            // Holds the flock on <data_dir>/LOCK once Recover ran.
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Jobs being created (planning epoch 0 off the lock): name -> normalised spec. Counted against
  // max_jobs; a create of a pending name waits for it.
  std::map<std::string, v1::JobSpec> pending_ ABSL_GUARDED_BY(mu_);
  // Jobs being deleted (their files removed off the lock): a create of the name waits, so that
  // the removal cannot take the new job's files.
  std::set<std::string> deleting_ ABSL_GUARDED_BY(mu_);
  // Memory estimate of every job that is live, pending or being deleted, by name, and the sum.
  std::map<std::string, uint64_t> reserved_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_REGISTRY_H_
