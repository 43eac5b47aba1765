// A randomized, model-based test of the order of a Job's operations: one fixed-seed sequence of
// calls (stream progress, loss reports, EndEpoch, resizes, rewinds, re-uploads of epoch 0's
// weights) made to two jobs of the same spec, one persisted (a JobJournal on disk, its snapshots
// written in the background, restarted at random points) and one kept in memory. After every
// operation both must show a client the same state and serve the same shards, every acknowledged
// loss must count exactly once, and no call may fail but as its contract (job.h) says.
//
// The sequence is fixed by the seed; the background work (the planner, the journal's snapshot
// thread) interleaves with it as the machine's timing has it, so repeated runs cover different
// interleavings. A mismatch names the seed, the step and the operations that led to it.
#include <cstdint>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job.h"
#include "server/job_config.h"
#include "server/persistence/job_journal.h"
#include "server/testing/job_observation.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

constexpr uint64_t kN = 400;
constexpr uint64_t kM = 240;       // Samples per epoch, fewer than N.
constexpr uint32_t kWorld = 3;     // The spec's world size.
constexpr uint32_t kMaxWorld = 4;  // Resizes pick 1 to kMaxWorld ranks.
constexpr int kSteps = 1000;

struct FuzzCase {
  const char* name;
  v1::BasePolicy base;
  v1::LossPolicy loss;
  bool replacement;
  uint64_t seed;  // Of the operation sequence (the job's own seed is fixed).
};

class JobFuzzTest : public ::testing::TestWithParam<FuzzCase> {
 protected:
  void SetUp() override {
    auto journal = JobJournal::Create(dir_);
    ASSERT_TRUE(journal.ok()) << journal.status();
    auto persisted = Job::Create("j", Config(), backend_.get(), *std::move(journal));
    ASSERT_TRUE(persisted.ok()) << persisted.status();
    persisted_ = *std::move(persisted);
    auto memory = Job::Create("j", Config(), backend_.get());
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = *std::move(memory);
    uploaded_ = GetParam().base == v1::UNIFORM;
    ResetRanks();
    if (uploaded_) starts_[0] = {};
  }

  static JobConfig Config() {
    v1::JobSpec spec;
    spec.set_num_samples(kN);
    spec.set_world_size(kWorld);
    spec.set_samples_per_epoch(kM);
    spec.set_replacement(GetParam().replacement);
    spec.set_seed(5);
    spec.mutable_policy()->set_base(GetParam().base);
    spec.mutable_policy()->set_loss(GetParam().loss);
    auto config = MakeJobConfig(spec, JobLimits());  // Keeps 3 epoch starts for rewinds.
    EXPECT_TRUE(config.ok()) << config.status();
    return *config;
  }

  uint64_t Uniform(uint64_t n) { return rng_() % n; }
  bool Chance(int percent) { return Uniform(100) < static_cast<uint64_t>(percent); }

  static std::string Observable(const Job& job) { return testutil::Observable(job); }
  static std::string Observable(v1::Job job) {
    job.clear_rewindable_epochs();
    return job.DebugString();
  }

  // ---- The model: what the jobs must count.

  // Every rank's progress cleared: a new deal or a new epoch, dealt to the in-memory job's world.
  void ResetRanks() {
    const uint32_t world = memory_->Describe().world_size();
    reported_.assign(world, {});
    accepted_.assign(world, 0);
  }
  // A loss policy keeps one loss per sample and epoch; without one, only positions count.
  bool KeepsLosses() const { return GetParam().loss == v1::LOSS; }
  void OpenEpoch(uint64_t epoch) {
    epoch_losses_.clear();
    starts_[epoch] = seen_;
    ResetRanks();
  }

  // ---- Operations. Each returns what it did, for the trace.

  std::string Stream() {
    const uint32_t rank = Uniform(shards_.size());
    const uint64_t position = Uniform(shards_[rank].size() + 1);
    const v1::Job d = memory_->Describe();
    EXPECT_TRUE(persisted_->RecordStreamed(d.current_epoch(), d.deal(), rank, position).ok());
    EXPECT_TRUE(memory_->RecordStreamed(d.current_epoch(), d.deal(), rank, position).ok());
    if (position > 0 && uploaded_) started_ = true;
    return absl::StrCat("stream rank ", rank, " to ", position);
  }

