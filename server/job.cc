#include "server/job.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "server/epoch_deal.h"

namespace samplerd {
namespace {

// How often a waiting StreamShard checks whether its caller went away.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);
// Ranks named in a message about the ranks that have not ended an epoch.
constexpr size_t kRanksNamed = 16;

// The host values of backend weights, for a snapshot or a kept epoch start: null for uniform
// (null). The CPU backend's own vector (no copy); a copy from the device for CUDA.
absl::StatusOr<std::shared_ptr<const std::vector<float>>> HostWeights(
    const std::shared_ptr<const BackendWeights>& weights) {
  if (weights == nullptr) return nullptr;
  return weights->ToHost();
}

}  // namespace

// ---- Life cycle ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Job>> Job::Create(std::string name, JobConfig config,
                                                 ComputeBackend* backend,
                                                 std::unique_ptr<JobJournal> journal) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) return s;
  std::unique_ptr<Job> job(
      new Job(std::move(name), std::move(config), backend, std::move(journal)));
  absl::Status s = job->MakeLossStats();
  if (s.ok() && job->config_.policy.base == BaseWeightKind::kUniform) {
    s = job->InstallBaseAndPlan({});
  } else if (s.ok() && job->journal_ != nullptr) {
    // Persisted as awaiting its upload.
    s = job->journal_->StartEpochDurably(job->MakeEpochStart(
        0, /*planned=*/false, job->config_.shard.world_size, nullptr, nullptr, {}, 0));
  }
  if (!s.ok()) {
    job->Close(s);
    if (absl::Status r = job->RemovePersistedState(); !r.ok()) LOG(WARNING) << r;
    return s;
  }
  return job;
}

Job::Job(std::string name, JobConfig config, ComputeBackend* backend,
         std::unique_ptr<JobJournal> journal)
    : name_(std::move(name)),
      config_(std::move(config)),
      backend_(backend),
      journal_(std::move(journal)),
      planner_(config_, backend_) {
  if (journal_ != nullptr) journal_->KeepEpochStarts(config_.rewind_epochs);
  absl::MutexLock lock(&mu_);
  shard_ = config_.shard;
  start_world_size_ = shard_.world_size;
  deal_length_ = config_.plan.samples_per_epoch;
  ranks_.resize(shard_.world_size);
}

absl::Status Job::MakeLossStats() {
  if (config_.policy.loss == LossWeightKind::kNone) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<BackendLossStats>> made =
      backend_->NewLossStats(config_.plan.num_samples, config_.policy.ema_decay);
  if (!made.ok()) return made.status();
  absl::MutexLock lock(&mu_);
  losses_ = *std::move(made);
  return absl::OkStatus();
}

Job::~Job() { Close(absl::NotFoundError(absl::StrCat("job '", name_, "' was deleted"))); }

void Job::Close(absl::Status reason) {
  {
    absl::MutexLock lock(&mu_);
    if (!std::holds_alternative<Closed>(phase_)) phase_ = Closed{std::move(reason)};
  }
  // A planner task finishing now finds the job closed and publishes nothing.
  planner_.Stop();
}

absl::Status Job::Sync() { return journal_ == nullptr ? absl::OkStatus() : journal_->Sync(); }

absl::Status Job::RemovePersistedState() {
  return journal_ == nullptr ? absl::OkStatus() : journal_->Remove();
}

// ---- Phases -------------------------------------------------------------------------------------

bool Job::Started() const {
  return epoch_ > 0 || replaced_deal_started_ ||
         std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.Started(); });
}

absl::Status Job::CheckEpochOpen(uint64_t epoch) const {
  if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
  if (const auto* failed = std::get_if<Failed>(&phase_)) {
    return absl::InternalError(absl::StrCat("job '", name_, "': ", failed->during, " epoch ",
                                            epoch_, " failed: ", failed->error.ToString()));
  }
  const bool serving = std::holds_alternative<Serving>(phase_);
  if (epoch == epoch_ && serving) return absl::OkStatus();
  if (epoch < epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch = ", epoch, " of job '", name_, "' is closed; the current epoch is ", epoch_));
  }
  const std::string why = serving ? "" : absl::StrCat(" (", WhyNotServing(epoch_), ")");
  return absl::FailedPreconditionError(absl::StrCat(
      "epoch = ", epoch, " of job '", name_, "' is not open; the current epoch is ", epoch_, why));
}

absl::Status Job::CheckDeal(uint64_t epoch, uint32_t deal) const {
  if (deal == deal_) return absl::OkStatus();
  if (deal < deal_) {
    return absl::FailedPreconditionError(
        absl::StrCat("deal = ", deal, " of epoch ", epoch, " of job '", name_,
                     "' was replaced by deal ", deal_, " (", shard_.world_size,
                     " ranks) when the group was resized; what it had not done was "
                     "dealt again: re-read the job (GetJob) and use deal ",
                     deal_));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("deal = ", deal, " of epoch ", epoch, " of job '", name_,
                   "' does not exist; the current deal is ", deal_));
}

absl::Status Job::CheckWorldSize(uint64_t epoch, uint32_t world_size) const {
  if (world_size == shard_.world_size) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "world_size = ", world_size, " does not match the ", shard_.world_size, " ranks that epoch ",
      epoch, " of job '", name_, "' is dealt to (deal ", deal_,
      "); if the group's size changed, its first rank resizes the job (ResizeJob; Python: "
      "DistributedWeightedSampler(..., elastic=True))"));
}

