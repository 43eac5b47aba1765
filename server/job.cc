// Job: the phase machine over an epoch's life (job.h has the diagram), holding the current deal
// (current_deal.h) and the epoch history (epoch_history.h) as parts. Sections: life cycle, the
// phase machine and its checks, uploads, epochs opening (planning and publishing), shards,
// losses, epochs closing, rewinds, resizes, status. Restore is in job_restore.cc.
#include "server/job.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "kernels/loss_policies.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_weights.h"

namespace samplerd {

using phase::AwaitingUpload;
using phase::Closed;
using phase::Failed;
using phase::Planning;
using phase::Serving;
using Purpose = phase::Planning::Purpose;

namespace {

// A Planning for `purpose` that serves `epoch`, in its deal `deal` to `world_size` ranks, once
// published.
Planning StartPlanning(Purpose purpose, uint64_t epoch, uint32_t deal, uint32_t world_size,
                       std::optional<phase::Settled> previous = std::nullopt) {
  Planning planning;
  planning.purpose = purpose;
  planning.since = absl::Now();
  planning.previous = std::move(previous);
  planning.epoch = epoch;
  planning.deal = deal;
  planning.world_size = world_size;
  return planning;
}

}  // namespace

// ---- Life cycle ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Job>> Job::Create(std::string name, JobConfig config,
                                                 ComputeBackend* backend,
                                                 std::unique_ptr<JobJournal> journal) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) return s;
  std::unique_ptr<EpochHistory> history = journal != nullptr
                                              ? MakeJournalHistory(name, config, std::move(journal))
                                              : MakeInMemoryHistory(name, config);
  std::unique_ptr<Job> job(
      new Job(std::move(name), std::move(config), backend, std::move(history)));
  absl::Status s = job->MakeLossStats();
  if (s.ok()) {
    // A job plans at once unless it waits for an upload (base weights, irreducible losses).
    s = job->config_.policy.base == BaseWeightKind::kUniform &&
                !UsesIrreducibleLosses(job->config_.policy)
            ? job->InstallBaseAndPlan({})
            : job->history_->AwaitUpload();
  }
  if (!s.ok()) {
    job->Close(s);
    if (absl::Status r = job->RemovePersistedState(); !r.ok()) LOG(WARNING) << r;
    return s;
  }
  return job;
}

Job::Job(std::string name, JobConfig config, ComputeBackend* backend,
         std::unique_ptr<EpochHistory> history)
    : name_(std::move(name)),
      config_(std::move(config)),
      backend_(backend),
      history_(std::move(history)),
      planner_(config_, backend_),
      // From the clock: incarnations issued before a restart are not issued again after it.
      claims_(name_, static_cast<uint64_t>(std::max<int64_t>(absl::ToUnixMicros(absl::Now()), 1))),
      deal_(name_, config_.shard, config_.plan.samples_per_epoch) {
  if (config_.mixture != nullptr && config_.mixture->online()) {
    group_losses_ = std::make_unique<mixture::GroupLosses>(config_.mixture->layout.groups());
  }
}

absl::Status Job::MakeLossStats() {
  if (!UsesLossStats(config_.policy)) return absl::OkStatus();
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
    if (CloseReason().ok()) Enter(Closed{reason});
  }
  claims_.Close(reason);
  // A planner task finishing now finds the job closed and publishes nothing.
  planner_.Stop();
}

absl::StatusOr<uint64_t> Job::ClaimRank(uint32_t rank, uint32_t world_size, bool peer,
                                        RankClaims::Ended ended, uint64_t replaces) {
  if (absl::Status s = CheckRank(ShardSpec{world_size}, rank); !s.ok()) return Named(s);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CloseReason(); !s.ok()) return s;
  if (absl::Status s = deal_.CheckWorldSize(epoch_, world_size); !s.ok()) return s;
  // Under mu_: a Close after this point ends the claim (RankClaims::Close) or refuses it.
  return claims_.Claim(rank, peer, std::move(ended), replaces);
}

absl::Status Job::Sync() { return history_->Sync(); }

absl::Status Job::RemovePersistedState() { return history_->Remove(); }

// ---- The phase machine --------------------------------------------------------------------------

void Job::Enter(JobPhase next) {
  CHECK(MayTransition(phase_, next)) << "job '" << name_ << "': " << PhaseName(phase_) << " -> "
                                     << PhaseName(next) << " is not a transition of job.h";
  phase_ = std::move(next);
}

void Job::GoBack(const absl::Status& error) {
  auto* planning = std::get_if<Planning>(&phase_);
  if (planning == nullptr) return;  // Closed meanwhile.
  if (!planning->previous.has_value()) {
    Enter(Failed{error});
    return;
  }
  Enter(FromSettled(*std::move(planning->previous)));
}

