#include "server/job.h"

#include <algorithm>
#include <cmath>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace samplerd {
namespace {

constexpr size_t kMaxBatchPairs = 1 << 20;
// How often a waiting StreamShard checks whether its caller went away.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);

double MillisSince(absl::Time start) { return absl::ToDoubleMilliseconds(absl::Now() - start); }

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Create(std::string name, JobConfig config,
                                                 ComputeBackend* backend,
                                                 std::unique_ptr<JobJournal> journal) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) return s;
  std::unique_ptr<Job> job(
      new Job(std::move(name), std::move(config), backend, std::move(journal)));
  absl::Status s;
  if (job->config_.policy.base == BaseWeightKind::kUniform) {
    s = job->InstallBaseAndPlan({});
  } else {
    // Persisted as awaiting its upload.
    s = job->StageEpochStart(0, /*planned=*/false, nullptr, nullptr);
    if (s.ok() && job->journal_ != nullptr) s = job->journal_->CommitSnapshot(0);
  }
  if (!s.ok()) {
    job->Close(s);
    if (absl::Status r = job->RemovePersistedState(); !r.ok()) LOG(WARNING) << r;
    return s;
  }
  return job;
}

absl::StatusOr<std::unique_ptr<Job>> Job::Restore(std::string name, JobConfig config,
                                                  ComputeBackend* backend,
                                                  JobJournal::Recovered recovered) {
  Snapshot& snapshot = recovered.snapshot;
  const state::SnapshotHeader& header = snapshot.header;
  const uint64_t n = config.plan.num_samples;
  const std::string where = recovered.journal->dir();
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(where, ": snapshot of epoch ", header.epoch(), " ",
                                            what, " (num_samples ", n, ")"));
  };
  if (header.job() != name) return bad(absl::StrCat("belongs to job '", header.job(), "'"));
  if (header.base_count() != 0 && header.base_count() != n) return bad("has wrong base weights");
  if (header.weights_count() != 0 && header.weights_count() != n) return bad("has wrong weights");
  if (header.loss_stats_count() != 0 && header.loss_stats_count() != n) {
    return bad("has wrong loss statistics");
  }
  if (!header.planned() && (header.epoch() != 0 || !recovered.records.empty())) {
    return bad("is not planned but has a log");
  }
  std::unique_ptr<Job> job(
      new Job(std::move(name), std::move(config), backend, std::move(recovered.journal)));
  if (!snapshot.loss_stats.empty()) job->losses_.Restore(std::move(snapshot.loss_stats));
  std::shared_ptr<const std::vector<float>> base;
  if (header.has_base())
    base = std::make_shared<const std::vector<float>>(std::move(snapshot.base));
  {
    absl::MutexLock lock(&job->mu_);
    job->samples_seen_ = header.samples_seen();
    job->started_ = header.epoch() > 0 || header.samples_seen() > 0;
    job->replaying_ = true;
    job->base_ = base;
  }
  if (header.planned()) {
    auto weights = std::make_shared<const std::vector<float>>(std::move(snapshot.weights));
    absl::Status s = job->PlanAndPublish(header.epoch(), std::move(weights), 0.0, base,
                                         /*write_snapshot=*/false);
    if (s.ok()) s = job->Replay(recovered.records);
    if (!s.ok()) {
      job->Close(s);
      return s;
    }
  }
  absl::MutexLock lock(&job->mu_);
  job->replaying_ = false;
  return job;
}

Job::Job(std::string name, JobConfig config, ComputeBackend* backend,
         std::unique_ptr<JobJournal> journal)
    : name_(std::move(name)),
      config_(std::move(config)),
      backend_(backend),
      journal_(std::move(journal)),
      losses_(config_.plan.num_samples, config_.policy.ema_decay),
      ranks_(config_.shard.world_size) {}

Job::~Job() { Close(absl::NotFoundError(absl::StrCat("job '", name_, "' was deleted"))); }

void Job::Close(absl::Status reason) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_.ok()) closed_ = std::move(reason);
  }
  {
    absl::MutexLock lock(&planner_mu_);
    if (planner_.joinable()) planner_.join();
  }
  absl::MutexLock lock(&lookahead_mu_);
  if (lookahead_.valid()) lookahead_.wait();
}