  // Losses for some positions of a rank's shard: a range (first_position) or a list, which may
  // repeat positions and hold positions reported before.
  std::string Report() {
    const uint32_t rank = Uniform(shards_.size());
    const std::vector<uint64_t>& shard = shards_[rank];
    const v1::Job d = memory_->Describe();
    const uint64_t epoch = d.current_epoch();
    const bool consecutive = Chance(50);
    const uint64_t count = 1 + Uniform(8);
    const uint64_t seq = ++seq_;
    if (shard.size() < count) {
      // No plan yet (awaiting the upload), or a short shard: a batch the job refuses.
      if (!uploaded_) {
        const testutil::OwnedLossBatch batch{epoch, rank, seq, {1}, {1.0f}, {0}, d.deal()};
        v1::LossReportSummary summary;
        const absl::Status p = persisted_->ReportLosses(batch.view(), &summary);
        const absl::Status m = memory_->ReportLosses(batch.view(), &summary);
        EXPECT_TRUE(absl::IsFailedPrecondition(p)) << p;
        EXPECT_TRUE(absl::IsFailedPrecondition(m)) << m;
        return "report before the upload";
      }
      return "report skipped";
    }
    std::vector<uint64_t> positions;
    const uint64_t from = Uniform(shard.size() - count + 1);
    for (uint64_t k = 0; k < count; ++k) {
      positions.push_back(consecutive ? from + k : Uniform(shard.size()));
    }
    testutil::OwnedLossBatch batch = testutil::BatchAt(
        epoch, rank, seq, shard, positions,
        [&](uint64_t index) { return static_cast<float>((index * 31 + seq * 7) % 13) / 4; });
    batch.deal = d.deal();
    LossBatchView view = batch.view();
    if (consecutive) {
      view.positions = {};
      view.consecutive = true;
      view.first_position = from;
    }
    v1::LossReportSummary from_persisted;
    v1::LossReportSummary from_memory;
    const absl::Status p = persisted_->ReportLosses(view, &from_persisted);
    const absl::Status m = memory_->ReportLosses(view, &from_memory);
    EXPECT_TRUE(p.ok()) << p;
    EXPECT_TRUE(m.ok()) << m;
    const absl::Status synced = persisted_->Sync();  // Acknowledged from here on.
    EXPECT_TRUE(synced.ok()) << synced;
    EXPECT_EQ(from_persisted.DebugString(), from_memory.DebugString());
    // The model: a position new to the rank counts once; with a loss policy, only the first
    // position of a sample in the epoch.
    uint64_t accepted = 0;
    for (size_t k = 0; k < positions.size(); ++k) {
      if (!reported_[rank].insert(positions[k]).second) continue;
      started_ = true;
      if (KeepsLosses() && !epoch_losses_.insert(batch.indices[k]).second) continue;
      if (KeepsLosses()) seen_.insert(batch.indices[k]);
      ++accepted;
    }
    accepted_[rank] += accepted;
    EXPECT_EQ(from_memory.accepted(), accepted);
    EXPECT_EQ(from_memory.duplicates(), positions.size() - accepted);
    return absl::StrCat("report rank ", rank, " positions ", absl::StrJoin(positions, ","),
                        consecutive ? " (range)" : "", ": ", accepted, " accepted");
  }

  // A report of a closed epoch (stale), or of a deal a resize replaced (refused).
  std::string Straggle() {
    const v1::Job d = memory_->Describe();
    const bool old_deal = d.deal() > 0 && (d.current_epoch() == 0 || Chance(50));
    if (!old_deal && d.current_epoch() == 0) return "straggler skipped";
    const uint64_t epoch = old_deal ? d.current_epoch() : d.current_epoch() - 1;
    const testutil::OwnedLossBatch batch{
        epoch, 0, ++seq_, {Uniform(kN)}, {1.5f}, {0}, old_deal ? d.deal() - 1 : 0};
    v1::LossReportSummary from_persisted;
    v1::LossReportSummary from_memory;
    const absl::Status p = persisted_->ReportLosses(batch.view(), &from_persisted);
    const absl::Status m = memory_->ReportLosses(batch.view(), &from_memory);
    if (old_deal) {
      EXPECT_TRUE(absl::IsFailedPrecondition(p)) << p;
      EXPECT_TRUE(absl::IsFailedPrecondition(m)) << m;
      return absl::StrCat("report of deal ", d.deal() - 1);
    }
    EXPECT_TRUE(p.ok()) << p;
    EXPECT_TRUE(m.ok()) << m;
    EXPECT_EQ(from_memory.stale(), 1u);
    EXPECT_EQ(from_persisted.DebugString(), from_memory.DebugString());
    return absl::StrCat("stale report of epoch ", epoch);
  }

