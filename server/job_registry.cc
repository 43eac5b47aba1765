#include "server/job_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"

namespace samplerd {
namespace {

bool SameSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

absl::Status Conflict(const std::string& name) {
  return absl::AlreadyExistsError(absl::StrCat(
      "name = \"", name, "\" is taken by a job with another spec; delete it or choose a new name"));
}

}  // namespace

JobRegistry::JobRegistry(Limits limits, ComputeBackend* backend)
    : limits_(limits), backend_(backend) {}

JobRegistry::~JobRegistry() { CloseAll(); }

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Create(const std::string& name,
                                                         const v1::JobSpec& spec,
                                                         absl::Time deadline) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) return s;
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits_.job);
  if (!config.ok()) return config.status();
  {
    absl::MutexLock lock(&mu_);
    auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || pending_.count(name) == 0;
    };
    while (true) {
      if (closed_) return absl::UnavailableError("samplerd is shutting down");
      if (auto it = jobs_.find(name); it != jobs_.end()) {
        if (SameSpec(it->second->config().normalized, config->normalized)) return it->second;
        return Conflict(name);
      }
      auto pending = pending_.find(name);
      if (pending == pending_.end()) break;
      if (!SameSpec(pending->second, config->normalized)) return Conflict(name);
      // Another call is creating this very job: wait for it, then look again (it may have
      // failed, and then this call tries itself).
      if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat("name = \"", name,
                         "\": another CreateJob of this job is still planning epoch 0; retry"));
      }
    }
    if (jobs_.size() + pending_.size() >= limits_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat("max jobs reached: ", limits_.max_jobs,
                                                       " (--max_jobs); delete a job first"));
    }
    pending_.emplace(name, config->normalized);
  }
  // Planning epoch 0 may take a while: not under the registry lock.
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(name, *std::move(config), backend_);
  std::shared_ptr<Job> shared;
  {
    absl::MutexLock lock(&mu_);
    pending_.erase(name);
    if (!job.ok()) return job.status();
    shared = *std::move(job);
    if (!closed_) {
      jobs_.emplace(name, shared);
      return shared;
    }
  }
  // CloseAll ran while this job was planned: it never becomes visible.
  shared->Close(absl::UnavailableError("samplerd is shutting down"));
  return absl::UnavailableError("samplerd is shutting down");
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Get(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job = \"", name, "\" does not exist"));
  }
  return it->second;
}

std::vector<std::shared_ptr<Job>> JobRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& [name, job] : jobs_) jobs.push_back(job);
  return jobs;
}

absl::Status JobRegistry::Delete(const std::string& name) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job = \"", name, "\" does not exist"));
    }
    job = std::move(it->second);
    jobs_.erase(it);
  }
  job->Close(absl::NotFoundError(absl::StrCat("job '", name, "' was deleted")));
  return absl::OkStatus();
}

void JobRegistry::CloseAll() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (const auto& [name, job] : jobs_) jobs.push_back(job);
  }
  for (const auto& job : jobs) job->Close(absl::UnavailableError("samplerd is shutting down"));
}

}  // namespace samplerd