absl::Status Job::CheckOpen() const {
  if (!closed_.ok()) return closed_;
  return absl::OkStatus();
}

absl::Status Job::CheckRank(uint32_t rank) const {
  if (rank >= config_.shard.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " is outside [0, world_size = ", config_.shard.world_size,
                     ") of job '", name_, "'"));
  }
  return absl::OkStatus();
}

v1::Job Job::Describe() const {
  v1::Job job;
  job.set_name(name_);
  *job.mutable_spec() = config_.normalized;
  absl::MutexLock lock(&mu_);
  job.set_current_epoch(epoch_);
  job.set_plan_ready(plan_ready_);
  return job;
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
  if (absl::Status s = ValidateWeights(weights); !s.ok()) return s;
  // Normalise to mean 1 (importance weights are then 1 / w).
  double sum = 0;
  for (float w : weights) sum += w;
  const double mean = sum / static_cast<double>(weights.size());
  for (float& w : weights) w = static_cast<float>(w / mean);
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
  bool had_plan = false;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (started_ || planning_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", name_, "' already started (epoch ", epoch_,
          "); weights and labels can only be uploaded before the first shard position is "
          "streamed, loss reported or epoch ended"));
    }
    planning_ = true;  // Excludes a concurrent upload while epoch 0 is planned off the lock.
    // A re-upload withdraws the plan of epoch 0 until the new one is published: a loss or an
    // EndEpoch accepted against the old plan meanwhile would be wiped by the publication, or
    // would start planning epoch 1 concurrently with it.
    had_plan = plan_ready_;
    plan_ready_ = false;
  }
  auto weights = std::make_shared<const std::vector<float>>(std::move(base));
  // On success the plan and the base are published together (and planning_ cleared): no reader
  // can see epoch 0's plan without its base.
  absl::Status s = PlanAndPublish(0, weights, 0.0, /*new_base=*/weights);
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    planning_ = false;
    plan_ready_ = had_plan;  // A failed re-upload leaves the published plan as it was.
  }
  return s;
}

// ---- Planning
// -------------------------------------------------------------------------------------

bool Job::PlanIgnoresWeights() const {
  const PlanSpec& p = config_.plan;
  return p.order == SampleOrder::kSequential ||
         (!p.replacement && p.samples_per_epoch == p.num_samples) ||
         (config_.policy.base == BaseWeightKind::kUniform &&
          config_.policy.loss == LossWeightKind::kNone);
}

