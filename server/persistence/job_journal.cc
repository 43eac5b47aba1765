#include "server/persistence/job_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kSnapshotPrefix = "snapshot-";
constexpr absl::string_view kSnapshotSuffix = ".bin";
constexpr absl::string_view kLogPrefix = "wal-";
constexpr absl::string_view kLogSuffix = ".log";
constexpr absl::string_view kRewindPrefix = "rewind-";

// The epoch in "<prefix><epoch><suffix>", or false.
bool ParseEpoch(absl::string_view name, absl::string_view prefix, absl::string_view suffix,
                uint64_t* epoch) {
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) return false;
  return absl::SimpleAtoi(name, epoch);
}

absl::Status FsError(absl::string_view what, const fs::path& path, const std::error_code& ec) {
  return PosixError(what, path.string(), ec.value());
}

struct DirFiles {
  std::vector<uint64_t> snapshots;  // Epochs, ascending.
  std::vector<uint64_t> logs;
  std::vector<uint64_t> rewinds;    // Rewinds begun and not finished (at most one).
  std::vector<std::string> others;  // Names that are none of the journal's files.
};

// Lists a job directory; with `remove_temporary` (recovery only: a staged snapshot may be being
// committed otherwise) also removes staged snapshots that were never committed.
absl::StatusOr<DirFiles> ListDir(const std::string& dir, bool remove_temporary = false) {
  DirFiles files;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    uint64_t epoch = 0;
    if (ParseEpoch(name, kSnapshotPrefix, kSnapshotSuffix, &epoch)) {
      files.snapshots.push_back(epoch);
    } else if (ParseEpoch(name, kLogPrefix, kLogSuffix, &epoch)) {
      files.logs.push_back(epoch);
    } else if (ParseEpoch(name, kRewindPrefix, "", &epoch)) {
      files.rewinds.push_back(epoch);
    } else if (absl::StartsWith(name, kSnapshotPrefix) && absl::EndsWith(name, ".tmp")) {
      if (remove_temporary) {
        std::error_code ignored;  // A snapshot never committed: never used.
        fs::remove(entry.path(), ignored);
      }
    } else {
      files.others.push_back(name);
    }
  }
  if (ec) return FsError("list", dir, ec);
  std::sort(files.snapshots.begin(), files.snapshots.end());
  std::sort(files.logs.begin(), files.logs.end());
  return files;
}

// A logged loss batch as the LossBatchView the job applied (views into `losses`): the one
// decoding, for the replay and for the snapshots derived from the logs.
LossBatchView LossesView(const state::Losses& losses) {
  LossBatchView view;
  view.epoch = losses.epoch();
  view.rank = losses.rank();
  view.seq = losses.seq();
  view.deal = losses.deal();
  view.indices = absl::MakeConstSpan(losses.indices().data(), losses.indices_size());
  view.losses = absl::MakeConstSpan(losses.losses().data(), losses.losses_size());
  view.positions = absl::MakeConstSpan(losses.positions().data(), losses.positions_size());
  view.consecutive = losses.has_first_position();
  view.first_position = losses.first_position();
  return view;
}

}  // namespace

std::string JobJournal::SnapshotPath(uint64_t epoch) const {
  return absl::StrCat(dir_, "/", kSnapshotPrefix, epoch, kSnapshotSuffix);
}

std::string JobJournal::LogPath(uint64_t epoch) const {
  return absl::StrCat(dir_, "/", kLogPrefix, epoch, kLogSuffix);
}

std::string JobJournal::RewindMarkerPath(uint64_t epoch) const {
  return absl::StrCat(dir_, "/", kRewindPrefix, epoch);
}

