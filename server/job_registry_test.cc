// The registry on its own: idempotent creation, limits, deletion and shutdown, with races.
#include "server/job_registry.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/testing/gated_backend.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(uint64_t n, uint32_t world = 1) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(world);
  return spec;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
};

TEST_F(JobRegistryTest, CreateIsIdempotentAndBounded) {
  JobRegistry registry(JobRegistry::Limits{2, JobLimits()}, backend_.get());
  auto a = registry.Create("a", Spec(10));
  ASSERT_TRUE(a.ok());
  auto again = registry.Create("a", Spec(10));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(a->get(), again->get());
  auto conflict = registry.Create("a", Spec(11));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()), HasSubstr("name = \"a\""));
  ASSERT_TRUE(registry.Create("b", Spec(10)).ok());
  auto full = registry.Create("c", Spec(10));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("--max_jobs"));
  // At the limit an existing job is still returned (idempotence beats the limit).
  EXPECT_TRUE(registry.Create("a", Spec(10)).ok());
  // A bad spec is INVALID_ARGUMENT whatever the limit.
  EXPECT_EQ(registry.Create("c", Spec(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRegistryTest, AGroupOfAnotherSizeResumesTheJob) {
  JobRegistry registry(JobRegistry::Limits{2, JobLimits()}, backend_.get());
  auto a = registry.Create("a", Spec(10, 4));
  ASSERT_TRUE(a.ok());
  // Without resume: the message says how a restarted group of 2 goes on.
  auto fresh = registry.Create("a", Spec(10, 2));
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(fresh.status().message()),
              HasSubstr("spec.world_size = 4 and otherwise the same spec; a group restarted with 2 "
                        "ranks resumes it (CreateJob with resume = true) and its first rank "
                        "resizes it (ResizeJob)"));
  auto resumed = registry.Create("a", Spec(10, 2), absl::InfiniteFuture(), /*resume=*/true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->get(), a->get());
  EXPECT_EQ((*resumed)->Describe().world_size(), 4u);  // Unchanged until ResizeJob.
  // Any other difference is still a conflict, resume or not.
  v1::JobSpec other = Spec(10, 2);
  other.set_seed(3);
  EXPECT_EQ(registry.Create("a", other, absl::InfiniteFuture(), true).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(JobRegistryTest, DeleteWakesWaitersAndFreesTheSlot) {
  JobRegistry registry(JobRegistry::Limits{1, JobLimits()}, backend_.get());
  auto a = registry.Create("a", Spec(10));
  ASSERT_TRUE(a.ok());
  absl::Notification woken;
  ASSERT_NE((*a)->OnEpochSettled(1, absl::Now() + absl::Seconds(10), [&] { woken.Notify(); }), 0u);
  ASSERT_TRUE(registry.Delete("a").ok());
  woken.WaitForNotification();
  EXPECT_EQ((*a)->AcquireShard(1, 0, 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Delete("a").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Create("c", Spec(10)).ok());
}

TEST_F(JobRegistryTest, ListIsOrderedByName) {
  JobRegistry registry(JobRegistry::Limits(), backend_.get());
  for (const char* name : {"m", "a", "z", "b"}) ASSERT_TRUE(registry.Create(name, Spec(5)).ok());
  std::vector<std::string> names;
  for (const auto& job : registry.List()) names.push_back(job->name());
  EXPECT_THAT(names, ::testing::ElementsAre("a", "b", "m", "z"));
}

TEST_F(JobRegistryTest, ConcurrentCreatesOfOneNameYieldOneJob) {
  JobRegistry registry(JobRegistry::Limits{4, JobLimits()}, backend_.get());
  constexpr int kThreads = 8;
  std::vector<Job*> got(kThreads, nullptr);
  std::vector<absl::StatusCode> codes(kThreads);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      // Half ask for one spec, half for another spec: exactly one spec wins the name.
      auto job = registry.Create("x", Spec(t % 2 == 0 ? 1000 : 2000));
      codes[t] = job.status().code();
      if (job.ok()) got[t] = job->get();
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  Job* winner = (*registry.Get("x")).get();
  const uint64_t n = winner->config().plan.num_samples;
  for (int t = 0; t < kThreads; ++t) {
    const bool same_spec = (t % 2 == 0 ? 1000u : 2000u) == n;
    EXPECT_EQ(codes[t], same_spec ? absl::StatusCode::kOk : absl::StatusCode::kAlreadyExists);
    if (same_spec) {
      EXPECT_EQ(got[t], winner);
    }
  }
  EXPECT_EQ(registry.List().size(), 1u);
}

TEST_F(JobRegistryTest, AWaitForAConcurrentCreateEndsAtItsDeadline) {
  testutil::GatedBackend gated(backend_.get());
  JobRegistry registry(JobRegistry::Limits(), &gated);
  gated.Hold();
  absl::StatusOr<std::shared_ptr<Job>> first;
  std::thread creator([&] { first = registry.Create("x", Spec(100)); });
  gated.AwaitHeldCall();  // The first call is planning epoch 0.
  const absl::Status waited =
      registry.Create("x", Spec(100), absl::Now() + absl::Milliseconds(50)).status();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("name = \"x\""));
  gated.Release();
  creator.join();
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = registry.Create("x", Spec(100), absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), first->get());
}

TEST_F(JobRegistryTest, CloseAllRefusesNewJobsAndWakesWaitersWithUnavailable) {
  JobRegistry registry(JobRegistry::Limits(), backend_.get());
  auto a = registry.Create("a", Spec(10, 2));
  ASSERT_TRUE(a.ok());
  absl::Notification woken;
  ASSERT_NE((*a)->OnEpochSettled(1, absl::Now() + absl::Seconds(10), [&] { woken.Notify(); }), 0u);
  registry.CloseAll();
  woken.WaitForNotification();
  EXPECT_EQ((*a)->AcquireShard(1, 0, 0, 2).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry.Create("b", Spec(10)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*a)->EndEpoch(0, 0, 0).status().code(), absl::StatusCode::kUnavailable);
}

// ---- Memory admission ---------------------------------------------------------------------

// The spec: one sample drawn 2^36 times per epoch, a 256 GiB plan.
v1::JobSpec Unallocatable() {
  v1::JobSpec spec = Spec(1);
  spec.set_samples_per_epoch(uint64_t{1} << 36);
  spec.set_replacement(true);
  return spec;
}

// A backend whose PlanEpoch throws std::bad_alloc while `fail` is set: an allocation that fails
// although the job's estimate fitted the budget.
class FailingAllocationBackend : public testutil::GatedBackend {
 public:
  using GatedBackend::GatedBackend;
  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 const BackendWeights* weights) override {
    if (fail) throw std::bad_alloc();
    return GatedBackend::PlanEpoch(spec, epoch, weights);
  }
  std::atomic<bool> fail{true};
};

class MemoryAdmissionTest : public JobRegistryTest {
 protected:
  static std::vector<std::string> Dirs(const std::string& jobs_dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(jobs_dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // 2^20 draws with replacement from 1000 samples: two 4 MiB plans.
  static v1::JobSpec EightMiBSpec() {
    v1::JobSpec spec = Spec(1000);
    spec.set_samples_per_epoch(1 << 20);
    spec.set_replacement(true);
    return spec;
  }

  uint64_t EstimateOf(const v1::JobSpec& spec) const {
    return EstimateJobMemory(*MakeJobConfig(spec, JobLimits()), *backend_, false).total();
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path();
};

// Issue 9, defect 1: three such creates used to throw out of the registry (UNKNOWN), each
// leaking its name, a max_jobs slot and an empty job directory.
TEST_F(MemoryAdmissionTest, AJobOverTheBudgetIsRefusedBeforeAnythingIsAllocated) {
  JobRegistry::Limits limits{3, JobLimits()};
  limits.max_memory_bytes = uint64_t{1} << 30;
  JobRegistry registry(limits, backend_.get(), dir_);
  ASSERT_TRUE(registry.Recover().ok());
  for (const std::string name : {"big", "big", "big2"}) {
    const absl::Status s = registry.Create(name, Unallocatable()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("spec.samples_per_epoch = 68719476736"));
    // 2 plans of 2^36 4-byte indices, one bit per position (PositionSet), 64 B for the rank.
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("needs an estimated 558345748544 bytes (520.0 GiB)"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("--max_memory_bytes = 1073741824 bytes (1.0 GiB)"));
  }
  EXPECT_TRUE(registry.List().empty());
  EXPECT_TRUE(Dirs(dir_ + "/jobs").empty());
  EXPECT_EQ(registry.Delete("big").code(), absl::StatusCode::kNotFound);
  // Every slot and both names are free.
  EXPECT_TRUE(registry.Create("big", Spec(10)).ok());
  EXPECT_TRUE(registry.Create("big2", Spec(10)).ok());
  EXPECT_TRUE(registry.Create("third", Spec(10)).ok());
  EXPECT_THAT(Dirs(dir_ + "/jobs"), ::testing::ElementsAre("big", "big2", "third"));
}

TEST_F(MemoryAdmissionTest, TheBudgetIsSharedByLiveJobsAndFreedByDelete) {
  const v1::JobSpec spec = EightMiBSpec();
  const uint64_t each = EstimateOf(spec);  // 8 MiB + 64.
  JobRegistry::Limits limits{8, JobLimits()};
  limits.max_memory_bytes = 2 * each + each / 2;
  JobRegistry registry(limits, backend_.get());
  ASSERT_TRUE(registry.Create("a", spec).ok());
  ASSERT_TRUE(registry.Create("b", spec).ok());
  const absl::Status full = registry.Create("c", spec).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("spec.samples_per_epoch = 1048576"));
  EXPECT_THAT(std::string(full.message()), HasSubstr("2 job(s) hold"));
  EXPECT_THAT(std::string(full.message()), HasSubstr("plans 8.0 MiB"));
  // An existing job is returned whatever the budget (it is already counted).
  EXPECT_TRUE(registry.Create("a", spec).ok());
  ASSERT_TRUE(registry.Delete("a").ok());
  EXPECT_TRUE(registry.Create("c", spec).ok());
}

// Issue 22: the stream and transport buffers are taken from --max_memory_bytes before any job.
TEST_F(MemoryAdmissionTest, TheServingReserveIsTakenFromTheBudget) {
  const v1::JobSpec spec = EightMiBSpec();
  const uint64_t each = EstimateOf(spec);  // 8 MiB + 64.
  JobRegistry::Limits limits{8, JobLimits()};
  limits.max_memory_bytes = 2 * each;  // Two jobs, without the reserve.
  limits.serving_reserve_bytes = each / 2;
  JobRegistry registry(limits, backend_.get());
  ASSERT_TRUE(registry.Create("a", spec).ok());
  const absl::Status full = registry.Create("b", spec).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("left of the jobs' budget, --max_memory_bytes = " + FormatBytes(2 * each) +
                        " less the serving reserve of " + FormatBytes(each / 2)));
  ASSERT_TRUE(registry.Delete("a").ok());
  EXPECT_TRUE(registry.Create("b", spec).ok());
}

TEST_F(MemoryAdmissionTest, AnAllocationFailureFreesTheNameTheSlotAndTheDirectory) {
  FailingAllocationBackend failing(backend_.get());
  JobRegistry::Limits limits{3, JobLimits()};
  limits.max_memory_bytes = ~uint64_t{0};  // Admitted: the allocation itself fails.
  JobRegistry registry(limits, &failing, dir_);
  ASSERT_TRUE(registry.Recover().ok());
  for (const std::string name : {"a", "a", "b"}) {
    const absl::Status s = registry.Create(name, Spec(10)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("job '" + name + "': out of memory"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("nothing was created"));
  }
  EXPECT_TRUE(registry.List().empty());
  EXPECT_TRUE(Dirs(dir_ + "/jobs").empty());
  failing.fail = false;
  EXPECT_TRUE(registry.Create("a", Spec(10)).ok());
  EXPECT_TRUE(registry.Create("b", Spec(10)).ok());
  EXPECT_TRUE(registry.Create("c", Spec(10)).ok());
  EXPECT_THAT(Dirs(dir_ + "/jobs"), ::testing::ElementsAre("a", "b", "c"));
}

TEST_F(MemoryAdmissionTest, RestoredJobsCountButAreNeverRefused) {
  {
    JobRegistry registry(JobRegistry::Limits{8, JobLimits()}, backend_.get(), dir_);
    ASSERT_TRUE(registry.Recover().ok());
    ASSERT_TRUE(registry.Create("a", Spec(1000)).ok());
  }
  JobRegistry::Limits limits{8, JobLimits()};
  limits.max_memory_bytes = 100;  // Less than job a alone.
  JobRegistry registry(limits, backend_.get(), dir_);
  ASSERT_TRUE(registry.Recover().ok());
  EXPECT_EQ(registry.List().size(), 1u);
  const absl::Status s = registry.Create("b", Spec(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("1 job(s) hold"));
}

// ---- Persistence (--data_dir) -------------------------------------------------------------

class PersistentRegistryTest : public JobRegistryTest {
 protected:
  std::unique_ptr<JobRegistry> Open(uint64_t max_samples = uint64_t{1} << 32) {
    return std::make_unique<JobRegistry>(JobRegistry::Limits{8, JobLimits{max_samples}},
                                         backend_.get(), dir_);
  }

  static std::vector<std::string> Names(const JobRegistry& registry) {
    std::vector<std::string> names;
    for (const auto& job : registry.List()) names.push_back(job->name());
    return names;
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path();
};

TEST_F(PersistentRegistryTest, JobsComeBackAndDeletedOnesDoNot) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("a", Spec(10, 2)).ok());
    ASSERT_TRUE(registry->Create("b", Spec(20)).ok());
    ASSERT_TRUE(registry->Create("c", Spec(30)).ok());
    ASSERT_TRUE(registry->Delete("b").ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/jobs/b"));
  auto registry = Open();
  ASSERT_TRUE(registry->Recover().ok());
  EXPECT_THAT(Names(*registry), ::testing::ElementsAre("a", "c"));
  auto a = registry->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->config().normalized.num_samples(), 10u);
  EXPECT_EQ((*a)->config().normalized.world_size(), 2u);
  // Creating it again with its spec is idempotent across the restart; another spec conflicts.
  EXPECT_EQ(registry->Create("a", Spec(10, 2))->get(), a->get());
  EXPECT_EQ(registry->Create("a", Spec(11)).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(PersistentRegistryTest, ACorruptSnapshotStopsRecoveryAndNamesTheFile) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("a", Spec(100)).ok());
    ASSERT_TRUE(registry->Create("b", Spec(100)).ok());
  }
  const std::string snapshot = dir_ + "/jobs/b/snapshot-0.bin";
  {
    std::fstream f(snapshot, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(20);
    char c = 0;
    f.get(c);
    f.seekp(20);
    f.put(static_cast<char>(c ^ 1));
  }
  auto registry = Open();
  const absl::Status s = registry->Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(snapshot));
  EXPECT_THAT(std::string(s.message()), HasSubstr("job 'b'"));
  EXPECT_TRUE(Names(*registry).empty());           // Not part of the state: none of it.
  EXPECT_TRUE(std::filesystem::exists(snapshot));  // Left for the operator.
}

TEST_F(PersistentRegistryTest, AJobBeyondTheServersLimitsIsNotSilentlyDropped) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("big", Spec(100)).ok());
  }
  auto registry = Open(/*max_samples=*/50);
  const absl::Status s = registry->Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job 'big'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_samples = 100"));
}

