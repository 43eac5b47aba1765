#include "server/job_registry.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/log_fields.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

bool SameSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// The same spec but for its world size: a group restarted with another size (ResizeJob).
bool SameSpecButWorldSize(const v1::JobSpec& a, v1::JobSpec b) {
  b.set_world_size(a.world_size());
  return SameSpec(a, b);
}

absl::Status Conflict(const std::string& name) {
  return absl::AlreadyExistsError(absl::StrCat(
      "name = \"", name, "\" is taken by a job with another spec; delete it or choose a new name"));
}

}  // namespace

JobRegistry::JobRegistry(Limits limits, ComputeBackend* backend, std::string data_dir)
    : limits_(limits), backend_(backend), data_dir_(std::move(data_dir)) {}

std::string JobRegistry::JobDir(const std::string& name) const {
  return absl::StrCat(data_dir_, "/jobs/", name);
}

uint64_t JobRegistry::JobsBudget() const {
  return limits_.max_memory_bytes > limits_.serving_reserve_bytes
             ? limits_.max_memory_bytes - limits_.serving_reserve_bytes
             : 0;
}

std::string JobRegistry::JobsBudgetText() const {
  return absl::StrCat("--max_memory_bytes = ", FormatBytes(limits_.max_memory_bytes),
                      " less the serving reserve of ", FormatBytes(limits_.serving_reserve_bytes),
                      " (stream and transport buffers)");
}

absl::Status JobRegistry::CheckMemory(const std::string& name,
                                      const JobMemoryEstimate& memory) const {
  const uint64_t budget = JobsBudget();
  const uint64_t left = budget > reserved_total_ ? budget - reserved_total_ : 0;
  const uint64_t need = memory.total();
  if (need <= left) return absl::OkStatus();
  const std::string& field = memory.driving_field;
  return absl::ResourceExhaustedError(
      absl::StrCat(field, " = ", memory.driving_value, ": job '", name, "' needs an estimated ",
                   FormatBytes(need), " of memory (", memory.ToString(), "), more than the ",
                   FormatBytes(left), " left of the jobs' budget, ", JobsBudgetText(), " (",
                   reserved_.size(), " job(s) hold ", FormatBytes(reserved_total_), "); lower ",
                   field, ", delete a job or raise --max_memory_bytes"));
}

void JobRegistry::Reserve(const std::string& name, uint64_t bytes) {
  reserved_[name] = bytes;
  reserved_total_ += bytes;
}

void JobRegistry::Unreserve(const std::string& name) {
  auto it = reserved_.find(name);
  if (it == reserved_.end()) return;
  reserved_total_ -= it->second;
  reserved_.erase(it);
}