absl::StatusOr<std::unique_ptr<JobJournal>> JobJournal::Create(std::string dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return FsError("remove", dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return FsError("create", dir, ec);
  const fs::path parent = fs::path(dir).parent_path();
  if (absl::Status s = SyncDirectory(parent.empty() ? "." : parent.string()); !s.ok()) return s;
  return std::unique_ptr<JobJournal>(new JobJournal(std::move(dir)));
}

absl::StatusOr<JobJournal::Recovered> JobJournal::Recover(std::string dir) {
  absl::StatusOr<DirFiles> files = ListDir(dir, /*remove_temporary=*/true);
  if (!files.ok()) return files.status();
  if (!files->rewinds.empty()) {  // Acknowledged or not, a begun rewind is finished first.
    const JobJournal journal(dir);
    if (absl::Status s = FinishRewind(journal, files->rewinds.front()); !s.ok()) return s;
    LOG(INFO) << "event=rewind_finished dir=" << dir << " epoch=" << files->rewinds.front()
              << " reason=interrupted_by_a_stop";
    files = ListDir(dir);
    if (!files.ok()) return files.status();
  }
  if (files->snapshots.empty()) {
    if (!files->others.empty()) {  // Not written by samplerd: not ours to remove.
      return absl::NotFoundError(absl::StrCat(dir, ": not a job directory (no snapshot, and '",
                                              files->others.front(),
                                              "' is not a samplerd file); left as it is"));
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    return absl::NotFoundError(
        absl::StrCat(dir, ": no snapshot (a job never acknowledged); removed"));
  }
  Recovered recovered;
  recovered.journal.reset(new JobJournal(std::move(dir), /*replaying=*/true));
  const JobJournal& journal = *recovered.journal;
  const uint64_t epoch = files->snapshots.back();
  absl::StatusOr<Snapshot> snapshot = ReadSnapshot(journal.SnapshotPath(epoch));
  if (!snapshot.ok()) return snapshot.status();
  if (snapshot->header.epoch() != epoch) {
    return absl::DataLossError(
        absl::StrCat(journal.SnapshotPath(epoch), ": holds epoch ", snapshot->header.epoch()));
  }
  recovered.snapshot = *std::move(snapshot);
  // The logs of the snapshot's epoch and later ones (older ones are superseded by it: a crash
  // left them).
  std::vector<uint64_t> logs;
  for (uint64_t log_epoch : files->logs) {
    if (log_epoch >= epoch) logs.push_back(log_epoch);
  }
  // The newest log's creation may have been cut by the crash (its head is synced before anything
  // is appended, and before a snapshot of its epoch is committed): nothing in it was
  // acknowledged. Only that log, only if it has no snapshot, its predecessor is there (created
  // before it) and nothing follows its head.
  if (logs.size() >= 2 && logs.back() > epoch && logs[logs.size() - 2] + 1 == logs.back()) {
    const std::string path = journal.LogPath(logs.back());
    absl::StatusOr<RecordLogHead> head = ReadRecordLogHead(path);
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (absl::IsDataLoss(head.status()) && !ec && size <= kRecordLogHeadBytes) {
      if (::unlink(path.c_str()) != 0) return PosixError("remove", path, errno);
      logs.pop_back();
    }
  }
  // Every epoch from the snapshot's to the newest has its log: the snapshot's was created before
  // the snapshot was committed, each later one after its predecessor was synced.
  for (size_t i = 0; i < std::max<size_t>(logs.size(), 1); ++i) {
    if (i < logs.size() && logs[i] == epoch + i) continue;
    return absl::DataLossError(
        absl::StrCat(journal.LogPath(epoch + i), " is missing, but ",
                     i == 0 ? journal.SnapshotPath(epoch) : journal.LogPath(logs[i]),
                     " exists: the changes of epoch ", epoch + i, " are lost"));
  }
  // Read from the newest back: each log's header says how long the previous one was when it was
  // closed, all of it synced.
  std::vector<RecordLogContents> contents(logs.size());
  uint64_t closed_length = 0;
  for (size_t i = logs.size(); i-- > 0;) {
    const std::string path = journal.LogPath(logs[i]);
    absl::StatusOr<RecordLogContents> log = ReadRecordLog(path, closed_length);
    if (!log.ok()) return log.status();
    state::LogHeader header;
    if (!header.ParseFromString(log->head.header) || header.epoch() != logs[i]) {
      return absl::DataLossError(
          absl::StrCat(path, ": its header is not that of epoch ", logs[i], "'s log"));
    }
    closed_length = header.previous_log_bytes();
    contents[i] = *std::move(log);
  }
  for (size_t l = 0; l < logs.size(); ++l) {
    for (size_t i = 0; i < contents[l].records.size(); ++i) {
      state::WalRecord& record = recovered.records.emplace_back();
      if (!record.ParseFromString(contents[l].records[i])) {
        return absl::DataLossError(
            absl::StrCat(journal.LogPath(logs[l]), ": record ", i, " is malformed"));
      }
    }
  }
  return recovered;
}

JobJournal::~JobJournal() { StopSnapshots(/*drop_pending=*/false); }

void JobJournal::ScheduleEpochSnapshot(EpochStart start) {
  absl::MutexLock lock(&snapshot_mu_);
  if (snapshots_stopped_) return;
  // Written in order; only the newest keep_snapshots_ are worth writing (the older ones would
  // be removed at once), so a backlog of short epochs drops its oldest.
  pending_snapshots_.push_back(std::move(start));
  while (pending_snapshots_.size() > keep_snapshots_.load()) pending_snapshots_.pop_front();
  if (snapshot_running_) return;  // The running thread takes it next.
  // A thread that set snapshot_running_ = false has left the lock for good: joins at once.
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  snapshot_running_ = true;
  snapshot_thread_ = std::thread([this] { WriteScheduledSnapshots(); });
}

void JobJournal::AwaitScheduledSnapshots() {
  absl::MutexLock lock(&snapshot_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_) {
    return pending_snapshots_.empty() && !snapshot_running_;
  };
  snapshot_mu_.Await(absl::Condition(&idle));
}

void JobJournal::WriteScheduledSnapshots() {
  while (true) {
    EpochStart start;
    {
      absl::MutexLock lock(&snapshot_mu_);
      writing_epoch_.reset();  // The previous one is written (or failed).
      if (pending_snapshots_.empty()) {
        snapshot_running_ = false;
        return;
      }
      start = std::move(pending_snapshots_.front());
      pending_snapshots_.pop_front();
      writing_epoch_ = start.epoch;
    }
    const absl::Time begun = absl::Now();
    if (absl::Status s = WriteEpochSnapshot(start); !s.ok()) {
      LOG(ERROR) << dir_ << ": the snapshot of epoch " << start.epoch
                 << " was not written (recovery replays the logs from an older one): " << s;
    } else {
      LOG(INFO) << "event=snapshot_written job=" << start.job << " epoch=" << start.epoch
                << " snapshot_ms=" << absl::ToDoubleMilliseconds(absl::Now() - begun);
    }
  }
}

void JobJournal::StopSnapshots(bool drop_pending) {
  std::thread thread;
  {
    absl::MutexLock lock(&snapshot_mu_);
    snapshots_stopped_ = true;
    if (drop_pending) pending_snapshots_.clear();
    thread = std::move(snapshot_thread_);
  }
  if (thread.joinable()) thread.join();
}

absl::Status JobJournal::StageSnapshot(const state::SnapshotHeader& header,
                                       absl::Span<const float> base,
                                       absl::Span<const float> weights,
                                       absl::Span<const SampleLossStats> loss_stats,
                                       absl::Span<const float> irreducible) {
  return samplerd::StageSnapshot(SnapshotPath(header.epoch()), header, base, weights, loss_stats,
                                 irreducible);
}

absl::Status JobJournal::CommitSnapshot(uint64_t epoch) {
  if (absl::Status s = EnsureLogExists(epoch); !s.ok()) return s;
  if (absl::Status s = samplerd::CommitSnapshot(SnapshotPath(epoch)); !s.ok()) return s;
  return RemoveBefore(epoch);
}

absl::Status JobJournal::EnsureLogExists(uint64_t epoch) {
  // OpenEpoch has usually created it already; an upload's or a creation's snapshot is committed
  // first. Nothing to do either if there is no staged snapshot (the commit then fails).
  {
    absl::MutexLock lock(&mu_);
    if (log_ != nullptr && log_epoch_ == epoch) return absl::OkStatus();
  }
  const std::string path = LogPath(epoch);
  std::error_code ec;
  if (fs::exists(path, ec) || !fs::exists(SnapshotPath(epoch) + ".tmp", ec)) {
    return absl::OkStatus();
  }
  // Created (its header synced) but not made the current log: the current one, if any, may
  // still be appended to. OpenEpoch(epoch) opens it.
  state::LogHeader header;
  header.set_epoch(epoch);
  absl::StatusOr<std::unique_ptr<RecordLogWriter>> created =
      RecordLogWriter::Open(path, header.SerializeAsString());
  if (!created.ok()) return created.status();
  return SyncDirectory(dir_);
}

absl::Status JobJournal::RemoveBefore(uint64_t epoch) const {
  absl::StatusOr<DirFiles> files = ListDir(dir_);
  if (!files.ok()) return files.status();
  // The newest keep_snapshots_ snapshots up to `epoch` stay (the epoch starts a rewind can use).
  std::vector<uint64_t> older;
  for (uint64_t e : files->snapshots) {
    if (e <= epoch) older.push_back(e);
  }
  const size_t keep = keep_snapshots_.load();
  for (size_t i = 0; i + keep < older.size(); ++i) ::unlink(SnapshotPath(older[i]).c_str());
  for (uint64_t e : files->logs) {
    if (e < epoch) ::unlink(LogPath(e).c_str());
  }
  return absl::OkStatus();
}

absl::Status JobJournal::OpenEpoch(uint64_t epoch) {
  // The previous log is made durable before the switch: a caller that appended to it and calls
  // Sync after the switch (which syncs the new log) must not be acknowledged before its records
  // are on disk. Nothing appends to it any more (the job's epoch has moved on); a failure is
  // kept for every later call.
  std::shared_ptr<RecordLogWriter> previous;
  uint64_t previous_epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    previous = log_;
    previous_epoch = log_epoch_;
  }
  if (previous != nullptr && previous_epoch == epoch) return absl::OkStatus();  // Open already.
  if (previous != nullptr) {
    if (absl::Status s = previous->Sync(); !s.ok()) {
      absl::MutexLock lock(&mu_);
      error_ = s;
      return s;
    }
  }
  // A new log's header records the length of the closed one, all of it synced: recovery then
  // detects that log cut short or damaged anywhere, not only before its last sync.
  state::LogHeader header;
  header.set_epoch(epoch);
  if (previous != nullptr && previous_epoch + 1 == epoch) {
    header.set_previous_log_bytes(previous->synced_bytes());
  }
  const std::string path = LogPath(epoch);
  absl::StatusOr<std::unique_ptr<RecordLogWriter>> opened =
      RecordLogWriter::Open(path, header.SerializeAsString());
  if (!opened.ok()) return opened.status();
  if (state::LogHeader existing;
      !existing.ParseFromString((*opened)->header()) || existing.epoch() != epoch) {
    return absl::DataLossError(
        absl::StrCat(path, ": its header is not that of epoch ", epoch, "'s log"));
  }
  if (absl::Status s = SyncDirectory(dir_); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    log_ = *std::move(opened);
    log_epoch_ = epoch;
  }
  std::error_code ec;
  if (!std::filesystem::exists(SnapshotPath(epoch), ec)) return absl::OkStatus();
  return RemoveBefore(epoch);
}

absl::Status JobJournal::Append(absl::string_view record) {
  std::shared_ptr<RecordLogWriter> log;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    log = log_;
  }
  if (log == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(dir_, ": no epoch log open"));
  }
  return log->Append(record);
}

