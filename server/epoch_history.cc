// EpochHistory: the in-memory and the journal-backed implementations.
#include "server/epoch_history.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "kernels/cpu_backend.h"
#include "kernels/loss_policies.h"

namespace samplerd {
namespace {

// A mixture job's state before the window of `planned` as a snapshot holds it; null for other
// jobs.
std::shared_ptr<const state::MixtureState> MixtureStartOf(const PlannedEpoch& planned) {
  if (planned.view.mixture == nullptr) return nullptr;
  auto start =
      std::make_shared<state::MixtureState>(MixtureStateToProto(*planned.view.mixture->start));
  // The weight history up to the epoch, so that a restart and a rewind show it again.
  if (planned.weight_history != nullptr) {
    for (const state::EpochGroupWeights& e : *planned.weight_history) *start->add_history() = e;
  }
  return start;
}

using EpochStart = JobJournal::EpochStart;

absl::Status NoLongerKept(const std::string& name, uint64_t epoch) {
  return absl::FailedPreconditionError(
      absl::StrCat("epoch = ", epoch, " of job '", name, "': its start is no longer kept"));
}

// ---- In memory ----------------------------------------------------------------------------------

class InMemoryHistory final : public EpochHistory {
 public:
  InMemoryHistory(std::string name, const JobConfig& config)
      : name_(std::move(name)), config_(config) {}

  absl::Status AwaitUpload() override { return absl::OkStatus(); }

  // Copies the epoch's start to the host (the statistics are readable: the job is Planning).
  absl::Status BeforePublishing(const Opening& opening) override {
    if (config_.rewind_epochs == 0) return absl::OkStatus();
    std::vector<SampleLossStats> loss_stats;
    if (opening.losses != nullptr) {
      absl::StatusOr<std::vector<SampleLossStats>> host = opening.losses->ToHost();
      if (!host.ok()) return host.status();
      loss_stats = *std::move(host);
    }
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> base = HostWeights(opening.base);
    if (!base.ok()) return base.status();
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> weights =
        HostWeights(opening.planned->view.weights);
    if (!weights.ok()) return weights.status();
    EpochStart start = MakeEpochStart(name_, config_, opening.planned->epoch, /*planned=*/true,
                                      opening.world_size, *std::move(base), *std::move(weights));
    start.irreducible = opening.irreducible;
    start.mixture = MixtureStartOf(*opening.planned);
    start.loss_stats = std::move(loss_stats);
    absl::MutexLock lock(&mu_);
    // A re-upload replaces epoch 0's start; after a rewind, the forgotten epochs are gone.
    while (!kept_.empty() && kept_.back().epoch >= start.epoch) kept_.pop_back();
    kept_.push_back(std::move(start));
    while (kept_.size() > config_.rewind_epochs) kept_.pop_front();
    return absl::OkStatus();
  }
  absl::Status AfterPublishing(const Opening&) override { return absl::OkStatus(); }