absl::Status Job::PlanAndPublish(uint64_t epoch, std::shared_ptr<const std::vector<float>> weights,
                                 double recompute_ms,
                                 std::shared_ptr<const std::vector<float>> new_base,
                                 bool write_snapshot, bool* published) {
  const absl::Time start = absl::Now();
  // `stale`: a plan computed ahead for another epoch (a re-upload before the job started). Its
  // destructor waits for the computation: declared here, it runs after every lock is released.
  std::future<absl::StatusOr<Plan>> ahead, stale;
  {
    absl::MutexLock lock(&lookahead_mu_);
    if (lookahead_.valid()) {
      (lookahead_epoch_ == epoch ? ahead : stale) = std::move(lookahead_);
    }
  }
  // A plan computed ahead equals the one computed now: it depends on (seed, epoch) only, and
  // weights keep their zero pattern across recomputes (clamps are > 0), so it is as valid.
  absl::StatusOr<Plan> plan =
      ahead.valid() ? ahead.get() : backend_->PlanEpoch(config_.plan, epoch, *weights);
  const double plan_ms = MillisSince(start);
  if (!plan.ok()) return plan.status();
  // An upload (or a creation) is in no log: its snapshot is all there is, so it is committed
  // before the plan is published. An epoch opened by EndEpoch is also in the closed epoch's log,
  // so its snapshot can be committed after publishing.
  const bool commit_first = new_base != nullptr;
  if (journal_ != nullptr) {
    if (write_snapshot) {
      if (absl::Status s = StageEpochStart(epoch, /*planned=*/true, weights.get(), new_base);
          !s.ok()) {
        return s;
      }
      if (commit_first) {
        if (absl::Status s = journal_->CommitSnapshot(epoch); !s.ok()) return s;
      }
    }
    if (absl::Status s = journal_->BeginEpoch(epoch); !s.ok()) return s;
  }
  const WeightSummary summary =
      weights->empty() ? SummarizeWeights(std::vector<float>(1, 1.0f)) : SummarizeWeights(*weights);
  EpochView view;
  view.plan = std::make_shared<const Plan>(*std::move(plan));
  view.weights = std::move(weights);
  view.unit_is_weights =
      view.weights->empty() ||
      (!config_.plan.replacement && config_.plan.samples_per_epoch == config_.plan.num_samples);
  {
    absl::MutexLock lock(&mu_);
    epoch_ = epoch;
    current_ = std::move(view);
    plan_ready_ = true;
    planning_ = false;
    if (new_base != nullptr) base_ = std::move(new_base);
    weight_summary_ = summary;
    if (weight_summary_.effective_sample_size > 0 && current_.weights->empty()) {
      weight_summary_.effective_sample_size = static_cast<double>(config_.plan.num_samples);
    }
    last_plan_ms_ = plan_ms;
    last_recompute_ms_ = recompute_ms;
    ResetEpochState();
    if (published != nullptr) *published = true;
    if (closed_.ok() && PlanIgnoresWeights()) {
      absl::MutexLock ahead_lock(&lookahead_mu_);
      lookahead_epoch_ = epoch + 1;
      lookahead_ = std::async(std::launch::async, [this, epoch, weights = current_.weights] {
        return backend_->PlanEpoch(config_.plan, epoch + 1, *weights);
      });
    }
  }
  // The snapshot's fsync, off the epoch boundary: ranks are served while it runs. Until it is
  // committed the previous snapshot and logs stay, and recovery replays from them.
  if (journal_ != nullptr && write_snapshot && !commit_first) {
    return journal_->CommitSnapshot(epoch);
  }
  return absl::OkStatus();
}

absl::Status Job::StageEpochStart(uint64_t epoch, bool planned, const std::vector<float>* weights,
                                  std::shared_ptr<const std::vector<float>> new_base) {
  if (journal_ == nullptr) return absl::OkStatus();
  state::SnapshotHeader header;
  header.set_job(name_);
  header.set_spec(config_.normalized.SerializeAsString());
  header.set_epoch(epoch);
  header.set_planned(planned);
  std::shared_ptr<const std::vector<float>> base = std::move(new_base);
  {
    absl::MutexLock lock(&mu_);
    if (base == nullptr) base = base_;
    header.set_samples_seen(samples_seen_);
  }
  const bool has_base = base != nullptr && !base->empty();
  header.set_has_base(has_base);
  // losses_ is quiet: no plan is published while a snapshot is written (see job.h).
  const LossStatsView stats = header.samples_seen() > 0 ? losses_.View() : LossStatsView();
  const absl::Time start = absl::Now();
  absl::Status s = journal_->StageSnapshot(
      header, has_base ? absl::MakeConstSpan(*base) : absl::Span<const float>(),
      weights != nullptr ? absl::MakeConstSpan(*weights) : absl::Span<const float>(), stats);
  VLOG(1) << "job '" << name_ << "': snapshot of epoch " << epoch << " in " << MillisSince(start)
          << " ms";
  return s;
}

absl::Status Job::Log(const state::WalRecord& record) {
  if (journal_ == nullptr || replaying_) return absl::OkStatus();
  return journal_->Append(record.SerializeAsString());
}

absl::Status Job::Sync() { return journal_ == nullptr ? absl::OkStatus() : journal_->Sync(); }

absl::Status Job::RemovePersistedState() {
  return journal_ == nullptr ? absl::OkStatus() : journal_->Remove();
}