absl::Status Job::CloseReason() const {
  if (const auto* closed = std::get_if<Closed>(&phase_)) return closed->reason;
  return absl::OkStatus();
}

absl::Status Job::Interrupted() const {
  if (absl::Status s = CloseReason(); !s.ok()) return s;
  return CheckEpochOpen(epoch_);  // Failed: INTERNAL naming the failure.
}

absl::Status Job::Named(const absl::Status& s) const {
  return absl::Status(s.code(), absl::StrCat(s.message(), " (job '", name_, "')"));
}

std::string Job::NoPlanYet() const {
  std::vector<std::string> missing;
  if (config_.policy.base != BaseWeightKind::kUniform && base_ == nullptr &&
      !pending_base_.has_value()) {
    missing.push_back(config_.policy.base == BaseWeightKind::kStatic ? "UploadWeights"
                                                                     : "UploadLabels");
  }
  if (UsesIrreducibleLosses(config_.policy) && irreducible_ == nullptr) {
    missing.push_back("UploadIrreducibleLosses");
  }
  return absl::StrCat("it has no plan yet: it waits for ", absl::StrJoin(missing, " and "));
}

absl::Status Job::CheckEpochOpen(uint64_t epoch) const {
  if (absl::Status s = CloseReason(); !s.ok()) return s;
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

std::string Job::WhyNotServing(uint64_t epoch) const {
  if (std::holds_alternative<AwaitingUpload>(phase_)) return NoPlanYet();
  if (const auto* planning = std::get_if<Planning>(&phase_)) {
    return absl::StrCat(
        "epoch ", epoch_, " is still being ",
        planning->purpose == Purpose::kRedeal ? "dealt again after a resize" : "planned", ", for ",
        absl::FormatDuration(absl::Now() - planning->since));
  }
  if (std::holds_alternative<Serving>(phase_) && epoch == epoch_ + 1) {
    return absl::StrCat("epoch ", epoch_, " is still open: ", deal_.RanksNotEnded());
  }
  return absl::StrCat("the current epoch is ", epoch_);
}

absl::StatusOr<const BackendLossStats*> Job::LossesWhilePlanning() const {
  absl::MutexLock lock(&mu_);
  // Closed or failed: the statistics are not to be read (nothing is published then).
  if (std::holds_alternative<Closed>(phase_) || std::holds_alternative<Failed>(phase_)) {
    return Interrupted();
  }
  // Called right after the job entered a Planning: only that Planning's owner leaves it
  // (Publish, or Failed), and nothing writes the statistics until it has published. A closed
  // job's statistics are never written again either.
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
  // A later epoch is dealt whole to the current world size.
  absl::StatusOr<uint64_t> length =
      e == epoch_ ? deal_.ShardLength(rank)
                  : ShardLength(config_.plan.samples_per_epoch, deal_.shard(), rank);
  if (!length.ok()) return Named(length.status());
  job.set_shard_length(*length);
  return job;
}

void Job::DescribeLocked(v1::Job* job) const {
  job->set_name(name_);
  *job->mutable_spec() = config_.normalized;
  job->set_plan_ready(std::holds_alternative<Serving>(phase_));
  if (const auto* planning = std::get_if<Planning>(&phase_)) {
    // The epoch (and deal) being planned, not the one it follows.
    job->set_current_epoch(planning->epoch);
    job->set_world_size(planning->world_size);
    job->set_deal(planning->deal);
    return;
  }
  job->set_current_epoch(epoch_);
  job->set_world_size(deal_.world_size());
  job->set_deal(deal_.number());
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
  if (absl::Status s = CheckLossGroups(config_.policy, weights); !s.ok()) return s;
  return BaseUploaded(std::move(weights));
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
  if (absl::Status s = CheckLossGroups(config_.policy, base); !s.ok()) return s;
  return BaseUploaded(std::move(base));
}

absl::Status Job::BaseUploaded(std::vector<float> base) {
  if (UsesIrreducibleLosses(config_.policy)) {
    absl::MutexLock lock(&mu_);
    if (irreducible_ == nullptr) {  // Then the job awaits its uploads: it has no plan.
      if (absl::Status s = CheckUploadAllowed(); !s.ok()) return s;
      pending_base_ = std::move(base);
      return absl::OkStatus();
    }
  }
  return InstallBaseAndPlan(std::move(base));
}

absl::Status Job::UploadIrreducibleLosses(std::vector<float> losses) {
  if (!UsesIrreducibleLosses(config_.policy)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name_, "' has policy.loss = ",
        v1::LossPolicy_Name(config_.normalized.policy().loss()),
        "; UploadIrreducibleLosses needs REDUCIBLE_LOSS"));
  }
  if (absl::Status s = ValidateIrreducibleLosses(losses, config_.plan.num_samples); !s.ok()) {
    return s;
  }
  auto uploaded = std::make_shared<const std::vector<float>>(std::move(losses));
  std::shared_ptr<const std::vector<float>> previous;
  std::optional<std::vector<float>> base;  // Set: plan epoch 0 with it.
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckUploadAllowed(); !s.ok()) return s;
    if (config_.policy.base == BaseWeightKind::kUniform) {
      base.emplace();
    } else if (pending_base_.has_value()) {
      base = *pending_base_;  // A copy: kept until the plan is published.
    } else if (base_ != nullptr) {  // A re-upload: epoch 0 is planned again with its base.
      absl::StatusOr<std::shared_ptr<const std::vector<float>>> host = base_->ToHost();
      if (!host.ok()) return host.status();
      base = **host;
    }
    previous = std::exchange(irreducible_, uploaded);
  }
  if (!base.has_value()) return absl::OkStatus();  // Waits for the base weights.
  absl::Status s = InstallBaseAndPlan(*std::move(base));
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    pending_base_.reset();
  } else if (irreducible_ == uploaded) {
    irreducible_ = std::move(previous);  // Nothing changes on error.
  }
  return s;
}