  LossRecord PrepareLosses(const LossBatchView&) const override { return std::nullopt; }
  absl::Status LogLosses(const LossRecord&) override { return absl::OkStatus(); }
  absl::Status LogRankEnded(uint64_t, uint32_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status LogStreamed(uint64_t, uint32_t, uint32_t, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status LogResized(uint64_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status LogGroupWeightsSet(uint64_t, absl::Span<const double>) override {
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Remove() override { return absl::OkStatus(); }

  std::vector<uint64_t> KeptEpochs() const override {
    std::vector<uint64_t> epochs;
    absl::MutexLock lock(&mu_);
    for (const EpochStart& start : kept_) epochs.push_back(start.epoch);
    return epochs;
  }
  absl::StatusOr<EpochStart> Read(uint64_t epoch) const override {
    absl::MutexLock lock(&mu_);
    for (const EpochStart& start : kept_) {
      if (start.epoch == epoch) return start;  // A copy: the kept one stays for another rewind.
    }
    return NoLongerKept(name_, epoch);
  }
  absl::Status Rewind(uint64_t epoch) override {
    absl::MutexLock lock(&mu_);
    while (!kept_.empty() && kept_.back().epoch > epoch) kept_.pop_back();
    return absl::OkStatus();
  }

 private:
  const std::string name_;
  const JobConfig config_;
  mutable absl::Mutex mu_;
  // The newest config_.rewind_epochs epoch starts, ascending: what a journal's snapshots hold.
  std::deque<EpochStart> kept_ ABSL_GUARDED_BY(mu_);
};

// ---- Journal-backed -----------------------------------------------------------------------------

class JournalHistory final : public EpochHistory {
 public:
  JournalHistory(std::string name, const JobConfig& config, std::unique_ptr<JobJournal> journal)
      : name_(std::move(name)), config_(config), journal_(std::move(journal)) {
    journal_->KeepEpochStarts(config_.rewind_epochs);
  }

  absl::Status AwaitUpload() override {
    absl::MutexLock lock(&files_mu_);
    if (removed_) return Removed();
    return journal_->StartEpochDurably(MakeEpochStart(name_, config_, 0, /*planned=*/false,
                                                      config_.shard.world_size, nullptr, nullptr));
  }

  absl::Status BeforePublishing(const Opening& opening) override {
    const uint64_t epoch = opening.planned->epoch;
    // A mixture job's groups for an upload's (a creation's) snapshot: O(K), before files_mu_.
    std::shared_ptr<const state::MixtureState> mixture =
        opening.by == Opening::By::kEndEpoch ? nullptr : MixtureStartOf(*opening.planned);
    absl::MutexLock lock(&files_mu_);
    if (removed_) return Removed();
    if (opening.by == Opening::By::kEndEpoch) {
      // The snapshot opening the epoch is written after it is published (AfterPublishing):
      // its loss statistics are derived from the previous snapshot and the closed epochs' logs
      // (nothing is copied on the boundary's path). Until it is committed, recovery replays
      // the same logs from the previous snapshot, and the epoch is listed as kept all the same
      // (Read waits for its snapshot).
      absl::Status s = journal_->OpenEpoch(epoch);
      if (s.ok()) scheduled_epoch_.store(epoch + 1);
      return s;
    }
    // An upload (or a creation) is in no log: its snapshot is all there is, so it is durable
    // before the plan is published. Epoch 0's weights are its base.
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> host = HostWeights(opening.base);
    if (!host.ok()) return host.status();
    EpochStart start =
        MakeEpochStart(name_, config_, epoch, /*planned=*/true, opening.world_size, *host, *host);
    start.irreducible = opening.irreducible;
    start.mixture = std::move(mixture);
    return journal_->StartEpochDurably(start);
  }

  absl::Status AfterPublishing(const Opening& opening) override {
    if (opening.by != Opening::By::kEndEpoch) return absl::OkStatus();
    const uint64_t epoch = opening.planned->epoch;
    // The snapshot's weights as host vectors, copied here after the publication (from a device:
    // off the boundary's path; the CPU backend's own vectors: no copy).
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> base = HostWeights(opening.base);
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> weights =
        HostWeights(opening.planned->view.weights);
    if (absl::Status s = base.ok() ? weights.status() : base.status(); !s.ok()) {
      LOG(ERROR) << "job '" << name_ << "': copying the weights of epoch " << epoch
                 << " for its snapshot failed: " << s;
      return s;
    }
    EpochStart start = MakeEpochStart(name_, config_, epoch, /*planned=*/true, opening.world_size,
                                      *std::move(base), *std::move(weights));
    start.irreducible = opening.irreducible;
    start.mixture = MixtureStartOf(*opening.planned);
    if (UsesLossStats(config_.policy)) {
      // Derived on the host by the CPU backend's statistics: the rule every backend applies
      // (compute_backend.h, BackendLossStats::Apply), whichever backend the job runs on.
      start.loss_stats_from_logs = [n = config_.plan.num_samples,
                                    decay = config_.policy.ema_decay] {
        return NewCpuBackend(1)->NewLossStats(n, decay);
      };
    }
    // Off this thread too, so that a short epoch's boundary never waits for the previous one.
    // Once the files are removed, the journal drops it.
    journal_->ScheduleEpochSnapshot(std::move(start));
    return absl::OkStatus();
  }

  LossRecord PrepareLosses(const LossBatchView& batch) const override {
    return JobJournal::EncodedLosses(batch);
  }
  absl::Status LogLosses(const LossRecord& record) override { return journal_->LogLosses(*record); }
  absl::Status LogRankEnded(uint64_t epoch, uint32_t deal, uint32_t rank) override {
    return journal_->LogRankEnded(epoch, deal, rank);
  }
  absl::Status LogStreamed(uint64_t epoch, uint32_t deal, uint32_t rank,
                           uint64_t position) override {
    return journal_->LogStreamed(epoch, deal, rank, position);
  }
  absl::Status LogResized(uint64_t epoch, uint32_t world_size) override {
    return journal_->LogResized(epoch, world_size);
  }
  absl::Status LogGroupWeightsSet(uint64_t epoch, absl::Span<const double> weights) override {
    return journal_->LogGroupWeightsSet(epoch, weights);
  }
  absl::Status Sync() override { return journal_->Sync(); }
  absl::Status Remove() override {
    absl::MutexLock lock(&files_mu_);  // After a rewind or an epoch's opening in progress.
    removed_ = true;
    return journal_->Remove();
  }

  std::vector<uint64_t> KeptEpochs() const override {
    if (config_.rewind_epochs == 0) return {};  // The journal keeps one snapshot for recovery.
    absl::StatusOr<std::vector<uint64_t>> epochs = journal_->KeptEpochStarts();
    if (!epochs.ok()) {
      LOG(WARNING) << "job '" << name_ << "': listing its snapshots failed: " << epochs.status();
      return {};
    }
    // The current epoch's start is kept from the moment it is served, though its snapshot is
    // written in the background: it supersedes the oldest.
    if (const std::optional<uint64_t> scheduled = Scheduled();
        scheduled.has_value() && (epochs->empty() || epochs->back() < *scheduled)) {
      epochs->push_back(*scheduled);
      if (epochs->size() > std::max<uint32_t>(config_.rewind_epochs, 1)) {
        epochs->erase(epochs->begin());
      }
    }
    return *std::move(epochs);
  }
  absl::StatusOr<EpochStart> Read(uint64_t epoch) const override {
    // The current epoch's snapshot may still be being written, and so may an older one (an
    // epoch that closed right after it opened): wait for it.
    const std::vector<uint64_t> unwritten = journal_->UnwrittenEpochStarts();
    if (Scheduled() == epoch ||
        std::find(unwritten.begin(), unwritten.end(), epoch) != unwritten.end()) {
      journal_->AwaitScheduledSnapshots();
    }
    absl::MutexLock lock(&files_mu_);
    if (removed_) return Removed();
    absl::StatusOr<EpochStart> read = journal_->ReadEpochStart(epoch);
    if (absl::IsNotFound(read.status())) return NoLongerKept(name_, epoch);
    if (!read.ok()) return read.status();
    if (!read->planned) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "' was never planned"));
    }
    return read;
  }
  absl::Status Rewind(uint64_t epoch) override {
    absl::MutexLock lock(&files_mu_);
    if (removed_) return Removed();
    // The current epoch's snapshot is written first (the journal's rewind would drop it if not
    // begun), so that the starts kept before the rewind point are the newest ones, as listed.
    journal_->AwaitScheduledSnapshots();
    scheduled_epoch_.store(0);
    absl::Status s = journal_->Rewind(epoch);
    return absl::IsNotFound(s) ? NoLongerKept(name_, epoch) : s;
  }

 private:
  // The epoch opened last by an EndEpoch (its snapshot written in the background), if any.
  std::optional<uint64_t> Scheduled() const {
    const uint64_t plus_one = scheduled_epoch_.load();
    if (plus_one == 0) return std::nullopt;
    return plus_one - 1;
  }
  absl::Status Removed() const {
    return absl::NotFoundError(absl::StrCat("job '", name_, "': its files were removed"));
  }

  const std::string name_;
  const JobConfig config_;
  const std::unique_ptr<JobJournal> journal_;
  // Serialises what writes or reads the job's files off the job's lock (an epoch's opening, a
  // rewind, reading a kept start) with Remove: a rewind racing a deletion either finishes before
  // the files are removed or touches nothing, so that no file is written into a directory being
  // removed (or into the directory of a job created again under the same name).
  mutable absl::Mutex files_mu_;
  bool removed_ ABSL_GUARDED_BY(files_mu_) = false;
  // 1 + the epoch opened last by an EndEpoch; 0: none since the last rewind.
  std::atomic<uint64_t> scheduled_epoch_{0};
};

}  // namespace

JobJournal::EpochStart MakeEpochStart(const std::string& name, const JobConfig& config,
                                      uint64_t epoch, bool planned, uint32_t world_size,
                                      std::shared_ptr<const std::vector<float>> base,
                                      std::shared_ptr<const std::vector<float>> weights) {
  EpochStart start;
  start.job = name;
  start.spec = config.normalized.SerializeAsString();
  start.epoch = epoch;
  start.planned = planned;
  start.world_size = world_size;
  start.base = std::move(base);
  start.weights = std::move(weights);
  return start;
}

absl::StatusOr<std::shared_ptr<const std::vector<float>>> HostWeights(
    const std::shared_ptr<const BackendWeights>& weights) {
  if (weights == nullptr) return nullptr;
  return weights->ToHost();
}

std::unique_ptr<EpochHistory> MakeInMemoryHistory(std::string name, const JobConfig& config) {
  return std::make_unique<InMemoryHistory>(std::move(name), config);
}

std::unique_ptr<EpochHistory> MakeJournalHistory(std::string name, const JobConfig& config,
                                                 std::unique_ptr<JobJournal> journal) {
  return std::make_unique<JournalHistory>(std::move(name), config, std::move(journal));
}

}  // namespace samplerd