absl::Status Job::Replay(const std::vector<state::WalRecord>& records) {
  const std::string where = journal_->dir();
  v1::LossReportSummary summary;
  for (size_t i = 0; i < records.size(); ++i) {
    const state::WalRecord& r = records[i];
    uint64_t epoch = 0;
    switch (r.kind_case()) {
      case state::WalRecord::kLosses:
        epoch = r.losses().epoch();
        break;
      case state::WalRecord::kRankEnded:
        epoch = r.rank_ended().epoch();
        break;
      case state::WalRecord::kStreamed:
        epoch = r.streamed().epoch();
        break;
      default:
        return absl::DataLossError(absl::StrCat(where, ": log record ", i, " has no kind"));
    }
    {
      // A record of the next epoch follows the EndEpoch that closed this one: wait for its plan.
      absl::MutexLock lock(&mu_);
      auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !planning_ || !planning_error_.ok();
      };
      mu_.Await(absl::Condition(&settled));
      if (!planning_error_.ok()) return planning_error_;
      if (epoch != epoch_ || !plan_ready_) {
        return absl::DataLossError(absl::StrCat(where, ": log record ", i, " is of epoch ", epoch,
                                                " but the job is at epoch ", epoch_));
      }
    }
    absl::Status s;
    switch (r.kind_case()) {
      case state::WalRecord::kLosses: {
        LossBatchView view;
        view.epoch = r.losses().epoch();
        view.rank = r.losses().rank();
        view.seq = r.losses().seq();
        view.indices = absl::MakeConstSpan(r.losses().indices().data(), r.losses().indices_size());
        view.losses = absl::MakeConstSpan(r.losses().losses().data(), r.losses().losses_size());
        s = ReportLosses(view, &summary);
        break;
      }
      case state::WalRecord::kRankEnded:
        s = EndEpoch(r.rank_ended().epoch(), r.rank_ended().rank()).status();
        break;
      default:
        s = RecordStreamed(r.streamed().epoch(), r.streamed().rank(), r.streamed().position());
        break;
    }
    if (!s.ok()) {
      return absl::DataLossError(
          absl::StrCat(where, ": log record ", i, " does not apply: ", s.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !planning_ || !planning_error_.ok();
  };
  mu_.Await(absl::Condition(&settled));
  return planning_error_;
}

void Job::ResetEpochState() {
  for (RankState& r : ranks_) r = RankState();
  ranks_ended_ = 0;
}

void Job::PlanNextEpoch(uint64_t closed_epoch) {
  std::shared_ptr<const std::vector<float>> current, base;
  {
    absl::MutexLock lock(&mu_);
    current = current_.weights;
    base = base_;
  }
  const uint64_t n = config_.plan.num_samples;
  const absl::Time start = absl::Now();
  std::shared_ptr<const std::vector<float>> next = current;
  absl::Status status;
  if (config_.policy.loss != LossWeightKind::kNone) {
    // losses_ is not written while planning_ is set (see job.h).
    auto recomputed = std::make_shared<std::vector<float>>(n);
    // An empty `current` (uniform W_e) means all ones to the backend.
    status = backend_->RecomputeWeights(
        config_.policy, closed_epoch, base ? absl::MakeConstSpan(*base) : absl::Span<const float>(),
        *current, losses_.View(), absl::MakeSpan(*recomputed));
    next = std::move(recomputed);
  }
  const double recompute_ms = MillisSince(start);
  bool published = false;
  if (status.ok()) {
    status = PlanAndPublish(closed_epoch + 1, next, recompute_ms, nullptr, true, &published);
  }
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    if (published) {
      // Published, but its snapshot was not committed: the epoch is served, and a restart
      // recovers from the previous snapshot and the logs (kept). Keep it visible.
      LOG(ERROR) << "job '" << name_ << "': the snapshot of epoch " << closed_epoch + 1
                 << " was not committed: " << status;
    } else {
      // Inputs were validated on the way in, so this is a server bug or a failed write; keep it
      // visible. Waiting readers wake up (planning_error_ is part of their condition) and fail
      // with INTERNAL.
      LOG(ERROR) << "job '" << name_ << "': planning epoch " << closed_epoch + 1
                 << " failed: " << status;
      planning_ = false;
      planning_error_ = status;
    }
  }
#if defined(__GLIBC__)
  // An epoch boundary is a quiet moment: give the memory of the epoch's freed message buffers and
  // planning scratch back to the system (glibc keeps freed blocks in per-thread arenas).
  malloc_trim(0);
#endif
}

// ---- Shards
// ----------------------------------------------------------------------------------------

absl::StatusOr<ShardLease> Job::AcquireShard(uint64_t epoch, uint32_t rank, uint32_t world_size,
                                             absl::Time deadline,
                                             const std::function<bool()>& cancelled) {
  if (world_size != config_.shard.world_size) {
    return absl::FailedPreconditionError(absl::StrCat("world_size = ", world_size,
                                                      " does not match job '", name_,
                                                      "' world_size = ", config_.shard.world_size));
  }
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto ready_or_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !closed_.ok() || !planning_error_.ok() || epoch < epoch_ || epoch > epoch_ + 1 ||
           (epoch == epoch_ && plan_ready_);
  };
  // Wait for the epoch's plan: the current one while planned, or the next one. In slices, so
  // that a caller that went away is noticed.
  const absl::Condition ready(&ready_or_done);
  while (!mu_.AwaitWithDeadline(
      ready, cancelled ? std::min(deadline, absl::Now() + kCancelPoll) : deadline)) {
    if (absl::Now() >= deadline) break;
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat("the caller went away while waiting for epoch ",
                                               epoch, " of job '", name_, "'"));
    }
  }
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (!planning_error_.ok()) return absl::InternalError(planning_error_.ToString());
  if (epoch < epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch = ", epoch, " of job '", name_, "' is closed; the current epoch is ", epoch_));
  }
  if (epoch > epoch_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch = ", epoch, " of job '", name_, "' is not open; the current epoch is ",
                     epoch_, " (shards are served for the current and the next epoch)"));
  }
  if (!(epoch == epoch_ && plan_ready_)) {
    return absl::DeadlineExceededError(
        absl::StrCat("epoch ", epoch, " of job '", name_, "' was not planned before the deadline"));
  }
  ShardLease lease;
  lease.view = current_;
  lease.shard = config_.shard;
  lease.shard_length = *ShardLength(config_.plan.samples_per_epoch, config_.shard, rank);
  return lease;
}