absl::Status Job::CheckUploadAllowed() const {
  if (absl::Status s = CloseReason(); !s.ok()) return s;
  const bool serving = std::holds_alternative<Serving>(phase_);
  if (!(std::holds_alternative<AwaitingUpload>(phase_) || serving) || Started()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name_, "' already started (epoch ", epoch_,
        "); weights, labels and irreducible losses can only be uploaded before the first shard "
        "position is streamed, loss reported or epoch ended"));
  }
  return absl::OkStatus();
}

absl::Status Job::InstallBaseAndPlan(std::vector<float> base) {
  EpochHistory::Opening opening;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckUploadAllowed(); !s.ok()) return s;
    const auto* serving = std::get_if<Serving>(&phase_);
    // A re-upload withdraws the plan of epoch 0 until the new one is published: a loss or an
    // EndEpoch accepted against the old plan meanwhile would be wiped by the publication, or
    // would start planning epoch 1 concurrently with it. Planning also excludes a concurrent
    // upload. If it fails, the job goes back to the plan it served (or to awaiting an upload).
    phase::Settled previous = AwaitingUpload{};
    if (serving != nullptr) previous = *serving;
    Enter(StartPlanning(Purpose::kUpload, epoch_, deal_.number(), deal_.world_size(),
                        std::move(previous)));
    // The world size epoch 0 started with (deal 0's), not a resize's: epoch 0's log keeps the
    // resizes made since, which a restart replays on top of the snapshot, and a rewind to epoch
    // 0 deals it to the ranks it started with.
    opening.world_size = deal_.start_world_size();
    opening.irreducible = irreducible_;
  }
  // Creation with a UNIFORM base passes no weights: no base, uniform W_0. Uploaded weights
  // become the backend's (for the CPU the vector itself, no copy).
  absl::Status s;
  if (!base.empty()) {
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made =
        backend_->MakeWeights(std::move(base));
    if (made.ok()) {
      opening.base = *std::move(made);
    } else {
      s = made.status();
    }
  }
  absl::StatusOr<PlannedEpoch> planned =
      s.ok() ? planner_.Plan(0, opening.base) : absl::StatusOr<PlannedEpoch>(s);
  s = planned.status();
  if (s.ok()) AddWeightHistory(&*planned, nullptr);  // Epoch 0: the first entry.
  if (s.ok()) {
    absl::StatusOr<const BackendLossStats*> losses = LossesWhilePlanning();
    s = losses.status();  // Closed meanwhile: nothing is published.
    if (s.ok()) {
      opening.planned = &*planned;
      opening.losses = *losses;
      s = history_->BeforePublishing(opening);
    }
  }
  if (s.ok()) {
    if (Publish(*planned, opening.base)) return absl::OkStatus();
    absl::MutexLock lock(&mu_);  // Closed while planning: only Close leaves this Planning.
    return Interrupted();
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status closed = CloseReason(); !closed.ok()) return closed;  // Deleted meanwhile.
  GoBack(s);  // A failed re-upload leaves the published plan as it was.
  return s;
}

// ---- Epochs opening -----------------------------------------------------------------------------