std::string Job::WhyNotServing(uint64_t epoch) const {
  if (std::holds_alternative<AwaitingUpload>(phase_)) {
    return absl::StrCat(
        "it has no plan yet: it waits for ",
        config_.policy.base == BaseWeightKind::kStatic ? "UploadWeights" : "UploadLabels");
  }
  if (const auto* planning = std::get_if<Planning>(&phase_)) {
    return absl::StrCat("epoch ", epoch_, " is still being ",
                        planning->redealing ? "dealt again after a resize" : "planned", ", for ",
                        absl::FormatDuration(absl::Now() - planning->since));
  }
  if (std::holds_alternative<Serving>(phase_) && epoch == epoch_ + 1) {
    std::vector<uint32_t> waiting;
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r].ended) waiting.push_back(r);
    }
    const size_t named = std::min(waiting.size(), kRanksNamed);
    return absl::StrCat(
        "epoch ", epoch_, " is still open: ranks ",
        absl::StrJoin(waiting.begin(), waiting.begin() + named, ", "),
        waiting.size() > named ? absl::StrCat(" and ", waiting.size() - named, " more") : "",
        " of world_size ", shard_.world_size, " have not ended it (EndEpoch)");
  }
  return absl::StrCat("the current epoch is ", epoch_);
}

absl::StatusOr<const BackendLossStats*> Job::LossesWhilePlanning() const {
  absl::MutexLock lock(&mu_);
  if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
  // Called by EndEpoch right after it entered Planning for the next epoch: only that epoch's
  // planner leaves this Planning (Publish, or Failed), and nothing writes the statistics until
  // it has published. A closed job's statistics are never written again either.
  CHECK(IsPlanning()) << "job '" << name_
                      << "': loss statistics read off the lock while not planning";
  return losses_.get();
}

absl::StatusOr<std::shared_ptr<const BackendWeights>> Job::WeightsFromHost(
    const std::shared_ptr<const std::vector<float>>& host) const {
  if (host == nullptr || host->empty()) return nullptr;
  return backend_->MakeWeights(*host);  // A copy: the host vector may be kept for another use.
}

absl::Status Job::AwaitNotPlanning() {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !IsPlanning(); };
  mu_.Await(absl::Condition(&settled));
  if (const auto* failed = std::get_if<Failed>(&phase_)) return failed->error;
  return absl::OkStatus();
}

v1::Job Job::Describe() const {
  v1::Job job;
  for (uint64_t e : RewindableEpochs()) job.add_rewindable_epochs(e);
  absl::MutexLock lock(&mu_);
  DescribeLocked(&job);
  return job;
}

absl::StatusOr<v1::Job> Job::DescribeForRank(uint32_t rank, std::optional<uint64_t> epoch) const {
  v1::Job job;
  for (uint64_t e : RewindableEpochs()) job.add_rewindable_epochs(e);  // Not under mu_.
  absl::MutexLock lock(&mu_);
  DescribeLocked(&job);  // Under the same lock as the length below: both of one deal.
  const uint64_t e = epoch.value_or(epoch_);
  if (e < epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch = ", e, " of job '", name_, "' is closed; the current epoch is ", epoch_));
  }
  absl::StatusOr<uint64_t> length =
      ShardLength(e == epoch_ ? deal_length_ : config_.plan.samples_per_epoch, shard_, rank);
  if (!length.ok()) {
    return absl::Status(length.status().code(),
                        absl::StrCat(length.status().message(), " (job '", name_, "')"));
  }
  job.set_shard_length(*length);
  return job;
}

void Job::DescribeLocked(v1::Job* job) const {
  job->set_name(name_);
  *job->mutable_spec() = config_.normalized;
  job->set_current_epoch(epoch_);
  job->set_plan_ready(std::holds_alternative<Serving>(phase_));
  job->set_world_size(shard_.world_size);
  job->set_deal(deal_);
}

// ---- Uploads ------------------------------------------------------------------------------------

absl::Status Job::UploadWeights(std::vector<float> weights) {
  if (config_.policy.base != BaseWeightKind::kStatic) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name_, "' has policy.base = ",
        v1::BasePolicy_Name(config_.normalized.policy().base()), "; UploadWeights needs STATIC"));
  }
  if (weights.size() != config_.plan.num_samples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: ", weights.size(), " values for num_samples ", config_.plan.num_samples));
  }
  // Validated and normalised to mean 1 (importance weights are then 1 / w).
  if (absl::Status s = NormaliseWeights(absl::MakeSpan(weights)); !s.ok()) return s;
  return InstallBaseAndPlan(std::move(weights));
}

absl::Status Job::UploadLabels(const std::vector<uint32_t>& labels) {
  if (config_.policy.base != BaseWeightKind::kClassBalanced) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name_,
        "' has policy.base = ", v1::BasePolicy_Name(config_.normalized.policy().base()),
        "; UploadLabels needs CLASS_BALANCED"));
  }
  std::vector<float> base(config_.plan.num_samples);
  if (absl::Status s =
          ClassBalancedWeights(labels, config_.policy.class_balance_beta, absl::MakeSpan(base));
      !s.ok()) {
    return s;
  }
  return InstallBaseAndPlan(std::move(base));
}