absl::Status Job::RecordStreamed(uint64_t epoch, uint32_t rank, uint64_t position) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  if (epoch == epoch_ && rank < ranks_.size() && position > ranks_[rank].streamed) {
    state::WalRecord record;
    state::Streamed* streamed = record.mutable_streamed();
    streamed->set_epoch(epoch);
    streamed->set_rank(rank);
    streamed->set_position(position);
    // Progress reporting only (never synced on its own): a failed write does not stop the
    // stream. The journal keeps the error, so nothing further is acknowledged.
    if (absl::Status s = Log(record); !s.ok()) {
      LOG_EVERY_N(WARNING, 1000) << "job '" << name_ << "': stream progress not logged: " << s;
    }
    ranks_[rank].streamed = position;
    // Indices were handed out: a re-upload must no longer replace the plan they came from.
    started_ = true;
  }
  return closed_;
}

// ---- Losses
// ----------------------------------------------------------------------------------------

absl::Status Job::ReportLosses(const LossBatchView& batch, v1::LossReportSummary* summary) {
  const uint64_t n = config_.plan.num_samples;
  if (absl::Status s = CheckRank(batch.rank); !s.ok()) return s;
  if (batch.indices.size() != batch.losses.size()) {
    return absl::InvalidArgumentError(absl::StrCat("indices: ", batch.indices.size(),
                                                   " entries but losses: ", batch.losses.size()));
  }
  if (batch.indices.empty()) {
    return absl::InvalidArgumentError("indices: empty batch; send 1 to 1048576 pairs");
  }
  if (batch.indices.size() > kMaxBatchPairs) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices: ", batch.indices.size(), " pairs in one batch; at most 1048576"));
  }
  for (size_t k = 0; k < batch.indices.size(); ++k) {
    if (batch.indices[k] >= n) {
      return absl::InvalidArgumentError(absl::StrCat("indices[", k, "] = ", batch.indices[k],
                                                     " is outside [0, num_samples = ", n, ")"));
    }
    const float loss = batch.losses[k];
    if (!(std::isfinite(loss) && loss >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("losses[", k, "] = ", loss, ": losses must be finite and >= 0"));
    }
  }

  // The log record, serialised before taking the lock (other ranks report concurrently).
  std::string record;
  if (journal_ != nullptr) {
    state::WalRecord wal;
    state::Losses* losses = wal.mutable_losses();
    losses->set_epoch(batch.epoch);
    losses->set_rank(batch.rank);
    losses->set_seq(batch.seq);
    losses->mutable_indices()->Add(batch.indices.begin(), batch.indices.end());
    losses->mutable_losses()->Add(batch.losses.begin(), batch.losses.end());
    record = wal.SerializeAsString();
  }

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (batch.epoch < epoch_) {
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
  if (batch.epoch > epoch_ || !plan_ready_) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch = ", batch.epoch, " of job '", name_,
                     "' is not open for losses; the current epoch is ", epoch_,
                     plan_ready_ ? "" : " (still being planned)"));
  }
  RankState& rank = ranks_[batch.rank];
  if (rank.seqs.contains(batch.seq)) {
    summary->set_duplicates(summary->duplicates() + batch.indices.size());
    return absl::OkStatus();
  }
  if (!record.empty() && !replaying_) {
    if (absl::Status s = journal_->Append(record); !s.ok()) return s;
  }
  rank.seqs.insert(batch.seq);
  uint64_t accepted = 0;
  constexpr size_t kAhead = 16;  // Prefetch distance: overlaps the cache misses of scattered i.
  const size_t size = batch.indices.size();
  for (size_t k = 0; k < size; ++k) {
    if (k + kAhead < size) losses_.Prefetch(batch.indices[k + kAhead]);
    bool first_ever = false;
    if (losses_.Apply(batch.indices[k], batch.losses[k], batch.epoch, &first_ever)) {
      ++accepted;
      samples_seen_ += first_ever;
    }
  }
  const uint64_t duplicates = size - accepted;
  rank.accepted += accepted;
  started_ = true;
  summary->set_accepted(summary->accepted() + accepted);
  summary->set_duplicates(summary->duplicates() + duplicates);
  return absl::OkStatus();
}