TEST_F(PersistentRegistryTest, ARenamedJobDirectoryIsNotTakenForAnotherJob) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("a", Spec(10)).ok());
  }
  std::filesystem::rename(dir_ + "/jobs/a", dir_ + "/jobs/b");
  auto registry = Open();
  const absl::Status s = registry->Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to job 'a'"));
}

TEST_F(PersistentRegistryTest, OneServerPerDataDir) {
  auto first = Open();
  ASSERT_TRUE(first->Recover().ok());
  auto second = Open();
  const absl::Status s = second->Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("in use by another samplerd"));
  first.reset();  // Released with the first server.
  EXPECT_TRUE(Open()->Recover().ok());
}

TEST_F(PersistentRegistryTest, ADirectoryWithoutSnapshotIsAnUnacknowledgedCreate) {
  std::filesystem::create_directories(dir_ + "/jobs/half");
  auto registry = Open();
  ASSERT_TRUE(registry->Recover().ok());
  EXPECT_TRUE(Names(*registry).empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/jobs/half"));
}

// What is not a job directory is skipped and left alone, never a reason to keep every job
// down: lost+found (every fresh ext4 volume has one), a stray file, a directory whose name is not
// a job name, or one with a job's name holding no snapshot and files samplerd never writes.
TEST_F(PersistentRegistryTest, WhatIsNotAJobDirectoryIsSkippedAndLeftAlone) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("a", Spec(10)).ok());
  }
  const std::string jobs = dir_ + "/jobs";
  std::filesystem::create_directories(jobs + "/lost+found");
  std::ofstream(jobs + "/lost+found/#1234") << "a block fsck found";
  std::ofstream(jobs + "/README") << "not a job";
  std::filesystem::create_directories(jobs + "/not a job");
  std::filesystem::create_directories(jobs + "/notes");
  std::ofstream(jobs + "/notes/todo.txt") << "mine";
  auto registry = Open();
  const absl::Status s = registry->Recover();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(Names(*registry), ::testing::ElementsAre("a"));
  for (const char* kept : {"/lost+found/#1234", "/README", "/not a job", "/notes/todo.txt"}) {
    EXPECT_TRUE(std::filesystem::exists(jobs + kept)) << kept;
  }
  // The job is served as before.
  auto a = registry->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->EndEpoch(0, 0, 0).ok());
}