absl::Status Job::InstallBaseAndPlan(std::vector<float> base) {
  uint32_t world_size = 0;
  {
    absl::MutexLock lock(&mu_);
    if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    const auto* serving = std::get_if<Serving>(&phase_);
    if (!(std::holds_alternative<AwaitingUpload>(phase_) || serving != nullptr) || Started()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", name_, "' already started (epoch ", epoch_,
          "); weights and labels can only be uploaded before the first shard position is "
          "streamed, loss reported or epoch ended"));
    }
    // A re-upload withdraws the plan of epoch 0 until the new one is published: a loss or an
    // EndEpoch accepted against the old plan meanwhile would be wiped by the publication, or
    // would start planning epoch 1 concurrently with it. Planning also excludes a concurrent
    // upload.
    Planning planning;
    if (serving != nullptr) planning.previous_plan = serving->view;
    planning.since = absl::Now();
    phase_ = std::move(planning);
    // The world size epoch 0 started with (deal 0's), not a resize's: epoch 0's log keeps the
    // resizes made since, which a restart replays on top of the snapshot, and a rewind to epoch
    // 0 deals it to the ranks it started with.
    world_size = start_world_size_;
  }
  // Creation with a UNIFORM base passes no weights: no base, uniform W_0. Uploaded weights
  // become the backend's (for the CPU the vector itself, no copy).
  std::shared_ptr<const BackendWeights> new_base;
  absl::Status s;
  if (!base.empty()) {
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made =
        backend_->MakeWeights(std::move(base));
    if (made.ok()) {
      new_base = *std::move(made);
    } else {
      s = made.status();
    }
  }
  absl::StatusOr<PlannedEpoch> planned =
      s.ok() ? planner_.Plan(0, new_base) : absl::StatusOr<PlannedEpoch>(s);
  s = planned.status();
  // An upload (or a creation) is in no log: its snapshot is all there is, so it is durable
  // before the plan is published.
  if (s.ok() && journal_ != nullptr) {
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> host = HostWeights(new_base);
    s = host.status();
    if (s.ok()) {
      s = journal_->StartEpochDurably(
          MakeEpochStart(0, /*planned=*/true, world_size, *host, *host, {}, 0));
    }
  }
  absl::StatusOr<std::optional<JobJournal::EpochStart>> kept;
  if (s.ok()) {
    kept = StartToKeep(*planned, new_base, world_size);
    s = kept.status();
  }
  if (s.ok()) {
    if (Publish(*planned, new_base, *std::move(kept))) return absl::OkStatus();
    absl::MutexLock lock(&mu_);  // Closed while planning: only Close leaves this Planning.
    if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    return absl::InternalError(absl::StrCat("job '", name_, "': epoch 0 was not published"));
  }
  absl::MutexLock lock(&mu_);
  if (auto* planning = std::get_if<Planning>(&phase_)) {
    // A failed re-upload leaves the published plan as it was.
    if (planning->previous_plan.has_value()) {
      phase_ = Serving{*std::move(planning->previous_plan)};
    } else {
      phase_ = AwaitingUpload{};
    }
  }
  return s;
}

// ---- Planning -----------------------------------------------------------------------------------

JobJournal::EpochStart Job::MakeEpochStart(uint64_t epoch, bool planned, uint32_t world_size,
                                           std::shared_ptr<const std::vector<float>> base,
                                           std::shared_ptr<const std::vector<float>> weights,
                                           std::vector<SampleLossStats> loss_stats,
                                           uint64_t samples_seen) const {
  JobJournal::EpochStart start;
  start.job = name_;
  start.spec = config_.normalized.SerializeAsString();
  start.epoch = epoch;
  start.planned = planned;
  start.world_size = world_size;
  start.base = std::move(base);
  start.weights = std::move(weights);
  start.loss_stats = std::move(loss_stats);
  start.samples_seen = samples_seen;
  return start;
}

absl::StatusOr<std::optional<JobJournal::EpochStart>> Job::StartToKeep(
    const PlannedEpoch& planned, const std::shared_ptr<const BackendWeights>& base,
    uint32_t world_size) const {
  if (journal_ != nullptr || config_.rewind_epochs == 0) return std::nullopt;
  absl::StatusOr<const BackendLossStats*> losses = LossesWhilePlanning();
  if (!losses.ok()) return std::nullopt;  // Closed: nothing is published.
  std::vector<SampleLossStats> loss_stats;
  if (*losses != nullptr) {
    absl::StatusOr<std::vector<SampleLossStats>> host = (*losses)->ToHost();
    if (!host.ok()) return host.status();
    loss_stats = *std::move(host);
  }
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> base_host = HostWeights(base);
  if (!base_host.ok()) return base_host.status();
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> weights_host =
      HostWeights(planned.view.weights);
  if (!weights_host.ok()) return weights_host.status();
  return MakeEpochStart(planned.epoch, /*planned=*/true, world_size, *std::move(base_host),
                        *std::move(weights_host), std::move(loss_stats), 0);
}