  // Returns whether the epoch closed.
  std::string End(bool* closed) {
    const v1::Job d = memory_->Describe();
    const uint32_t rank = Uniform(d.world_size());
    auto p = persisted_->EndEpoch(d.current_epoch(), d.deal(), rank);
    auto m = memory_->EndEpoch(d.current_epoch(), d.deal(), rank);
    if (!uploaded_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
      EXPECT_TRUE(absl::IsFailedPrecondition(m.status())) << m.status();
      return "end before the upload";
    }
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(m.ok()) << m.status();
    if (!p.ok() || !m.ok()) return "end failed";
    EXPECT_EQ(p->DebugString(), m->DebugString());
    started_ = true;
    *closed = m->epoch_closed();
    if (*closed) OpenEpoch(d.current_epoch() + 1);
    return absl::StrCat("end epoch ", d.current_epoch(), " rank ", rank, *closed ? ": closed" : "");
  }

  // EndEpoch of the epoch just closed, again (a retry): acknowledged on both.
  std::string EndAgain() {
    const uint64_t epoch = memory_->CurrentEpoch();
    if (epoch == 0) return "end again skipped";
    auto p = persisted_->EndEpoch(epoch - 1, 0, 0);
    auto m = memory_->EndEpoch(epoch - 1, 0, 0);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(m.ok()) << m.status();
    if (p.ok() && m.ok()) EXPECT_EQ(p->DebugString(), m->DebugString());
    return absl::StrCat("end epoch ", epoch - 1, " again");
  }

  std::string Resize() {
    const uint32_t world = memory_->Describe().world_size();
    uint32_t to = 1 + Uniform(kMaxWorld);
    if (to == world) to = to % kMaxWorld + 1;
    const uint64_t epoch = memory_->CurrentEpoch();
    auto p = persisted_->Resize(epoch, to);
    auto m = memory_->Resize(epoch, to);
    const std::string what = absl::StrCat("resize epoch ", epoch, " to ", to);
    if (!uploaded_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
      EXPECT_TRUE(absl::IsFailedPrecondition(m.status())) << m.status();
      return what + " before the upload";
    }
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(m.ok()) << m.status();
    if (p.ok() && m.ok()) EXPECT_EQ(Observable(*p), Observable(*m));
    ResetRanks();
    return what;
  }

  // A rewind to an epoch the in-memory job keeps (the persisted one keeps it once its snapshot
  // is committed: waited for, or not, then FAILED_PRECONDITION is the one answer allowed), or to
  // one neither keeps.
  std::string Rewind() {
    // The reference's epoch starts once it has published the epoch being planned, if any (only
    // the persisted job is asked at once, right after an epoch boundary).
    Settle(*memory_);
    const std::vector<uint64_t> kept = memory_->RewindableEpochs();
    const uint64_t current = memory_->CurrentEpoch();
    const bool to_kept = !kept.empty() && Chance(80);
    const uint64_t epoch = to_kept ? kept[Uniform(kept.size())] : Uniform(current + 2);
    const bool wait = Chance(50);
    const bool kept_in_memory = std::find(kept.begin(), kept.end(), epoch) != kept.end();
    std::string what = absl::StrCat("rewind to ", epoch, " (kept: ", absl::StrJoin(kept, ","), ")");
    if (!kept_in_memory) {
      // Not kept in memory: an older start the persisted job still has (its snapshots lag) is
      // the one case where the two may differ, so the persisted job is asked only without it.
      const std::vector<uint64_t> on_disk = persisted_->RewindableEpochs();
      const absl::Status m = memory_->Rewind(epoch);
      EXPECT_TRUE(absl::IsFailedPrecondition(m)) << m;
      if (std::find(on_disk.begin(), on_disk.end(), epoch) == on_disk.end()) {
        const absl::Status p = persisted_->Rewind(epoch);
        EXPECT_TRUE(absl::IsFailedPrecondition(p)) << p;
      }
      return what + ": not kept";
    }
    if (wait) {
      testutil::AwaitKept(*persisted_, epoch);
      what += " after it was kept on disk";
    }
    const absl::Status p = persisted_->Rewind(epoch);
    if (!p.ok()) {
      EXPECT_FALSE(wait) << "a start kept on disk was refused: " << p;
      EXPECT_TRUE(absl::IsFailedPrecondition(p)) << p;
      return what + ": not yet kept on disk";
    }
    const absl::Status m = memory_->Rewind(epoch);
    EXPECT_TRUE(m.ok()) << m;
    // The model at the epoch's start.
    seen_ = starts_[epoch];
    starts_.erase(starts_.upper_bound(epoch), starts_.end());
    epoch_losses_.clear();
    if (epoch == 0) started_ = false;
    ResetRanks();
    return what;
  }