bool Job::Publish(const PlannedEpoch& planned, std::shared_ptr<const BackendWeights> new_base,
                  bool snapshot_follows) {
  {
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) return false;  // Closed (or failed) meanwhile.
    if (snapshot_follows) snapshot_unscheduled_ = true;
    if (planned.weight_history != nullptr) weight_history_ = planned.weight_history;
    epoch_ = planned.epoch;
    Enter(Serving{planned.view});
    if (new_base != nullptr) base_ = std::move(new_base);
    weight_summary_ = planned.weight_summary;
    mixture_epoch_ = planned.view.mixture;
    last_plan_ms_ = planned.plan_ms;
    last_recompute_ms_ = planned.recompute_ms;
    // The deal (its number and world size) is the one EndEpoch, a rewind or a resize of an
    // epoch awaiting its upload left.
    deal_.ServeEpoch(planned.view.plan->size());
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
  EpochHistory::Opening opening;
  opening.by = EpochHistory::Opening::By::kEndEpoch;
  if (status.ok()) {
    absl::StatusOr<const BackendLossStats*> losses = LossesWhilePlanning();
    if (!losses.ok()) return;  // Closed or failed meanwhile: nothing is published.
    std::shared_ptr<const WeightHistory> history;  // Only Publish changes it: not while planning.
    {
      absl::MutexLock lock(&mu_);
      opening.base = base_;
      opening.irreducible = irreducible_;
      opening.world_size = deal_.world_size();
      history = weight_history_;
    }
    AddWeightHistory(&*planned, history.get());  // O(K): off the lock.
    opening.planned = &*planned;
    opening.losses = *losses;
  }
  if (status.ok()) status = history_->BeforePublishing(opening);
  if (!status.ok()) {
    // Inputs were validated on the way in, so this is a server bug, a failed write or a device
    // error; keep it visible. Waiting readers wake up (the phase is part of their condition)
    // and fail with INTERNAL.
    LOG(ERROR) << "job '" << name_ << "': planning epoch " << epoch << " failed: " << status;
    absl::MutexLock lock(&mu_);
    if (IsPlanning()) Enter(Failed{status});
    return;
  }
  if (!Publish(*planned, nullptr, /*snapshot_follows=*/true)) return;
  // However this ends (handed over, or the job failed), a waiting rewind may go on.
  absl::Cleanup settled = [this] {
    absl::MutexLock lock(&mu_);
    snapshot_unscheduled_ = false;
  };
  opening.losses = nullptr;  // Written again as soon as the epoch is served.
  if (absl::Status s = history_->AfterPublishing(opening); !s.ok()) {
    absl::MutexLock lock(&mu_);
    // A job that failed or closed meanwhile keeps its first cause.
    if (std::holds_alternative<Serving>(phase_) || IsPlanning()) {
      Enter(Failed{s, "snapshotting"});
    }
  }
}

void Job::AddWeightHistory(PlannedEpoch* planned, const WeightHistory* before) {
  if (planned->view.mixture == nullptr) return;
  planned->weight_history = WithEpochWeights(before, *planned->view.mixture->start);
}

// ---- Shards -------------------------------------------------------------------------------------

bool Job::Settled(uint64_t epoch) const {
  return std::holds_alternative<Closed>(phase_) || std::holds_alternative<Failed>(phase_) ||
         epoch < epoch_ || epoch > epoch_ + 1 ||
         (epoch == epoch_ && std::holds_alternative<Serving>(phase_));
}