absl::Status JobJournal::Sync() {
  std::shared_ptr<RecordLogWriter> log;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    log = log_;
  }
  return log == nullptr ? absl::OkStatus() : log->Sync();
}

absl::Status JobJournal::Remove() {
  StopSnapshots(/*drop_pending=*/true);
  {
    absl::MutexLock lock(&mu_);
    log_.reset();
  }
  absl::StatusOr<DirFiles> files = ListDir(dir_);
  if (!files.ok()) return files.status();
  for (uint64_t e : files->snapshots) ::unlink(SnapshotPath(e).c_str());
  if (absl::Status s = SyncDirectory(dir_); !s.ok()) return s;
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec) return FsError("remove", dir_, ec);
  return absl::OkStatus();
}

// ---- Rewinds ------------------------------------------------------------------------------------

std::vector<uint64_t> JobJournal::UnwrittenEpochStarts() const {
  absl::MutexLock lock(&snapshot_mu_);
  std::vector<uint64_t> epochs;
  if (writing_epoch_.has_value()) epochs.push_back(*writing_epoch_);
  for (const EpochStart& start : pending_snapshots_) epochs.push_back(start.epoch);
  return epochs;
}

absl::StatusOr<std::vector<uint64_t>> JobJournal::KeptEpochStarts() const {
  // Before listing the files: a snapshot committed in between is then in both, never in
  // neither.
  const std::vector<uint64_t> unwritten = UnwrittenEpochStarts();
  absl::StatusOr<DirFiles> files = ListDir(dir_);
  if (!files.ok()) return files.status();
  std::vector<uint64_t>& kept = files->snapshots;
  kept.insert(kept.end(), unwritten.begin(), unwritten.end());
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  // A snapshot just committed has not yet made RemoveBefore remove the oldest one.
  const size_t keep = keep_snapshots_.load();
  if (kept.size() > keep) kept.erase(kept.begin(), kept.end() - keep);
  return kept;
}