// Skipping strays does not skip damage: a real job's corrupt directory still stops the start.
TEST_F(PersistentRegistryTest, ACorruptJobNextToLostAndFoundStillStopsRecovery) {
  {
    auto registry = Open();
    ASSERT_TRUE(registry->Recover().ok());
    ASSERT_TRUE(registry->Create("a", Spec(10)).ok());
  }
  std::filesystem::create_directories(dir_ + "/jobs/lost+found");
  std::filesystem::remove(dir_ + "/jobs/a/wal-0.log");
  auto registry = Open();
  const absl::Status s = registry->Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("job 'a'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("wal-0.log is missing"));
  EXPECT_TRUE(Names(*registry).empty());
}

// Issue 24, defect 4: management calls racing on one job with a data_dir serialise cleanly.
// Each RewindJob, DeleteJob and CreateJob gets OK or a code that says what happened to the job
// (NOT_FOUND: deleted; FAILED_PRECONDITION: its state does not allow it); never INTERNAL or
// DATA_LOSS for a race the caller did not cause, and the files of a deleted job are all gone.
TEST_F(PersistentRegistryTest, RewindDeleteAndCreateOfOneJobSerialiseCleanly) {
  auto registry = Open();
  ASSERT_TRUE(registry->Recover().ok());
  constexpr int kThreads = 6;
  const absl::Duration run_for = absl::Seconds(4);
  absl::Mutex mu;
  std::map<std::string, int> unexpected;  // "CODE: message" -> count.
  int calls = 0;
  std::vector<std::thread> threads;
  const absl::Time end = absl::Now() + run_for;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t step = static_cast<uint64_t>(t);
      while (absl::Now() < end) {
        absl::Status s;
        switch (step++ % 3) {
          case 0:
            s = registry->Create("j", Spec(64), absl::Now() + absl::Seconds(10)).status();
            break;
          case 1:
            if (auto job = registry->Get("j"); job.ok()) {
              s = (*job)->Rewind(0);
            } else {
              s = job.status();
            }
            break;
          default:
            s = registry->Delete("j");
            break;
        }
        const bool clean = s.ok() || absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
                           absl::IsAlreadyExists(s);
        absl::MutexLock lock(&mu);
        ++calls;
        if (!clean) ++unexpected[s.ToString()];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::string report;
  for (const auto& [what, count] : unexpected) absl::StrAppend(&report, count, " x ", what, "\n");
  EXPECT_TRUE(unexpected.empty()) << "of " << calls << " calls:\n" << report;
  // Whatever the last call was, the directory holds exactly what the registry holds.
  if (registry->Get("j").ok()) {
    ASSERT_TRUE(registry->Delete("j").ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/jobs/j"));
}

}  // namespace
}  // namespace samplerd