absl::StatusOr<ShardLease> Job::AcquireShard(uint64_t epoch, uint32_t deal, uint32_t rank,
                                             uint32_t world_size, ShardCaller caller) {
  if (absl::Status s = CheckRank(ShardSpec{world_size}, rank); !s.ok()) return Named(s);
  if (!caller.observe) {
    if (absl::Status s = claims_.Check(rank, caller.incarnation); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (!Settled(epoch)) {
    return absl::DeadlineExceededError(absl::StrCat("epoch ", epoch, " of job '", name_,
                                                    "' is not served yet: ", WhyNotServing(epoch)));
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
  if (absl::Status s = deal_.CheckDeal(epoch, deal); !s.ok()) return s;
  if (absl::Status s = deal_.CheckWorldSize(epoch, world_size); !s.ok()) return s;
  ShardLease lease;
  lease.view = std::get<Serving>(phase_).view;
  lease.shard = deal_.shard();
  lease.shard_length = *deal_.ShardLength(rank);  // The rank was checked.
  lease.irreducible = irreducible_;
  return lease;
}

absl::Status Job::RecordStreamed(uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CloseReason(); !s.ok()) return s;
  if (epoch == epoch_ && std::holds_alternative<Serving>(phase_) &&
      deal_.Advances(deal, rank, position)) {
    // Progress reporting only (never synced on its own): a failed write does not stop the
    // stream. The journal keeps the error, so nothing further is acknowledged.
    if (absl::Status s = changes_.Streamed(epoch, rank, position); !s.ok()) {
      LOG_EVERY_N(WARNING, 1000) << "job '" << name_ << "': stream progress not logged: " << s;
    }
  }
  return absl::OkStatus();
}

// ---- Losses -------------------------------------------------------------------------------------

absl::Status Job::ReportLosses(const LossBatchView& batch, v1::LossReportSummary* summary) {
  if (absl::Status s = claims_.Check(batch.rank, batch.incarnation); !s.ok()) return s;
  // What does not depend on the deal, checked before taking the lock.
  if (absl::Status s = ValidateLossBatch(batch, config_.plan.num_samples); !s.ok()) {
    return Named(s);
  }
  // An online mixture job's losses feed its group statistics: their range is checked before
  // anything is recorded (GroupLosses::Check).
  if (config_.mixture != nullptr && config_.mixture->online()) {
    if (absl::Status s =
            mixture::GroupLosses::Check(config_.mixture->layout, batch.indices, batch.losses);
        !s.ok()) {
      return Named(absl::InvalidArgumentError(absl::StrCat("batch seq ", batch.seq, " of epoch ",
                                                           batch.epoch, " from rank ", batch.rank,
                                                           ": ", s.message())));
    }
  }
  // Prepared before taking the lock (other ranks report concurrently).
  const EpochHistory::LossRecord record = history_->PrepareLosses(batch);

  absl::MutexLock lock(&mu_);
  if (batch.epoch < epoch_ && CloseReason().ok()) {
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
  if (absl::Status s = deal_.CheckDeal(batch.epoch, batch.deal); !s.ok()) return s;
  // Checked under the lock against the deal's plan (one plan read per pair, as the table's own
  // write).
  absl::StatusOr<size_t> fresh = deal_.CheckLosses(batch, *std::get<Serving>(phase_).view.plan);
  if (!fresh.ok()) return Named(fresh.status());
  const size_t size = batch.indices.size();
  if (*fresh == 0) {  // A retry, or positions a restarted trainer trained again.
    summary->set_duplicates(summary->duplicates() + size);
    return absl::OkStatus();
  }
  absl::StatusOr<CurrentDeal::NewLosses> reported = changes_.Reported(batch, record);
  if (!reported.ok()) return reported.status();
  const CurrentDeal::NewLosses& pairs = *reported;
  uint64_t accepted = pairs.size();
  if (losses_ != nullptr) {
    // One call per batch; the statistics keep the first loss of a sample in the epoch (a
    // second position of the same index is a duplicate).
    absl::StatusOr<uint64_t> applied = losses_->Apply(batch.epoch, pairs.indices(), pairs.losses());
    if (!applied.ok()) {
      // A device error: the statistics are lost to this job. Nothing is acknowledged.
      LOG(ERROR) << "job '" << name_ << "': applying losses of epoch " << batch.epoch
                 << " failed: " << applied.status();
      Enter(Failed{applied.status(), "applying the losses of"});
      return applied.status();
    }
    accepted = *applied;
  }
  if (group_losses_ != nullptr) {
    // The accepted pairs of a batch checked (GroupLosses::Check) before the lock was taken.
    group_losses_->AddChecked(config_.mixture->layout, pairs.indices(), pairs.losses());
  }
  deal_.AddAccepted(batch.rank, accepted);
  summary->set_accepted(summary->accepted() + accepted);
  summary->set_duplicates(summary->duplicates() + (size - accepted));
  return absl::OkStatus();
}

// ---- Epochs closing -----------------------------------------------------------------------------

absl::StatusOr<v1::EndEpochResponse> Job::EndEpoch(uint64_t epoch, uint32_t deal, uint32_t rank,
                                                   uint64_t incarnation) {
  if (absl::Status s = claims_.Check(rank, incarnation); !s.ok()) return s;
  v1::EndEpochResponse response;
  RecomputeInputs inputs;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (epoch < epoch_ && CloseReason().ok()) {
      // Already closed (every rank ended it): a retry, maybe of a call whose sync failed or is
      // still running. Acknowledge it only once the closing record is durable.
      response.set_ranks_ended(static_cast<uint32_t>(deal_.ranks().size()));
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    if (absl::Status s = CheckEpochOpen(epoch); !s.ok()) return s;
    if (absl::Status s = deal_.CheckDeal(epoch, deal); !s.ok()) return s;
    if (absl::Status s = CheckRank(deal_.shard(), rank); !s.ok()) return Named(s);
    if (absl::Status s = changes_.Ended(epoch, rank); !s.ok()) return s;
    response.set_ranks_ended(deal_.ranks_ended());
    if (!deal_.AllEnded()) {
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    // The last rank: close the epoch. Epoch e + 1 becomes current, planned in the background
    // from inputs that stay unchanged while the job is Planning.
    response.set_epoch_closed(true);
    inputs.base = base_;
    inputs.current = std::get<Serving>(phase_).view.weights;
    inputs.irreducible = irreducible_;
    if (group_losses_ != nullptr) {
      // The closed epoch's statistics go to the planner; the next epoch starts with none.
      inputs.group_losses = std::make_shared<const mixture::GroupLosses>(std::move(*group_losses_));
      *group_losses_ = mixture::GroupLosses(config_.mixture->layout.groups());
    }
    inputs.group_weights = std::move(pending_group_weights_);
    pending_group_weights_.reset();
    epoch_ = epoch + 1;
    // The next epoch is dealt whole to the ranks that ended this one.
    deal_.DealNextEpoch(config_.plan.samples_per_epoch);
    Enter(StartPlanning(Purpose::kNextEpoch, epoch_, deal_.number(), deal_.world_size()));
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

std::vector<uint64_t> Job::RewindableEpochs() const { return history_->KeptEpochs(); }

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
  return history_->Read(epoch);
}

absl::Status Job::Rewind(uint64_t epoch) {
  {
    absl::MutexLock lock(&mu_);
    // After a planning in progress (an epoch closing) and the scheduling of its snapshot: then
    // the current epoch is settled, on disk too.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !IsPlanning() && !snapshot_unscheduled_;
    };
    mu_.Await(absl::Condition(&settled));
    if (absl::Status s = CloseReason(); !s.ok()) return s;
    if (std::holds_alternative<AwaitingUpload>(phase_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", name_, "': ", NoPlanYet(), "; nothing to rewind"));
    }
    if (epoch > epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "' is after the current epoch ",
                       epoch_, ": a rewind goes back to the start of an epoch reached"));
    }
    // Planning from here on: losses, EndEpoch and uploads wait or are refused meanwhile. Until
    // the history is rewound, a failure goes back to the phase it left (Serving, or Failed
    // with its own cause).
    phase::Settled previous = AwaitingUpload{};
    if (const auto* serving = std::get_if<Serving>(&phase_)) previous = *serving;
    if (const auto* failed = std::get_if<Failed>(&phase_)) previous = *failed;
    Enter(StartPlanning(Purpose::kRewind, epoch, /*deal=*/0, deal_.world_size(),
                        std::move(previous)));
  }
  // Closed meanwhile (deleted, shutting down): that is the answer, whatever else failed.
  auto undo = [&](absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (absl::Status closed = CloseReason(); !closed.ok()) return closed;
    GoBack(s);
    return s;
  };
  absl::StatusOr<JobJournal::EpochStart> start = FindStart(epoch);
  if (!start.ok()) return undo(start.status());
  // A mixture job's groups as they were at that start, their weights included (else the planner
  // recomputes them); the states after it are forgotten, and first the plan computed ahead from
  // them.
  if (start->mixture != nullptr) planner_.DiscardAhead();
  if (absl::Status s = RememberMixtureStart(start->mixture.get(), epoch); !s.ok()) return undo(s);
  // The start's weights as the backend's again. One vector for both (no loss policy, kept in
  // memory): one object, as before the rewind.
  absl::StatusOr<std::shared_ptr<const BackendWeights>> weights = WeightsFromHost(start->weights);
  if (!weights.ok()) return undo(weights.status());
  absl::StatusOr<std::shared_ptr<const BackendWeights>> base =
      start->base == start->weights ? *weights : WeightsFromHost(start->base);
  if (!base.ok()) return undo(base.status());
  absl::StatusOr<PlannedEpoch> planned = planner_.Plan(epoch, *weights);
  if (!planned.ok()) return undo(planned.status());
  if (start->mixture != nullptr) {
    const WeightHistory kept(start->mixture->history().begin(), start->mixture->history().end());
    AddWeightHistory(&*planned, &kept);
  }
  if (absl::Status s = history_->Rewind(epoch); absl::IsFailedPrecondition(s)) {
    return undo(s);  // The start is no longer kept: nothing changed.
  } else if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (absl::Status closed = CloseReason(); !closed.ok()) return closed;
    LOG(ERROR) << "job '" << name_ << "': rewinding to epoch " << epoch << " failed: " << s;
    if (IsPlanning()) Enter(Failed{s, "rewinding to"});
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) return Interrupted();  // Closed meanwhile.
    // The start's statistics (none: no sample seen then).
    if (losses_ != nullptr) {
      if (absl::Status s = losses_->Restore(start->loss_stats); !s.ok()) {
        Enter(Failed{s, "rewinding to"});
        return s;
      }
    }
    // The epoch's start as it was: deal 0 to the ranks it started with; a mixture job's group
    // statistics empty and no weights set during it.
    deal_.DealAgain(start->world_size);
    if (group_losses_ != nullptr) {
      *group_losses_ = mixture::GroupLosses(config_.mixture->layout.groups());
    }
    pending_group_weights_.reset();
  }
  if (!Publish(*planned, *std::move(base))) {
    absl::MutexLock lock(&mu_);
    return Interrupted();
  }
  LOG(INFO) << "event=job_rewound job=" << name_ << " epoch=" << epoch;
  return absl::OkStatus();
}

// ---- Group weights ------------------------------------------------------------------------------

absl::StatusOr<v1::Job> Job::SetGroupWeights(std::vector<double> weights) {
  if (config_.mixture == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", name_,
                     "' is not a mixture job (its spec has no mixture): it has no group weights"));
  }
  if (config_.mixture->online()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", name_, "' learns its group weights online (spec.mixture.rule = ",
                     v1::GroupWeightRule_Name(config_.normalized.mixture().rule()),
                     "); SetGroupWeights sets static weights (rule STATIC_WEIGHTS) only"));
  }
  // The checks of the planner's SetStaticFrom, made before anything is recorded.
  const uint64_t k_groups = config_.mixture->layout.groups();
  absl::StatusOr<std::vector<double>> normalized = mixture::NormalizeWeights(weights, k_groups);
  absl::Status valid = normalized.status();
  if (valid.ok()) valid = mixture::SharesOf(*normalized).status();
  if (!valid.ok()) {
    return Named(absl::Status(valid.code(), absl::StrCat("group_", valid.message())));
  }
  absl::MutexLock lock(&mu_);
  // After a planning in progress: the weights are for the epoch after the one served.
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !IsPlanning(); };
  mu_.Await(absl::Condition(&settled));
  if (absl::Status s = CheckEpochOpen(epoch_); !s.ok()) return s;  // Closed, failed.
  if (absl::Status s = history_->LogGroupWeightsSet(epoch_, weights); !s.ok()) return s;
  pending_group_weights_ = std::move(weights);
  LOG(INFO) << "event=group_weights_set job=" << name_ << " epoch=" << epoch_
            << " from_epoch=" << epoch_ + 1;
  v1::Job job;
  DescribeLocked(&job);
  return job;
}