absl::StatusOr<JobJournal::EpochStart> JobJournal::ReadEpochStart(uint64_t epoch) const {
  absl::StatusOr<Snapshot> snapshot = ReadSnapshot(SnapshotPath(epoch));
  if (!snapshot.ok()) return snapshot.status();
  const state::SnapshotHeader& h = snapshot->header;
  if (h.epoch() != epoch) {
    return absl::DataLossError(absl::StrCat(SnapshotPath(epoch), ": holds epoch ", h.epoch()));
  }
  EpochStart start;
  start.job = h.job();
  start.spec = h.spec();
  start.epoch = epoch;
  start.planned = h.planned();
  if (h.has_base()) {
    start.base = std::make_shared<const std::vector<float>>(std::move(snapshot->base));
  }
  start.weights = std::make_shared<const std::vector<float>>(std::move(snapshot->weights));
  start.loss_stats = std::move(snapshot->loss_stats);
  if (!snapshot->irreducible.empty()) {
    start.irreducible =
        std::make_shared<const std::vector<float>>(std::move(snapshot->irreducible));
  }
  start.samples_seen = h.samples_seen();
  start.world_size = h.world_size();
  if (h.has_mixture()) start.mixture = std::make_shared<const state::MixtureState>(h.mixture());
  return start;
}