bool Job::Publish(const PlannedEpoch& planned, std::shared_ptr<const BackendWeights> new_base,
                  std::optional<JobJournal::EpochStart> kept, bool snapshot_follows) {
  {
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) return false;  // Closed meanwhile.
    if (snapshot_follows) snapshot_unscheduled_ = true;
    if (kept.has_value()) {
      // A re-upload replaces epoch 0's start; after a rewind, the forgotten epochs are gone.
      while (!kept_.empty() && kept_.back().epoch >= kept->epoch) kept_.pop_back();
      kept_.push_back(*std::move(kept));
      while (kept_.size() > config_.rewind_epochs) kept_.pop_front();
    }
    epoch_ = planned.epoch;
    phase_ = Serving{planned.view};
    if (new_base != nullptr) base_ = std::move(new_base);
    weight_summary_ = planned.weight_summary;
    last_plan_ms_ = planned.plan_ms;
    last_recompute_ms_ = planned.recompute_ms;
    // The deal (its number and world size) is the one EndEpoch, a rewind or a resize of an
    // epoch awaiting its upload left.
    deal_length_ = planned.view.plan->size();
    if (deal_ == 0) start_world_size_ = shard_.world_size;  // Not a re-upload after a resize.
    ranks_.assign(shard_.world_size, RankState());
    ranks_ended_ = 0;
    replaced_deal_started_ = false;
  }
  LOG(INFO) << "event=epoch_opened job=" << name_ << " epoch=" << planned.epoch
            << " recompute_ms=" << planned.recompute_ms << " plan_ms=" << planned.plan_ms;
  planner_.PlanAhead(planned);
  return true;
}

void Job::FinishPlanningNext(absl::StatusOr<PlannedEpoch> planned) {
  // The epoch being planned: EndEpoch made it current when it entered Planning.
  const uint64_t epoch = [&] {
    absl::MutexLock lock(&mu_);
    return epoch_;
  }();
  absl::Status status = planned.status();
  std::shared_ptr<const BackendWeights> base;
  uint32_t world_size = 0;
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    if (std::holds_alternative<Closed>(phase_)) return;  // Nothing is published.
    base = base_;
    world_size = shard_.world_size;
  }
  // With a journal, the snapshot opening the epoch is written after the epoch is published
  // (ranks are served meanwhile): its loss statistics are derived from the previous snapshot and
  // the closed epochs' logs (nothing is copied on the boundary's path). Until it is committed,
  // recovery replays the same logs from the previous snapshot.
  if (status.ok() && journal_ != nullptr) status = journal_->OpenEpoch(epoch);
  std::optional<JobJournal::EpochStart> kept;
  if (status.ok() && journal_ == nullptr) {
    absl::StatusOr<std::optional<JobJournal::EpochStart>> start =
        StartToKeep(*planned, base, world_size);
    status = start.status();
    if (status.ok()) kept = *std::move(start);
  }
  if (!status.ok()) {
    // Inputs were validated on the way in, so this is a server bug, a failed write or a device
    // error; keep it visible. Waiting readers wake up (the phase is part of their condition)
    // and fail with INTERNAL.
    LOG(ERROR) << "job '" << name_ << "': planning epoch " << epoch << " failed: " << status;
    absl::MutexLock lock(&mu_);
    if (IsPlanning()) phase_ = Failed{status};
    return;
  }
  if (!Publish(*planned, nullptr, std::move(kept), /*snapshot_follows=*/journal_ != nullptr) ||
      journal_ == nullptr) {
    return;
  }
  // However this ends (scheduled, or the job failed), a waiting rewind may go on.
  absl::Cleanup settled = [this] {
    absl::MutexLock lock(&mu_);
    snapshot_unscheduled_ = false;
  };
  // The snapshot's weights as host vectors, copied here after the publication (from a device:
  // off the boundary's path; the CPU backend's own vectors: no copy).
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> base_host = HostWeights(base);
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> weights_host =
      HostWeights(planned->view.weights);
  status = base_host.ok() ? weights_host.status() : base_host.status();
  if (!status.ok()) {
    LOG(ERROR) << "job '" << name_ << "': copying the weights of epoch " << epoch
               << " for its snapshot failed: " << status;
    absl::MutexLock lock(&mu_);
    if (!std::holds_alternative<Closed>(phase_)) phase_ = Failed{status, "snapshotting"};
    return;
  }
  JobJournal::EpochStart start = MakeEpochStart(
      epoch, /*planned=*/true, world_size, *std::move(base_host), *std::move(weights_host), {}, 0);
  if (config_.policy.loss != LossWeightKind::kNone) {
    start.loss_stats_from_logs =
        JobJournal::EpochStart::LossTableParams{config_.plan.num_samples, config_.policy.ema_decay};
  }
  // Off this thread too, so that a short epoch's boundary never waits for the previous snapshot.
  journal_->ScheduleEpochSnapshot(std::move(start));
}

// ---- Shards -------------------------------------------------------------------------------------

bool Job::Settled(uint64_t epoch) const {
  return std::holds_alternative<Closed>(phase_) || std::holds_alternative<Failed>(phase_) ||
         epoch < epoch_ || epoch > epoch_ + 1 ||
         (epoch == epoch_ && std::holds_alternative<Serving>(phase_));
}