absl::Status JobRegistry::Recover() {
  if (data_dir_.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  uint64_t records = 0;  // Log records replayed, over all jobs.
  namespace fs = std::filesystem;
  const fs::path jobs_dir = fs::path(data_dir_) / "jobs";
  std::error_code ec;
  fs::create_directories(jobs_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data_dir = \"", data_dir_, "\": cannot create ", jobs_dir.string(), ": ", ec.message()));
  }
  // The directories themselves must be durable before a job in them is acknowledged.
  for (const fs::path& dir : {fs::absolute(data_dir_).parent_path(), fs::path(data_dir_)}) {
    if (absl::Status s = SyncDirectory(dir.string()); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("data_dir = \"", data_dir_, "\": ", s.message()));
    }
  }
  // One samplerd per data_dir: two writing the same logs would corrupt them. The lock goes with
  // the process (flock), also when it is killed.
  const std::string lock_path = (fs::path(data_dir_) / "LOCK").string();
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data_dir = \"", data_dir_, "\": cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir = \"", data_dir_, "\" is in use by another samplerd (", lock_path,
                     " is locked); give each server its own data_dir"));
  }
  lock_fd_ = lock_fd;
  // Only directories named like jobs are jobs. Anything else is skipped and left alone, never
  // a reason to keep every job down: a fresh ext4 volume mounted at data_dir has lost+found, and
  // an operator may park a file or a directory there.
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(jobs_dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_error;
    if (!entry.is_directory(type_error)) {
      LOG(WARNING) << "data_dir: skipping " << entry.path().string()
                   << ": not a job directory (not a directory)";
      continue;
    }
    if (absl::Status s = ValidateJobName(name); !s.ok()) {
      LOG(WARNING) << "data_dir: skipping " << entry.path().string() << ": not a job directory ("
                   << s.message() << ")";
      continue;
    }
    names.push_back(name);
  }
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data_dir = \"", data_dir_, "\": cannot list ", jobs_dir.string(), ": ", ec.message()));
  }
  std::map<std::string, std::shared_ptr<Job>> recovered;
  for (const std::string& name : names) {
    auto context = [&](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat("recovering job '", name, "' from ", JobDir(name),
                                                 ": ", s.message()));
    };
    absl::StatusOr<JobJournal::Recovered> journal = JobJournal::Recover(JobDir(name));
    if (absl::IsNotFound(journal.status())) {  // No job: never acknowledged, or not a job's.
      LOG(WARNING) << "data_dir: skipping " << journal.status().message();  // It names the dir.
      continue;
    }
    if (!journal.ok()) return context(journal.status());
    v1::JobSpec spec;
    if (!spec.ParseFromString(journal->snapshot.header.spec())) {
      return context(absl::DataLossError("the snapshot's spec is malformed"));
    }
    absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits_.job);
    if (!config.ok()) {
      return context(absl::FailedPreconditionError(absl::StrCat(
          "its spec does not fit this server's limits (", config.status().message(), ")")));
    }
    records += journal->records.size();
    absl::StatusOr<std::unique_ptr<Job>> job =
        Job::Restore(name, *std::move(config), backend_, *std::move(journal));
    if (!job.ok()) return context(job.status());
    recovered.emplace(name, *std::move(job));
  }
  absl::MutexLock lock(&mu_);
  for (auto& [name, job] : recovered) {
    // Restored whatever the budget: refusing them would lose acknowledged state.
    Reserve(name, EstimateJobMemory(job->config(), *backend_, !data_dir_.empty()).total());
    jobs_.emplace(name, std::move(job));
  }
  if (reserved_total_ > JobsBudget()) {
    LOG(WARNING) << "the " << jobs_.size() << " job(s) restored from " << data_dir_
                 << " need an estimated " << FormatBytes(reserved_total_)
                 << ", more than the jobs' budget, " << JobsBudgetText()
                 << "; no new job fits until some are deleted";
  }
  LOG(INFO) << "event=recovered data_dir=" << LogValue(data_dir_) << " jobs=" << jobs_.size()
            << " records=" << records << " ms=" << absl::ToInt64Milliseconds(absl::Now() - start);
  return absl::OkStatus();
}