// ---- Epochs
// ----------------------------------------------------------------------------------------

absl::StatusOr<v1::EndEpochResponse> Job::EndEpoch(uint64_t epoch, uint32_t rank) {
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  v1::EndEpochResponse response;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
    if (epoch < epoch_) {
      // Already closed (every rank ended it): a retry, maybe of a call whose sync failed or is
      // still running. Acknowledge it only once the closing record is durable.
      response.set_ranks_ended(config_.shard.world_size);
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    if (epoch > epoch_ || !plan_ready_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "epoch = ", epoch, " of job '", name_, "' is not open; the current epoch is ", epoch_,
          plan_ready_ ? "" : " (still being planned)"));
    }
    RankState& state = ranks_[rank];
    if (!state.ended) {
      state::WalRecord record;
      record.mutable_rank_ended()->set_epoch(epoch);
      record.mutable_rank_ended()->set_rank(rank);
      if (absl::Status s = Log(record); !s.ok()) return s;
      state.ended = true;
      ++ranks_ended_;
      started_ = true;
    }
    response.set_ranks_ended(ranks_ended_);
    if (ranks_ended_ < config_.shard.world_size) {
      lock.Release();
      if (absl::Status s = Sync(); !s.ok()) return s;
      return response;
    }
    // The last rank: close the epoch. Epoch e + 1 becomes current, planned in the background.
    response.set_epoch_closed(true);
    started_ = true;
    plan_ready_ = false;
    planning_ = true;
    epoch_ = epoch + 1;
  }
  {
    absl::MutexLock planner_lock(&planner_mu_);
    // The previous epoch's planner has published (epoch e was served), at most it is trimming.
    if (planner_.joinable()) planner_.join();
    absl::MutexLock lock(&mu_);
    // Close() ran meanwhile: it has already joined, so no new planner may start (waiters were
    // woken with the close reason).
    if (closed_.ok()) planner_ = std::thread([this, epoch] { PlanNextEpoch(epoch); });
  }
  // Durable before it is acknowledged. The epoch closed in memory either way, so the planner
  // starts first: if the sync fails, this call fails (not acknowledged) but the job moves on.
  if (absl::Status s = Sync(); !s.ok()) return s;
  return response;
}

// ---- Status
// ----------------------------------------------------------------------------------------

v1::JobStatus Job::Status() const {
  v1::JobStatus status;
  *status.mutable_job() = Describe();
  absl::MutexLock lock(&mu_);
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
  status.set_samples_seen(samples_seen_);
  status.set_backend(backend_->name());
  return status;
}

}  // namespace samplerd