// ---- Resizes ------------------------------------------------------------------------------------

absl::StatusOr<v1::Job> Job::Resize(uint64_t epoch, uint32_t world_size) {
  if (world_size == 0 || world_size > static_cast<uint32_t>(v1::MAX_WORLD_SIZE)) {
    return Named(absl::InvalidArgumentError(
        absl::StrCat("world_size = ", world_size,
                     " is outside [1, MAX_WORLD_SIZE = ", v1::MAX_WORLD_SIZE, "]")));
  }
  EpochView current;
  CurrentDeal::Progress progress;
  bool replaced_started = false;  // Whether the deal being replaced had started.
  {
    absl::MutexLock lock(&mu_);
    // After a planning in progress (an epoch closing, another resize): the deal is settled.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !IsPlanning(); };
    mu_.Await(absl::Condition(&settled));
    if (absl::Status s = CloseReason(); !s.ok()) return s;
    if (epoch != epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch = ", epoch, " of job '", name_, "' is not the current epoch ", epoch_,
                       ": a group resizes the epoch it is about to read"));
    }
    if (std::holds_alternative<AwaitingUpload>(phase_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", name_, "': ", NoPlanYet(), "; nothing is dealt to resize: upload first"));
    }
    if (absl::Status s = CheckEpochOpen(epoch); !s.ok()) return s;  // Failed.
    if (world_size == deal_.world_size()) {  // A retry, or another rank of the same group.
      v1::Job job;
      DescribeLocked(&job);
      return job;
    }
    // Positions streamed only (not done) are dealt again, but they were handed out.
    replaced_started = deal_.Started();
    const EpochView& serving = std::get<Serving>(phase_).view;
    if (!deal_.AnyDone()) {
      // Nothing of the epoch is done: the next deal deals the same positions.
      if (absl::Status s = ApplyResize(serving, world_size, replaced_started); !s.ok()) return s;
    } else {
      // Computed off the lock (linear in M); meanwhile the epoch waits as Planning.
      current = serving;
      progress = deal_.TakeProgress();
      Enter(StartPlanning(Purpose::kRedeal, epoch_, deal_.number() + 1, world_size,
                          Serving{current}));
    }
  }
  if (current.plan != nullptr) {
    auto remaining = std::make_shared<const Plan>(progress.Remaining(*current.plan));
    absl::MutexLock lock(&mu_);
    if (!IsPlanning()) return Interrupted();  // Closed (or failed) meanwhile.
    EpochView view = current;
    view.plan = std::move(remaining);
    // ApplyResize replaces it; if it fails, the deal stays as it was.
    Enter(Serving{current});
    if (absl::Status s = ApplyResize(std::move(view), world_size, replaced_started); !s.ok()) {
      deal_.PutBack(std::move(progress));
      return s;
    }
  }
  if (absl::Status s = Sync(); !s.ok()) return s;
  return Describe();
}