JobRegistry::~JobRegistry() {
  CloseAll();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // Releases the data_dir lock.
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Create(const std::string& name,
                                                         const v1::JobSpec& spec,
                                                         absl::Time deadline, bool resume) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) return s;
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits_.job);
  if (!config.ok()) return config.status();
  const JobMemoryEstimate memory = EstimateJobMemory(*config, *backend_, !data_dir_.empty());
  {
    absl::MutexLock lock(&mu_);
    auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || (pending_.count(name) == 0 && deleting_.count(name) == 0);
    };
    while (true) {
      if (closed_) return absl::UnavailableError("samplerd is shutting down");
      if (auto it = jobs_.find(name); it != jobs_.end()) {
        const v1::JobSpec& existing = it->second->config().normalized;
        if (!SameSpec(existing, config->normalized)) {
          if (!SameSpecButWorldSize(existing, config->normalized)) return Conflict(name);
          if (!resume) {
            return absl::AlreadyExistsError(absl::StrCat(
                "name = \"", name, "\" is taken by a job with spec.world_size = ",
                existing.world_size(), " and otherwise the same spec; a group restarted with ",
                config->normalized.world_size(),
                " ranks resumes it (CreateJob with resume = "
                "true) and its first rank resizes it (ResizeJob)"));
          }
          return it->second;
        }
        // Lock order: the registry's mu_, then the job's.
        const uint64_t epoch = it->second->CurrentEpoch();
        if (epoch == 0 || resume) return it->second;
        // Every rank creates the job at start-up, so epoch 0 is idempotent; past it, this is a
        // script run again against a job that already trained.
        return absl::FailedPreconditionError(absl::StrCat(
            "name = \"", name, "\": the job exists and is at epoch ", epoch,
            ": resume it (CreateJob with resume = true; Python: create_job(..., resume=True)), "
            "rewind it (RewindJob to one of its kept epoch starts) or delete it (DeleteJob)"));
      }
      auto pending = pending_.find(name);
      if (pending == pending_.end() && deleting_.count(name) == 0) break;
      if (pending != pending_.end() && !SameSpec(pending->second, config->normalized)) {
        return Conflict(name);
      }
      // Another call is creating this very job: wait for it, then look again (it may have
      // failed, and then this call tries itself).
      if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat("name = \"", name,
                         "\": another CreateJob or DeleteJob of this name is in progress; retry"));
      }
    }
    if (jobs_.size() + pending_.size() >= limits_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat("max jobs reached: ", limits_.max_jobs,
                                                       " (--max_jobs); delete a job first"));
    }
    if (absl::Status s = CheckMemory(name, memory); !s.ok()) return s;
    pending_.emplace(name, config->normalized);
    Reserve(name, memory.total());
  }
  // Planning epoch 0 (and writing its snapshot) may take a while: not under the registry lock.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Job>> job;
  try {
    std::unique_ptr<JobJournal> journal;
    if (!data_dir_.empty()) {
      absl::StatusOr<std::unique_ptr<JobJournal>> created = JobJournal::Create(JobDir(name));
      if (created.ok())
        journal = *std::move(created);
      else
        job = created.status();
    }
    if (data_dir_.empty() || journal != nullptr) {
      job = Job::Create(name, *std::move(config), backend_, std::move(journal));
    }
  } catch (const std::bad_alloc&) {
    // The estimate fitted the budget but the machine had less (other processes, overcommit
    // refused): the partly built job was destroyed on the way here; its files go too.
    job = absl::ResourceExhaustedError(
        absl::StrCat("job '", name, "': out of memory while creating it (estimated ",
                     FormatBytes(memory.total()), "; the jobs' budget, ", JobsBudgetText(),
                     ", may exceed what this machine has free); nothing was created"));
    if (!data_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(JobDir(name), ec);
      if (ec) LOG(WARNING) << "cannot remove " << JobDir(name) << ": " << ec.message();
    }
  }
  std::shared_ptr<Job> shared;
  bool visible = false;
  {
    absl::MutexLock lock(&mu_);
    pending_.erase(name);
    if (!job.ok()) {
      Unreserve(name);
      return job.status();
    }
    shared = *std::move(job);
    visible = !closed_;
    if (visible) {
      jobs_.emplace(name, shared);
    } else {
      Unreserve(name);
    }
  }
  if (visible) {  // Logged off the registry lock.
    const v1::JobSpec& normalized = shared->config().normalized;
    LOG(INFO) << "event=job_created job=" << name << " num_samples=" << normalized.num_samples()
              << " world_size=" << normalized.world_size()
              << " samples_per_epoch=" << shared->config().plan.samples_per_epoch
              << " base=" << v1::BasePolicy_Name(normalized.policy().base())
              << " loss=" << v1::LossPolicy_Name(normalized.policy().loss())
              << " memory_bytes=" << memory.total()
              << " persisted=" << (data_dir_.empty() ? "false" : "true")
              << " ms=" << absl::ToInt64Milliseconds(absl::Now() - start);
    return shared;
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
    deleting_.insert(name);
  }
  job->Close(absl::NotFoundError(absl::StrCat("job '", name, "' was deleted")));
  absl::Status removed = job->RemovePersistedState();
  {
    absl::MutexLock lock(&mu_);
    deleting_.erase(name);
    Unreserve(name);
  }
  LOG(INFO) << "event=job_deleted job=" << name
            << " files_removed=" << (removed.ok() ? "true" : "false");
  if (absl::Status s = std::move(removed); !s.ok()) {
    // The job is gone from this server either way; its files would come back at a restart.
    return absl::Status(s.code(), absl::StrCat("job '", name,
                                               "' was deleted but its files were "
                                               "not all removed: ",
                                               s.message()));
  }
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