  // STATIC only: new base weights; OK before the job started, FAILED_PRECONDITION after.
  std::string Upload() {
    std::vector<float> weights(kN);
    for (float& w : weights) w = 0.25f + static_cast<float>(Uniform(16)) / 4;
    const absl::Status p = persisted_->UploadWeights(weights);
    const absl::Status m = memory_->UploadWeights(weights);
    if (started_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(p)) << "an upload after the job started: " << p;
      EXPECT_TRUE(absl::IsFailedPrecondition(m)) << "an upload after the job started: " << m;
      return "upload after the start";
    }
    EXPECT_TRUE(p.ok()) << p;
    EXPECT_TRUE(m.ok()) << m;
    uploaded_ = true;
    starts_.clear();
    starts_[0] = seen_;
    ResetRanks();
    return "upload";
  }

  // The persisted job stopped (what its journal holds is all that is left) and restored.
  std::string Restart() {
    persisted_.reset();
    auto recovered = JobJournal::Recover(dir_);
    EXPECT_TRUE(recovered.ok()) << recovered.status();
    if (!recovered.ok()) return "restart failed";
    auto restored = Job::Restore("j", Config(), backend_.get(), *std::move(recovered));
    EXPECT_TRUE(restored.ok()) << restored.status();
    if (!restored.ok()) return "restart failed";
    persisted_ = *std::move(restored);
    return "restart";
  }

  // Right after an epoch closed (its successor still being planned, its snapshot not yet
  // written): an operation that waits for the planning, or a restart.
  std::string RightAfterTheBoundary() {
    switch (Uniform(4)) {
      case 0:
        return "then " + Rewind();
      case 1:
        return "then " + Resize();
      case 2:
        return "then " + EndAgain();
      default:
        return "then " + Restart();
    }
  }

  // Waits until `job` serves its current epoch (after a planning in the background).
  void Settle(Job& job) {
    if (!uploaded_) return;
    const v1::Job d = job.Describe();
    auto lease = testutil::AwaitShard(job, d.current_epoch(), d.deal(), 0, d.world_size(),
                                  absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(lease.ok()) << lease.status();
  }

  // Both jobs observe the same state and serve the same shards; the model's counts hold.
  void Check() {
    Settle(*persisted_);
    Settle(*memory_);
    if (HasFatalFailure()) return;
    ASSERT_EQ(Observable(*persisted_), Observable(*memory_));
    const v1::JobStatus status = memory_->Status();
    EXPECT_EQ(status.samples_seen(), seen_.size());
    ASSERT_EQ(static_cast<size_t>(status.ranks_size()), accepted_.size());
    for (int r = 0; r < status.ranks_size(); ++r) {
      EXPECT_EQ(status.ranks(r).losses_accepted(), accepted_[r]) << "rank " << r;
    }
    shards_.assign(status.job().world_size(), {});
    if (!uploaded_) return;
    for (uint32_t r = 0; r < status.job().world_size(); ++r) {
      shards_[r] = testutil::ShardOf(*memory_, *backend_, status.job().current_epoch(), r);
      ASSERT_EQ(testutil::ShardOf(*persisted_, *backend_, status.job().current_epoch(), r),
                shards_[r])
          << "rank " << r;
    }
  }

  // An operation's description without its numbers and lists, to count operations by kind.
  static std::string Kind(const std::string& what) {
    std::string kind;
    int depth = 0;
    for (char c : what) {
      depth += c == '(';
      if (depth == 0 && !absl::ascii_isdigit(c) && c != ',') kind += c;
      depth -= c == ')';
    }
    return kind;
  }

  void Run() {
    Check();
    std::deque<std::string> trace;  // The latest operations, for a mismatch's message.
    for (int step = 0; step < kSteps; ++step) {
      const bool statik = GetParam().base == v1::STATIC;
      const uint64_t roll = Uniform(100);
      std::string what;
      bool closed = false;
      if (!started_ && statik) {
        // Epoch 0 not started: its weights may be uploaded again (after a resize, a rewind to
        // epoch 0 or a restart too) until a rank streams, reports or ends the epoch.
        if (roll < 30) {
          what = Upload();
        } else if (roll < 50) {
          what = Resize();
        } else if (roll < 60) {
          what = Restart();
        } else if (roll < 70) {
          what = Rewind();
        } else if (roll < 80) {
          what = Stream();
        } else if (roll < 90) {
          what = Report();
        } else {
          what = End(&closed);
        }
      } else if (roll < 14) {
        what = Stream();
      } else if (roll < 44) {
        what = Report();
      } else if (roll < 48) {
        what = Straggle();
      } else if (roll < 72) {
        what = End(&closed);
        if (closed && Chance(40)) what += "; " + RightAfterTheBoundary();
      } else if (roll < 80) {
        what = Resize();
      } else if (roll < 88) {
        what = Rewind();
      } else if (roll < 94) {
        what = statik ? Upload() : Stream();
      } else {
        what = Restart();
      }
      ++done_[Kind(what)];
      trace.push_back(absl::StrCat(step, ": ", what));
      if (trace.size() > 24) trace.pop_front();
      SCOPED_TRACE(absl::StrCat("case ", GetParam().name, ", seed ", GetParam().seed, ", step ",
                                step, "; operations:\n", absl::StrJoin(trace, "\n")));
      if (!HasFailure()) Check();
      if (HasFailure()) {
        ADD_FAILURE() << "first failure at step " << step;
        return;
      }
    }
    // What the sequence did, so that a change that stops it from reaching a path shows.
    std::string summary = absl::StrCat("epoch ", memory_->CurrentEpoch(), " reached;");
    for (const auto& [kind, count] : done_) absl::StrAppend(&summary, "\n  ", count, " x ", kind);
    RecordProperty("operations", summary);
    std::cout << GetParam().name << " seed " << GetParam().seed << ": " << summary << "\n";
  }

  testutil::TestDir test_dir_;
  const std::string dir_ = test_dir_.path() + "/j";
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
  std::unique_ptr<Job> persisted_;
  std::unique_ptr<Job> memory_;
  std::mt19937_64 rng_{GetParam().seed};
  uint64_t seq_ = 0;
  std::map<std::string, int> done_;  // Operations done, by kind.

  // The model.
  bool uploaded_ = false;    // Epoch 0 has a plan.
  bool started_ = false;     // A position was streamed or reported, or a rank ended an epoch.
  std::set<uint64_t> seen_;  // Samples whose loss was accepted, ever.
  std::set<uint64_t> epoch_losses_;  // Samples whose loss was accepted in the current epoch.
  std::map<uint64_t, std::set<uint64_t>> starts_;  // seen_ at each epoch's start.
  std::vector<std::set<uint64_t>> reported_;       // Per rank of the deal: positions reported.
  std::vector<uint64_t> accepted_;                 // Per rank of the deal: losses accepted.
  std::vector<std::vector<uint64_t>> shards_;      // Per rank of the deal: its shard.
};

TEST_P(JobFuzzTest, PersistedAndInMemoryJobsAgreeAfterEveryOperation) { Run(); }

INSTANTIATE_TEST_SUITE_P(
    Policies, JobFuzzTest,
    ::testing::Values(FuzzCase{"UniformLoss", v1::UNIFORM, v1::LOSS, false, 1},
                      FuzzCase{"UniformLoss", v1::UNIFORM, v1::LOSS, false, 2},
                      FuzzCase{"UniformLossReplacement", v1::UNIFORM, v1::LOSS, true, 3},
                      FuzzCase{"StaticLoss", v1::STATIC, v1::LOSS, false, 4},
                      FuzzCase{"StaticLoss", v1::STATIC, v1::LOSS, false, 5},
                      FuzzCase{"StaticLossReplacement", v1::STATIC, v1::LOSS, true, 6},
                      FuzzCase{"StaticNoLossReplacement", v1::STATIC, v1::NONE, true, 7}),
    [](const ::testing::TestParamInfo<FuzzCase>& info) {
      return absl::StrCat(info.param.name, "Seed", info.param.seed);
    });

}  // namespace
}  // namespace samplerd