absl::Status JobJournal::Rewind(uint64_t epoch) {
  std::error_code ec;
  if (!fs::exists(SnapshotPath(epoch), ec)) {
    return absl::NotFoundError(absl::StrCat(SnapshotPath(epoch), ": no such epoch start"));
  }
  // A scheduled snapshot of a later epoch must not be committed after the rewind.
  std::thread writer;
  {
    absl::MutexLock lock(&snapshot_mu_);
    pending_snapshots_.clear();
    writer = std::move(snapshot_thread_);
  }
  if (writer.joinable()) writer.join();
  // The marker first: from here on, a restart finishes the rewind.
  const std::string marker = RewindMarkerPath(epoch);
  const int fd = ::open(marker.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError("create", marker, errno);
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  if (!synced) return PosixError("fsync", marker, sync_errno);
  if (absl::Status s = SyncDirectory(dir_); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    log_.reset();  // The abandoned epochs' log: removed below.
  }
  if (absl::Status s = FinishRewind(*this, epoch); !s.ok()) {
    absl::MutexLock lock(&mu_);
    error_ = s;  // Nothing is acknowledged until a restart finished the rewind.
    return s;
  }
  return OpenEpoch(epoch);
}

absl::Status JobJournal::FinishRewind(const JobJournal& journal, uint64_t epoch) {
  absl::StatusOr<DirFiles> files = ListDir(journal.dir_);
  if (!files.ok()) return files.status();
  // Later snapshots first: a stop midway leaves snapshot-<epoch> the newest, with the marker.
  for (auto e = files->snapshots.rbegin(); e != files->snapshots.rend() && *e > epoch; ++e) {
    const std::string path = journal.SnapshotPath(*e);
    if (::unlink(path.c_str()) != 0) return PosixError("remove", path, errno);
  }
  for (uint64_t e : files->logs) {
    const std::string path = journal.LogPath(e);
    if (e >= epoch && ::unlink(path.c_str()) != 0) return PosixError("remove", path, errno);
  }
  // The epoch's fresh log (its header synced): a committed snapshot always has its log.
  state::LogHeader header;
  header.set_epoch(epoch);
  absl::StatusOr<std::unique_ptr<RecordLogWriter>> created =
      RecordLogWriter::Open(journal.LogPath(epoch), header.SerializeAsString());
  if (!created.ok()) return created.status();
  created->reset();
  if (absl::Status s = SyncDirectory(journal.dir_); !s.ok()) return s;
  const std::string marker = journal.RewindMarkerPath(epoch);
  if (::unlink(marker.c_str()) != 0) return PosixError("remove", marker, errno);
  return SyncDirectory(journal.dir_);
}

// ---- The typed calls ---------------------------------------------------------------------------

absl::Status JobJournal::StageEpochStart(const EpochStart& start) {
  state::SnapshotHeader header;
  header.set_epoch(start.epoch);
  header.set_planned(start.planned);
  header.set_samples_seen(start.samples_seen);
  header.set_world_size(start.world_size);
  const bool has_base = start.base != nullptr && !start.base->empty();
  header.set_has_base(has_base);
  header.set_job(start.job);
  header.set_spec(start.spec);
  if (start.mixture != nullptr) *header.mutable_mixture() = *start.mixture;
  return StageSnapshot(
      header, has_base ? absl::MakeConstSpan(*start.base) : absl::Span<const float>(),
      start.weights != nullptr ? absl::MakeConstSpan(*start.weights) : absl::Span<const float>(),
      start.loss_stats,
      start.irreducible != nullptr ? absl::MakeConstSpan(*start.irreducible)
                                   : absl::Span<const float>());
}

absl::Status JobJournal::StartEpochDurably(const EpochStart& start) {
  if (absl::Status s = StageEpochStart(start); !s.ok()) return s;
  if (absl::Status s = CommitSnapshot(start.epoch); !s.ok()) return s;
  return start.planned ? OpenEpoch(start.epoch) : absl::OkStatus();
}

absl::Status JobJournal::WriteEpochSnapshot(const EpochStart& start) {
  {
    absl::MutexLock lock(&mu_);
    if (log_ == nullptr || log_epoch_ < start.epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_, ": the snapshot of epoch ", start.epoch, " is written after its log is opened"));
    }
  }
  if (!start.loss_stats_from_logs) {
    if (absl::Status s = StageEpochStart(start); !s.ok()) return s;
    return CommitSnapshot(start.epoch);
  }
  EpochStart derived = start;
  if (absl::Status s = DeriveLossStats(&derived); !s.ok()) return s;
  if (absl::Status s = StageEpochStart(derived); !s.ok()) return s;
  return CommitSnapshot(start.epoch);
}