absl::Status Job::ApplyResize(EpochView view, uint32_t world_size, bool replaced_started) {
  const uint32_t from = deal_.world_size();
  if (absl::Status s = changes_.Redealt(epoch_, world_size, view.plan->size(), replaced_started);
      !s.ok()) {
    return s;
  }
  Enter(Serving{std::move(view)});
  LOG(INFO) << "event=job_resized job=" << name_ << " epoch=" << epoch_
            << " deal=" << deal_.number() << " from_world_size=" << from
            << " world_size=" << world_size << " positions=" << deal_.length();
  return absl::OkStatus();
}

// ---- Status -------------------------------------------------------------------------------------

v1::JobStatus Job::Status(bool weight_history) const {
  v1::JobStatus status;
  status.set_backend(backend_->name());
  for (uint64_t e : RewindableEpochs()) status.mutable_job()->add_rewindable_epochs(e);
  absl::ReleasableMutexLock lock(&mu_);
  DescribeLocked(status.mutable_job());
  if (IsPlanning()) {
    // The epoch being planned: no rank has started it (the deal still holds the progress of the
    // epoch or deal it follows, which is not this one's).
    status.set_planning(true);
    for (uint32_t r = 0; r < status.job().world_size(); ++r) status.add_ranks()->set_rank(r);
  } else {
    const std::vector<CurrentDeal::RankState>& ranks = deal_.ranks();
    for (uint32_t r = 0; r < ranks.size(); ++r) {
      v1::RankProgress* p = status.add_ranks();
      p->set_rank(r);
      p->set_indices_streamed(ranks[r].streamed);
      p->set_losses_accepted(ranks[r].accepted);
      p->set_ended(ranks[r].ended);
    }
  }
  // The summary is of the weights the published plan was drawn from: while the epoch shown is
  // being planned (or awaits its upload, or the job failed) they are not that epoch's, so none
  // is shown rather than the previous epoch's under the new epoch number.
  if (status.job().plan_ready()) {
    v1::WeightStats* w = status.mutable_weights();
    w->set_min(weight_summary_.min);
    w->set_max(weight_summary_.max);
    w->set_mean(weight_summary_.mean);
    w->set_effective_sample_size(weight_summary_.effective_sample_size);
    w->set_zero_count(weight_summary_.zero_count);
  }
  status.set_last_recompute_ms(last_recompute_ms_);
  status.set_last_plan_ms(last_plan_ms_);
  // While planning, the planner reads the table off the lock; the count is not written then.
  status.set_samples_seen(losses_ != nullptr ? losses_->SamplesSeen() : 0);
  // A mixture job's groups: the last published window's weights, its counts and cursors only
  // while it is served, described off the lock (O(K)).
  const std::shared_ptr<const MixtureEpoch> mixture = mixture_epoch_;
  const bool served = status.job().plan_ready();
  const std::shared_ptr<const WeightHistory> history = weight_history_;
  lock.Release();
  if (config_.mixture != nullptr) {
    DescribeMixture(*config_.mixture, mixture.get(), served, status.mutable_mixture());
    if (weight_history && history != nullptr) {
      for (const state::EpochGroupWeights& e : *history) {
        v1::EpochGroupWeights* out = status.mutable_mixture()->add_history();
        out->set_epoch(e.epoch());
        out->mutable_groups()->Add(e.group().begin(), e.group().end());
        out->mutable_weights()->Add(e.weight().begin(), e.weight().end());
      }
    }
  }
  return status;
}

absl::Status Job::RememberMixtureStart(const state::MixtureState* start, uint64_t epoch) {
  if (start == nullptr || planner_.mixture() == nullptr) return absl::OkStatus();
  if (start->epoch() != epoch) {
    return Named(absl::DataLossError(absl::StrCat("the start of epoch ", epoch,
                                                  " holds the mixture state of epoch ",
                                                  start->epoch())));
  }
  absl::StatusOr<MixtureState> state = MixtureStateFromProto(*start);
  if (!state.ok()) return Named(state.status());
  if (absl::Status s = planner_.mixture()->Remember(*std::move(state)); !s.ok()) return Named(s);
  return absl::OkStatus();
}

}  // namespace samplerd