absl::StatusOr<ShardLease> Job::AcquireShard(uint64_t epoch, uint32_t deal, uint32_t rank,
                                             uint32_t world_size, absl::Time deadline,
                                             const std::function<bool()>& cancelled) {
  if (absl::Status s = CheckRank(ShardSpec{world_size}, rank); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (job '", name_, "')"));
  }
  absl::MutexLock lock(&mu_);
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Settled(epoch); };
  // Wait for the epoch's plan: the current one while planned, or the next one. In slices, so
  // that a caller that went away is noticed.
  const absl::Condition ready(&settled);
  while (!mu_.AwaitWithDeadline(
      ready, cancelled ? std::min(deadline, absl::Now() + kCancelPoll) : deadline)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("epoch ", epoch, " of job '", name_,
                       "' was not served before the deadline: ", WhyNotServing(epoch)));
    }
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat("the caller went away while waiting for epoch ",
                                               epoch, " of job '", name_, "'"));
    }
  }
  // A closed or failed job answers so first (UNAVAILABLE says retry; INTERNAL, tell the operator).
  const bool settled_for_good =
      std::holds_alternative<Closed>(phase_) || std::holds_alternative<Failed>(phase_);
  if (epoch > epoch_ + 1 && !settled_for_good) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch = ", epoch, " of job '", name_, "' is not open; the current epoch is ",
                     epoch_, " (shards are served for the current and the next epoch)"));
  }
  if (absl::Status s = CheckEpochOpen(epoch); !s.ok()) return s;
  if (absl::Status s = CheckDeal(epoch, deal); !s.ok()) return s;
  if (absl::Status s = CheckWorldSize(epoch, world_size); !s.ok()) return s;
  ShardLease lease;
  lease.view = std::get<Serving>(phase_).view;
  lease.shard = shard_;
  lease.shard_length = *ShardLength(deal_length_, shard_, rank);  // The rank was checked.
  return lease;
}

absl::Status Job::RecordStreamed(uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position) {
  absl::MutexLock lock(&mu_);
  if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
  if (epoch == epoch_ && deal == deal_ && std::holds_alternative<Serving>(phase_) &&
      rank < ranks_.size() && position > ranks_[rank].streamed) {
    // Progress reporting only (never synced on its own): a failed write does not stop the
    // stream. The journal keeps the error, so nothing further is acknowledged.
    if (journal_ != nullptr) {
      if (absl::Status s = journal_->LogStreamed(epoch, deal, rank, position); !s.ok()) {
        LOG_EVERY_N(WARNING, 1000) << "job '" << name_ << "': stream progress not logged: " << s;
      }
    }
    // Indices were handed out: a re-upload must no longer replace the plan they came from.
    ranks_[rank].streamed = position;
  }
  return absl::OkStatus();
}

// ---- Losses -------------------------------------------------------------------------------------