absl::Status JobJournal::DeriveLossStats(EpochStart* start) const {
  absl::StatusOr<DirFiles> files = ListDir(dir_);
  if (!files.ok()) return files.status();
  const auto newest = std::find_if(files->snapshots.rbegin(), files->snapshots.rend(),
                                   [&](uint64_t e) { return e < start->epoch; });
  if (newest == files->snapshots.rend()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir_, ": no snapshot before epoch ", start->epoch, " to derive it from"));
  }
  absl::StatusOr<std::unique_ptr<BackendLossStats>> stats = start->loss_stats_from_logs();
  if (!stats.ok()) return stats.status();
  BackendLossStats& table = **stats;
  {
    absl::StatusOr<Snapshot> previous = ReadSnapshot(SnapshotPath(*newest));
    if (!previous.ok()) return previous.status();
    if (!previous->loss_stats.empty()) {
      if (absl::Status s = table.Restore(previous->loss_stats); !s.ok()) {
        return absl::DataLossError(absl::StrCat(SnapshotPath(*newest), ": ", s.message()));
      }
    }
  }  // Its base and weights are not needed: freed here.
  for (uint64_t e = *newest; e < start->epoch; ++e) {
    const std::string path = LogPath(e);
    absl::StatusOr<RecordLogContents> log = ReadRecordLog(path);
    if (!log.ok()) return log.status();
    state::WalRecord record;
    for (size_t i = 0; i < log->records.size(); ++i) {
      if (!record.ParseFromString(log->records[i])) {
        return absl::DataLossError(absl::StrCat(path, ": record ", i, " is malformed"));
      }
      if (!record.has_losses()) continue;
      // The batch as the job applied it: one Apply in arrival order (a loss of an index that
      // already has one in its epoch is a duplicate). Sizes and indices are checked by Apply.
      const LossBatchView batch = LossesView(record.losses());
      if (absl::StatusOr<uint64_t> applied = table.Apply(batch.epoch, batch.indices, batch.losses);
          !applied.ok()) {
        return absl::DataLossError(
            absl::StrCat(path, ": record ", i, " does not apply: ", applied.status().message()));
      }
    }
  }
  start->samples_seen = table.SamplesSeen();
  if (start->samples_seen > 0) {
    absl::StatusOr<std::vector<SampleLossStats>> host = table.ToHost();
    if (!host.ok()) return host.status();
    start->loss_stats = *std::move(host);
  }
  return absl::OkStatus();
}

