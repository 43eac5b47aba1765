// Job::Restore: a persisted job rebuilt from its newest snapshot and its logs (job_journal.h).
// The log is replayed through the job's own methods, so a restored job has exactly the state the
// original had when it last acknowledged a call; plans are deterministic, so they come back too.
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/loss_policies.h"
#include "server/job.h"

namespace samplerd {

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
  if (header.irreducible_count() != 0 && header.irreducible_count() != n) {
    return bad("has wrong irreducible losses");
  }
  if (!header.planned() && (header.epoch() != 0 || !recovered.records.empty())) {
    return bad("is not planned but has a log");
  }
  // The journal becomes the job's history; its recovery (opening the snapshot's epoch, the
  // replay) is driven from here.
  JobJournal& journal = *recovered.journal;
  std::unique_ptr<EpochHistory> history =
      MakeJournalHistory(name, config, std::move(recovered.journal));
  std::unique_ptr<Job> job(
      new Job(std::move(name), std::move(config), backend, std::move(history)));
  // The snapshot's vectors become the backend's objects. A snapshot's weights were valid when it
  // was written: refused now, they are damaged.
  auto to_backend =
      [&](std::vector<float> host) -> absl::StatusOr<std::shared_ptr<const BackendWeights>> {
    if (host.empty()) return nullptr;
    absl::StatusOr<std::shared_ptr<const BackendWeights>> weights =
        backend->MakeWeights(std::move(host));
    if (absl::IsInvalidArgument(weights.status())) return bad(weights.status().message());
    return weights;
  };
  if (absl::Status s = job->MakeLossStats(); !s.ok()) return s;
  std::shared_ptr<const BackendWeights> base;
  if (header.has_base()) {
    absl::StatusOr<std::shared_ptr<const BackendWeights>> restored =
        to_backend(std::move(snapshot.base));
    if (!restored.ok()) return restored.status();
    base = *std::move(restored);
  }
  {
    absl::MutexLock lock(&job->mu_);
    // A job without a loss policy keeps no statistics (snapshots of older versions have them).
    if (job->losses_ != nullptr && !snapshot.loss_stats.empty()) {
      if (absl::Status s = job->losses_->Restore(snapshot.loss_stats); !s.ok()) {
        return absl::IsInvalidArgument(s) ? bad(s.message()) : s;
      }
    }
    // REDUCIBLE_LOSS's irreducible losses, uploaded before the job started (a snapshot of an
    // upload holds them, and every later one).
    if (UsesIrreducibleLosses(job->config_.policy) && !snapshot.irreducible.empty()) {
      if (absl::Status s = ValidateIrreducibleLosses(snapshot.irreducible, n); !s.ok()) {
        return bad(s.message());
      }
      job->irreducible_ =
          std::make_shared<const std::vector<float>>(std::move(snapshot.irreducible));
    }
    // The snapshot's epoch, published below (the upload or the EndEpoch that opened it is done).
    job->epoch_ = header.epoch();
    // Deal 0 of the epoch, to the ranks it started with (older snapshots: the spec's).
    job->deal_.DealAgain(header.world_size());
    if (header.planned()) {
      phase::Planning recovery;
      recovery.purpose = phase::Planning::Purpose::kRecovery;
      recovery.since = absl::Now();
      recovery.epoch = header.epoch();
      recovery.world_size = job->deal_.world_size();
      job->Enter(std::move(recovery));
    }
  }
  if (header.planned()) {
    // A mixture job's groups at the snapshot's epoch (older snapshots: recomputed from epoch 0).
    if (header.has_mixture()) {
      if (absl::Status s = job->RememberMixtureStart(&header.mixture(), header.epoch()); !s.ok()) {
        job->Close(s);
        return bad(s.message());
      }
    }
    absl::StatusOr<std::shared_ptr<const BackendWeights>> weights =
        to_backend(std::move(snapshot.weights));
    absl::StatusOr<PlannedEpoch> planned =
        weights.ok() ? job->planner_.Plan(header.epoch(), *std::move(weights))
                     : absl::StatusOr<PlannedEpoch>(weights.status());
    absl::Status s = planned.status();
    if (s.ok()) {  // A mixture job's weight history, as the snapshot holds it.
      const WeightHistory kept(header.mixture().history().begin(),
                               header.mixture().history().end());
      AddWeightHistory(&*planned, &kept);
    }
    // The snapshot exists already: only the epoch's log is opened.
    if (s.ok()) s = journal.OpenEpoch(header.epoch());
    if (s.ok()) job->Publish(*planned, base);
    if (s.ok()) s = job->Replay(journal, recovered);
    if (!s.ok()) {
      job->Close(s);
      return s;
    }
  }
  journal.EndReplay();
  return job;
}

absl::Status Job::Replay(JobJournal& journal, const JobJournal::Recovered& recovered) {
  v1::LossReportSummary summary;
  JobJournal::ReplayHandlers handlers;
  handlers.before_record = [this](uint64_t epoch) -> absl::Status {
    // A record of the next epoch follows the EndEpoch that closed this one: wait for its plan.
    if (absl::Status s = AwaitNotPlanning(); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    if (epoch != epoch_ || !std::holds_alternative<phase::Serving>(phase_)) {
      return absl::DataLossError(
          absl::StrCat("it is of epoch ", epoch, " but the job is at epoch ", epoch_));
    }
    return absl::OkStatus();
  };
  handlers.losses = [this, &summary](const LossBatchView& batch) {
    return ReportLosses(batch, &summary);
  };
  handlers.rank_ended = [this](uint64_t epoch, uint32_t deal, uint32_t rank) {
    return EndEpoch(epoch, deal, rank).status();
  };
  handlers.streamed = [this](uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position) {
    return RecordStreamed(epoch, deal, rank, position);
  };
  handlers.resized = [this](uint64_t epoch, uint32_t world_size) {
    return Resize(epoch, world_size).status();
  };
  handlers.group_weights_set = [this](uint64_t, std::vector<double> weights) {
    return SetGroupWeights(std::move(weights)).status();
  };
  if (absl::Status s = journal.Replay(recovered.records, handlers); !s.ok()) return s;
  // The planning the log's last record started (an epoch's end) plans from the restored state,
  // which was valid when it was persisted: refused now (INVALID_ARGUMENT, e.g. a negative loss
  // statistic in a snapshot whose checksum holds), the files are damaged.
  absl::Status planned = AwaitNotPlanning();
  if (absl::IsInvalidArgument(planned)) {
    return absl::DataLossError(absl::StrCat(
        journal.dir(),
        ": the planning after the log's replay refused the restored state: ", planned.message()));
  }
  return planned;
}

}  // namespace samplerd