absl::Status Job::ReportLosses(const LossBatchView& batch, v1::LossReportSummary* summary) {
  auto named = [this](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (job '", name_, "')"));
  };
  // What does not depend on the deal, checked before taking the lock.
  if (absl::Status s = ValidateLossBatch(batch, config_.plan.num_samples); !s.ok()) {
    return named(s);
  }
  // Encoded before taking the lock (other ranks report concurrently).
  std::optional<JobJournal::EncodedLosses> record;
  if (journal_ != nullptr) record.emplace(batch);

  absl::MutexLock lock(&mu_);
  if (batch.epoch < epoch_ && !std::holds_alternative<Closed>(phase_)) {
    summary->set_stale(summary->stale() + batch.indices.size());
    // Keep stale_epochs ascending without repeats (batches of one stream may come in any order).
    auto* epochs = summary->mutable_stale_epochs();
    const auto at = std::lower_bound(epochs->begin(), epochs->end(), batch.epoch);
    if (at == epochs->end() || *at != batch.epoch) {
      const int pos = static_cast<int>(at - epochs->begin());
      epochs->Add(batch.epoch);
      std::rotate(epochs->begin() + pos, epochs->end() - 1, epochs->end());
    }
    return absl::OkStatus();
  }
  if (absl::Status s = CheckEpochOpen(batch.epoch); !s.ok()) return s;
  if (absl::Status s = CheckDeal(batch.epoch, batch.deal); !s.ok()) return named(s);
  // Each index must be the one this rank was served at its position: a loss for another rank's
  // sample would otherwise take that sample's one loss of the epoch. Checked under the lock
  // against the deal's plan (one plan read per pair, as the table's own write).
  const Plan& plan = *std::get<Serving>(phase_).view.plan;
  const uint64_t m = deal_length_;
  absl::StatusOr<uint64_t> shard_length = ShardLength(m, shard_, batch.rank);
  if (!shard_length.ok()) return named(shard_length.status());  // The rank.
  if (absl::Status s = ValidateLossPositions(batch, *shard_length); !s.ok()) return named(s);
  RankState& rank = ranks_[batch.rank];
  const size_t size = batch.indices.size();
  size_t fresh = 0;
  for (size_t k = 0; k < size; ++k) {
    const uint64_t position = batch.position(k);
    const uint64_t served = plan[ShardToPlanPosition(m, shard_, batch.rank, position)];
    if (served != batch.indices[k]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", k, "] = ", batch.indices[k], " was not served to rank ", batch.rank, " at ",
          batch.consecutive ? absl::StrCat("position ", position, " (first_position + ", k, ")")
                            : absl::StrCat("positions[", k, "] = ", position),
          " of epoch ", batch.epoch, batch.deal > 0 ? absl::StrCat(" (deal ", batch.deal, ")") : "",
          " (that position holds index ", served,
          "): report each loss under the index and the "
          "shard position the rank was served (job '",
          name_, "')"));
    }
    fresh += !rank.reported.Contains(position);
  }
  if (fresh == 0) {  // A retry, or positions a restarted trainer trained again.
    summary->set_duplicates(summary->duplicates() + size);
    return absl::OkStatus();
  }
  if (record.has_value()) {
    if (absl::Status s = journal_->LogLosses(*record); !s.ok()) return s;
  }
  // The pairs at positions new to the rank, in arrival order: the whole batch unless some
  // position was reported before (or twice in it); then copied from the first one that was.
  absl::Span<const uint64_t> fresh_indices = batch.indices;
  absl::Span<const float> fresh_losses = batch.losses;
  std::vector<uint64_t> some_indices;
  std::vector<float> some_losses;
  bool all_fresh = true;
  for (size_t k = 0; k < size; ++k) {
    const bool inserted = rank.reported.Insert(batch.position(k), *shard_length);
    if (!inserted && all_fresh) {
      all_fresh = false;
      some_indices.assign(batch.indices.begin(), batch.indices.begin() + k);
      some_losses.assign(batch.losses.begin(), batch.losses.begin() + k);
    } else if (inserted && !all_fresh) {
      some_indices.push_back(batch.indices[k]);
      some_losses.push_back(batch.losses[k]);
    }
  }
  if (!all_fresh) {
    fresh_indices = some_indices;
    fresh_losses = some_losses;
  }
  uint64_t accepted = fresh_indices.size();
  if (losses_ != nullptr) {
    // One call per batch; the statistics keep the first loss of a sample in the epoch (a
    // second position of the same index is a duplicate).
    absl::StatusOr<uint64_t> applied = losses_->Apply(batch.epoch, fresh_indices, fresh_losses);
    if (!applied.ok()) {
      // A device error: the statistics are lost to this job. Nothing is acknowledged.
      LOG(ERROR) << "job '" << name_ << "': applying losses of epoch " << batch.epoch
                 << " failed: " << applied.status();
      phase_ = Failed{applied.status(), "applying the losses of"};
      return applied.status();
    }
    accepted = *applied;
  }
  rank.accepted += accepted;
  summary->set_accepted(summary->accepted() + accepted);
  summary->set_duplicates(summary->duplicates() + (size - accepted));
  return absl::OkStatus();
}

// ---- Epochs -------------------------------------------------------------------------------------

absl::StatusOr<v1::EndEpochResponse> Job::EndEpoch(uint64_t epoch, uint32_t deal, uint32_t rank) {
  auto named = [this](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (job '", name_, "')"));
  };
  v1::EndEpochResponse response;
  RecomputeInputs inputs;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (epoch < epoch_ && !std::holds_alternative<Closed>(phase_)) {
      // Already closed (every rank ended it): a retry, maybe of a call whose sync failed or is
      // still running. Acknowledge it only once the closing record is durable.
      response.set_ranks_ended(static_cast<uint32_t>(ranks_.size()));
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    if (absl::Status s = CheckEpochOpen(epoch); !s.ok()) return s;
    if (absl::Status s = CheckDeal(epoch, deal); !s.ok()) return named(s);
    if (absl::Status s = CheckRank(shard_, rank); !s.ok()) return named(s);
    RankState& state = ranks_[rank];
    if (!state.ended) {
      if (journal_ != nullptr) {
        if (absl::Status s = journal_->LogRankEnded(epoch, deal, rank); !s.ok()) return s;
      }
      state.ended = true;
      ++ranks_ended_;
    }
    response.set_ranks_ended(ranks_ended_);
    if (ranks_ended_ < shard_.world_size) {
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    // The last rank: close the epoch. Epoch e + 1 becomes current, planned in the background
    // from inputs that stay unchanged while the job is Planning.
    response.set_epoch_closed(true);
    inputs.base = base_;
    inputs.current = std::get<Serving>(phase_).view.weights;
    epoch_ = epoch + 1;
    deal_ = 0;  // The next epoch is dealt whole to the ranks that ended this one.
    deal_length_ = config_.plan.samples_per_epoch;
    phase_ = Planning{std::nullopt, absl::Now()};
  }
  LOG(INFO) << "event=epoch_closed job=" << name_ << " epoch=" << epoch;
  // The recompute reads the statistics off the lock while the job is Planning. Closed meanwhile: no
  // planner starts (waiters were woken with the close reason).
  if (absl::StatusOr<const BackendLossStats*> losses = LossesWhilePlanning(); losses.ok()) {
    inputs.losses = *losses;
    // False once Close stopped the planner: waiters were woken with the close reason.
    planner_.StartNext(epoch, std::move(inputs), [this](absl::StatusOr<PlannedEpoch> planned) {
      FinishPlanningNext(std::move(planned));
    });
  }
  // Durable before it is acknowledged. The epoch closed in memory either way, so the planner
  // starts first: if the sync fails, this call fails (not acknowledged) but the job moves on.
  if (absl::Status s = Sync(); !s.ok()) return s;
  return response;
}

// ---- Rewinds ------------------------------------------------------------------------------------

std::vector<uint64_t> Job::RewindableEpochs() const {
  if (config_.rewind_epochs == 0) return {};
  if (journal_ == nullptr) {
    std::vector<uint64_t> epochs;
    absl::MutexLock lock(&mu_);
    for (const JobJournal::EpochStart& start : kept_) epochs.push_back(start.epoch);
    return epochs;
  }
  absl::StatusOr<std::vector<uint64_t>> epochs = journal_->KeptEpochStarts();
  if (!epochs.ok()) {
    LOG(WARNING) << "job '" << name_ << "': listing its snapshots failed: " << epochs.status();
    return {};
  }
  return *std::move(epochs);
}

absl::StatusOr<JobJournal::EpochStart> Job::FindStart(uint64_t epoch) const {
  const std::vector<uint64_t> kept = RewindableEpochs();
  if (std::find(kept.begin(), kept.end(), epoch) == kept.end()) {
    const std::string flag = absl::StrCat(" (--rewind_epochs = ", config_.rewind_epochs, ")");
    if (kept.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", name_, "' keeps no epoch start to rewind to", flag));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch = ", epoch, " of job '", name_, "': its start is not kept; the oldest kept is ",
        kept.front(), " (kept: ", absl::StrJoin(kept, ", "), ")", flag));
  }
  if (journal_ == nullptr) {
    absl::MutexLock lock(&mu_);
    for (const JobJournal::EpochStart& start : kept_) {
      if (start.epoch == epoch) return start;  // A copy: the kept one stays for another rewind.
    }
    return absl::FailedPreconditionError(
        absl::StrCat("epoch = ", epoch, " of job '", name_, "': its start is no longer kept"));
  }
  absl::StatusOr<JobJournal::EpochStart> read = journal_->ReadEpochStart(epoch);
  if (!read.ok()) return read.status();
  if (!read->planned) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch = ", epoch, " of job '", name_, "' was never planned"));
  }
  return read;
}