JobJournal::EncodedLosses::EncodedLosses(const LossBatchView& batch) {
  state::WalRecord record;
  state::Losses* losses = record.mutable_losses();
  losses->set_epoch(batch.epoch);
  losses->set_rank(batch.rank);
  losses->set_seq(batch.seq);
  losses->set_deal(batch.deal);
  losses->mutable_indices()->Add(batch.indices.begin(), batch.indices.end());
  losses->mutable_losses()->Add(batch.losses.begin(), batch.losses.end());
  if (batch.consecutive) {
    losses->set_first_position(batch.first_position);  // 1 number instead of one per pair.
  } else {
    losses->mutable_positions()->Add(batch.positions.begin(), batch.positions.end());
  }
  bytes_ = record.SerializeAsString();
}

absl::Status JobJournal::LogLosses(const EncodedLosses& batch) {
  return AppendUnlessReplaying(batch.bytes_);
}

absl::Status JobJournal::LogRankEnded(uint64_t epoch, uint32_t deal, uint32_t rank) {
  state::WalRecord record;
  record.mutable_rank_ended()->set_epoch(epoch);
  record.mutable_rank_ended()->set_deal(deal);
  record.mutable_rank_ended()->set_rank(rank);
  return Log(record);
}

absl::Status JobJournal::LogStreamed(uint64_t epoch, uint32_t deal, uint32_t rank,
                                     uint64_t position) {
  state::WalRecord record;
  state::Streamed* streamed = record.mutable_streamed();
  streamed->set_epoch(epoch);
  streamed->set_deal(deal);
  streamed->set_rank(rank);
  streamed->set_position(position);
  return Log(record);
}

absl::Status JobJournal::LogResized(uint64_t epoch, uint32_t world_size) {
  state::WalRecord record;
  record.mutable_resized()->set_epoch(epoch);
  record.mutable_resized()->set_world_size(world_size);
  return Log(record);
}

absl::Status JobJournal::LogGroupWeightsSet(uint64_t epoch, absl::Span<const double> weights) {
  state::WalRecord record;
  state::GroupWeightsSet* set = record.mutable_group_weights_set();
  set->set_epoch(epoch);
  set->mutable_weights()->Add(weights.begin(), weights.end());
  return Log(record);
}

absl::Status JobJournal::Log(const state::WalRecord& record) {
  return AppendUnlessReplaying(record.SerializeAsString());
}

absl::Status JobJournal::AppendUnlessReplaying(absl::string_view record) {
  {
    absl::MutexLock lock(&mu_);
    if (replaying_) return absl::OkStatus();
  }
  return Append(record);
}

absl::Status JobJournal::Replay(const std::vector<state::WalRecord>& records,
                                const ReplayHandlers& handlers) const {
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
      case state::WalRecord::kResized:
        epoch = r.resized().epoch();
        break;
      case state::WalRecord::kGroupWeightsSet:
        epoch = r.group_weights_set().epoch();
        break;
      default:
        return absl::DataLossError(absl::StrCat(dir_, ": log record ", i, " has no kind"));
    }
    absl::Status s = handlers.before_record(epoch);
    if (s.ok()) {
      switch (r.kind_case()) {
        case state::WalRecord::kLosses:
          s = handlers.losses(LossesView(r.losses()));
          break;
        case state::WalRecord::kRankEnded:
          s = handlers.rank_ended(r.rank_ended().epoch(), r.rank_ended().deal(),
                                  r.rank_ended().rank());
          break;
        case state::WalRecord::kStreamed:
          s = handlers.streamed(r.streamed().epoch(), r.streamed().deal(), r.streamed().rank(),
                                r.streamed().position());
          break;
        case state::WalRecord::kGroupWeightsSet:
          s = handlers.group_weights_set(
              r.group_weights_set().epoch(),
              std::vector<double>(r.group_weights_set().weights().begin(),
                                  r.group_weights_set().weights().end()));
          break;
        default:
          s = handlers.resized(r.resized().epoch(), r.resized().world_size());
          break;
      }
    }
    if (!s.ok()) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": log record ", i, " does not apply: ", s.message()));
    }
  }
  return absl::OkStatus();
}

void JobJournal::EndReplay() {
  absl::MutexLock lock(&mu_);
  replaying_ = false;
}

}  // namespace samplerd