absl::Status Job::Rewind(uint64_t epoch) {
  std::optional<EpochView> serving;
  {
    absl::MutexLock lock(&mu_);
    // After a planning in progress (an epoch closing) and the scheduling of its snapshot: then
    // the current epoch is settled, on disk too.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !IsPlanning() && !snapshot_unscheduled_;
    };
    mu_.Await(absl::Condition(&settled));
    if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    if (std::holds_alternative<AwaitingUpload>(phase_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", name_, "' has no plan yet (it waits for its upload): nothing to rewind"));
    }
    if (epoch > epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "' is after the current epoch ",
                       epoch_, ": a rewind goes back to the start of an epoch reached"));
    }
    // Planning from here on: losses, EndEpoch and uploads wait or are refused meanwhile.
    if (const auto* s = std::get_if<Serving>(&phase_)) serving = s->view;
    phase_ = Planning{serving, absl::Now()};
  }
  // Until the journal is rewound, a failure leaves the job as it was.
  auto undo = [&](absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (IsPlanning()) {
      if (serving.has_value()) {
        phase_ = Serving{*serving};
      } else {
        phase_ = Failed{s};  // It was Failed: it stays so.
      }
    }
    return s;
  };
  absl::StatusOr<JobJournal::EpochStart> start = FindStart(epoch);
  if (!start.ok()) return undo(start.status());
  // The start's weights as the backend's again. One vector for both (no loss policy, kept in
  // memory): one object, as before the rewind.
  absl::StatusOr<std::shared_ptr<const BackendWeights>> weights = WeightsFromHost(start->weights);
  if (!weights.ok()) return undo(weights.status());
  absl::StatusOr<std::shared_ptr<const BackendWeights>> base =
      start->base == start->weights ? *weights : WeightsFromHost(start->base);
  if (!base.ok()) return undo(base.status());
  absl::StatusOr<PlannedEpoch> planned = planner_.Plan(epoch, *weights);
  if (!planned.ok()) return undo(planned.status());
  if (journal_ != nullptr) {
    if (absl::Status s = journal_->Rewind(epoch); absl::IsNotFound(s)) {
      return undo(absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "': its start is no longer kept")));
    } else if (!s.ok()) {
      LOG(ERROR) << "job '" << name_ << "': rewinding to epoch " << epoch << " failed: " << s;
      absl::MutexLock lock(&mu_);
      if (IsPlanning()) phase_ = Failed{s, "rewinding to"};
      return s;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) {  // Closed meanwhile.
      if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    }
    // The start's statistics (none: no sample seen then).
    if (losses_ != nullptr) {
      if (absl::Status s = losses_->Restore(start->loss_stats); !s.ok()) {
        phase_ = Failed{s, "rewinding to"};
        return s;
      }
    }
    while (!kept_.empty() && kept_.back().epoch > epoch) kept_.pop_back();
    // The epoch's start as it was: deal 0 to the ranks it started with.
    if (start->world_size != 0) shard_.world_size = start->world_size;
    deal_ = 0;
  }
  if (!Publish(*planned, *std::move(base))) {
    absl::MutexLock lock(&mu_);
    if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
  }
  LOG(INFO) << "event=job_rewound job=" << name_ << " epoch=" << epoch;
  return absl::OkStatus();
}

// ---- Resizes ------------------------------------------------------------------------------------

absl::StatusOr<v1::Job> Job::Resize(uint64_t epoch, uint32_t world_size) {
  if (world_size == 0 || world_size > static_cast<uint32_t>(v1::MAX_WORLD_SIZE)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size = ", world_size, " is outside [1, MAX_WORLD_SIZE = ", v1::MAX_WORLD_SIZE,
        "] (job '", name_, "')"));
  }
  EpochView current;
  ShardSpec dealt;
  std::vector<RankState> progress;
  bool replaced_started = false;  // Whether the deal being replaced had started.
  {
    absl::MutexLock lock(&mu_);
    // After a planning in progress (an epoch closing, another resize): the deal is settled.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !IsPlanning(); };
    mu_.Await(absl::Condition(&settled));
    if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    if (epoch != epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "' is not the current epoch ", epoch_,
                       ": a group resizes the epoch it is about to read"));
    }
    if (std::holds_alternative<AwaitingUpload>(phase_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", name_,
                       "' has no plan yet (it waits for its upload): nothing is dealt to "
                       "resize; upload first"));
    }
    if (absl::Status s = CheckEpochOpen(epoch); !s.ok()) return s;  // Failed.
    if (world_size == shard_.world_size) {  // A retry, or another rank of the same group.
      v1::Job job;
      DescribeLocked(&job);
      return job;
    }
    const bool any_done = std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) {
      return r.ended || r.reported.count() > 0;
    });
    // Positions streamed only (not done) are dealt again, but they were handed out.
    replaced_started =
        std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.Started(); });
    if (!any_done) {
      // Nothing of the epoch is done: the next deal deals the same positions.
      if (absl::Status s =
              ApplyResize(std::get<Serving>(phase_).view, world_size, replaced_started);
          !s.ok()) {
        return s;
      }
    } else {
      // Computed off the lock (linear in M); meanwhile the epoch waits as Planning.
      current = std::get<Serving>(phase_).view;
      dealt = shard_;
      progress = std::move(ranks_);
      ranks_.assign(dealt.world_size, RankState());
      Planning planning{current, absl::Now()};
      planning.redealing = true;
      phase_ = std::move(planning);
    }
  }
  if (current.plan != nullptr) {
    std::vector<RankDone> done;
    done.reserve(progress.size());
    for (const RankState& r : progress) done.push_back(RankDone{&r.reported, r.ended});
    auto remaining =
        std::make_shared<const Plan>(RemainingPlan(*current.plan, dealt, absl::MakeSpan(done)));
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) {  // Only Close leaves this Planning.
      if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
    }
    EpochView view = current;
    view.plan = std::move(remaining);
    phase_ = Serving{current};  // ApplyResize replaces it; if it fails, the deal stays as it was.
    if (absl::Status s = ApplyResize(std::move(view), world_size, replaced_started); !s.ok()) {
      ranks_ = std::move(progress);
      return s;
    }
  }
  if (absl::Status s = Sync(); !s.ok()) return s;
  return Describe();
}

absl::Status Job::ApplyResize(EpochView view, uint32_t world_size, bool replaced_started) {
  if (journal_ != nullptr) {
    if (absl::Status s = journal_->LogResized(epoch_, world_size); !s.ok()) return s;
  }
  // The replaced deal's progress is cleared below; that the epoch had started is not.
  if (replaced_started) replaced_deal_started_ = true;
  const uint32_t from = shard_.world_size;
  ++deal_;
  shard_.world_size = world_size;
  deal_length_ = view.plan->size();
  phase_ = Serving{std::move(view)};
  ranks_.assign(world_size, RankState());
  ranks_ended_ = 0;
  LOG(INFO) << "event=job_resized job=" << name_ << " epoch=" << epoch_ << " deal=" << deal_
            << " from_world_size=" << from << " world_size=" << world_size
            << " positions=" << deal_length_;
  return absl::OkStatus();
}

// ---- Status -------------------------------------------------------------------------------------

v1::JobStatus Job::Status() const {
  v1::JobStatus status;
  status.set_backend(backend_->name());
  for (uint64_t e : RewindableEpochs()) status.mutable_job()->add_rewindable_epochs(e);
  absl::MutexLock lock(&mu_);
  DescribeLocked(status.mutable_job());
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    v1::RankProgress* p = status.add_ranks();
    p->set_rank(r);
    p->set_indices_streamed(ranks_[r].streamed);
    p->set_losses_accepted(ranks_[r].accepted);
    p->set_ended(ranks_[r].ended);
  }
  v1::WeightStats* w = status.mutable_weights();
  w->set_min(weight_summary_.min);
  w->set_max(weight_summary_.max);
  w->set_mean(weight_summary_.mean);
  w->set_effective_sample_size(weight_summary_.effective_sample_size);
  w->set_zero_count(weight_summary_.zero_count);
  status.set_last_recompute_ms(last_recompute_ms_);
  status.set_last_plan_ms(last_plan_ms_);
  // While planning, the planner reads the table off the lock; the count is not written then.
  status.set_samples_seen(losses_ != nullptr ? losses_->SamplesSeen() : 0);
  return status;
}

}  // namespace samplerd
