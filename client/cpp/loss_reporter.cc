#include "client/cpp/loss_reporter.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <deque>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/device_port.h"
#include "proto/loss_pairs.h"
#include "proto/samplerd.pb.h"

namespace samplerd {
namespace {

// The status every call returns after a successful Close().
absl::Status ClosedStatus() { return absl::FailedPreconditionError("LossReporter: closed"); }

// The positions of a batch, for error messages: "positions [a, b)" or "positions a, b, ...".
std::string PositionsText(const v1::LossBatch& batch) {
  if (batch.has_first_position()) {
    return absl::StrCat("positions [", batch.first_position(), ", ",
                        batch.first_position() + batch.indices_size(), ")");
  }
  std::string text = "positions ";
  for (int k = 0; k < std::min(batch.positions_size(), 4); ++k) {
    absl::StrAppend(&text, k > 0 ? ", " : "", batch.positions(k));
  }
  if (batch.positions_size() > 4) absl::StrAppend(&text, ", ... (", batch.positions_size(), ")");
  return text;
}

// The pairs a staging slot of ReportFromDevice holds while in use (its buffers: the
// device_port::LossStaging).
struct DeviceSlot {
  uint64_t epoch = 0;
  uint64_t first_position = 0;
  size_t pairs = 0;
};

}  // namespace

class LossReporter::Impl {
 public:
  Impl(SamplerClient* client, std::string job, uint32_t rank, const v1::Job& described,
       LossReporterOptions options)
      : client_(client),
        job_(std::move(job)),
        rank_(rank),
        num_samples_(described.spec().num_samples()),
        dealt_epoch_(described.current_epoch()),
        dealt_deal_(described.deal()),
        options_(options),
        sender_([this] { SendLoop(); }) {}

  ~Impl() { Close().IgnoreError(); }

  // Report and ReportAt: `first_position` set for consecutive positions, else `positions`.
  absl::Status Add(uint64_t epoch, std::optional<uint64_t> first_position,
                   absl::Span<const uint64_t> positions, absl::Span<const uint64_t> indices,
                   absl::Span<const float> losses) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!first_position.has_value() && positions.size() != indices.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions: ", positions.size(), " entries but indices: ", indices.size()));
    }
    if (absl::Status s = ValidateLossPairs(indices, losses, num_samples_); !s.ok()) return s;
    if (indices.size() > options_.max_buffered_pairs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices: ", indices.size(),
          " pairs in one call; at most max_buffered_pairs = ", options_.max_buffered_pairs));
    }
    if (indices.empty()) return CurrentStatus();
    absl::MutexLock lock(&mu_);
    if (!stopped_.ok()) return stopped_;
    counts_.reported += indices.size();
    unacknowledged_pairs_ += indices.size();
    return AppendLocked(epoch, first_position, positions, indices, losses);
  }

  absl::Status AddFromDevice(uint64_t epoch, uint64_t first_position, const int64_t* d_indices,
                             const float* d_losses, size_t n, DeviceStream stream)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (n == 0) return CurrentStatus();
    if (d_indices == nullptr || d_losses == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(d_indices == nullptr ? "d_indices" : "d_losses", ": null with n = ", n));
    }
    if (absl::Status s = device_port::Available(); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    if (!stopped_.ok()) return stopped_;
    if (staging_ == nullptr) {
      if (absl::Status s = AllocateSlotsLocked(); !s.ok()) return s;
    }
    for (size_t done = 0; done < n;) {
      mu_.Await(absl::Condition(this, &Impl::SlotFreeOrStopped));
      if (!stopped_.ok()) return stopped_;
      const size_t id = free_slots_.back();
      DeviceSlot& slot = slots_[id];
      slot.epoch = epoch;
      slot.first_position = first_position + done;
      // At most max_buffered_pairs too: the device thread appends a slot's pairs in one piece,
      // and a piece larger than the buffer would wait for room forever (Report refuses such a
      // call instead; here it is split).
      slot.pairs = std::min({n - done, options_.device_slot_pairs, options_.max_buffered_pairs});
      // Enqueued under the lock (a few microseconds) so that Close never sees a slot whose
      // copies are enqueued but not yet waited for.
      bool fenced = false;
      if (absl::Status s =
              staging_->Enqueue(id, d_indices + done, d_losses + done, slot.pairs, stream, &fenced);
          !s.ok()) {
        // A copy enqueued before the failure may still write into the slot: the slot goes back
        // to the free list only through the device thread, after the fence behind it; if even
        // that could not be recorded the slot is never reused.
        free_slots_.pop_back();
        if (fenced) device_pending_.push_back({id, /*report=*/false});
        return s;
      }
      free_slots_.pop_back();
      device_pending_.push_back({id, /*report=*/true});
      counts_.reported += slot.pairs;
      unacknowledged_pairs_ += slot.pairs;
      done += slot.pairs;
    }
    return absl::OkStatus();
  }

  absl::Status Flush() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    AwaitFlushedLocked();
    return stopped_;
  }

  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_, close_mu_) {
    absl::MutexLock close(&close_mu_);
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      AwaitFlushedLocked();
      if (stopped_.ok()) stopped_ = ClosedStatus();
      status = stopped_ == ClosedStatus() ? absl::OkStatus() : stopped_;
      // The device thread drains its slots' copies (they write into our pinned memory) and ends.
      device_thread_stop_ = true;
    }
    if (sender_.joinable()) sender_.join();
    if (device_thread_.joinable()) device_thread_.join();
    return status;
  }

  LossCounts counts() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  // A device slot waiting for its copies, in the order of the ReportFromDevice calls.
  struct PendingSlot {
    size_t id;
    bool report;  // False for a slot whose enqueue failed: only waited for.
  };

  // Waits until every pair reported is acknowledged or the reporter stopped; meanwhile the
  // sender sends a partial batch without lingering.
  void AwaitFlushedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++urgent_waiters_;
    mu_.Await(absl::Condition(this, &Impl::FlushedOrStopped));
    --urgent_waiters_;
  }

  absl::Status CurrentStatus() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }

  // Waits for room, then appends the pairs to the open batch, sealing batches as they fill.
  // Requires validated pairs.
  absl::Status AppendLocked(uint64_t epoch, std::optional<uint64_t> first_position,
                            absl::Span<const uint64_t> positions,
                            absl::Span<const uint64_t> indices, absl::Span<const float> losses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t n = indices.size();
    const RoomOrStopped room{this, n};
    if (!room()) {
      ++urgent_waiters_;
      mu_.Await(absl::Condition(&room));
      --urgent_waiters_;
    }
    if (!stopped_.ok()) return stopped_;
    buffered_pairs_ += n;
    for (size_t done = 0; done < n;) {
      const std::optional<uint64_t> first = first_position.has_value()
                                                ? std::optional<uint64_t>(*first_position + done)
                                                : std::nullopt;
      if (!Extends(epoch, first)) {
        SealLocked();
        if (spare_.empty()) {
          open_.emplace();
        } else {
          open_ = std::move(spare_.back());
          spare_.pop_back();
        }
        open_->set_job(job_);
        open_->set_epoch(epoch);
        open_->set_rank(rank_);
        open_->set_deal(epoch == dealt_epoch_ ? dealt_deal_ : 0);
        if (first.has_value()) open_->set_first_position(*first);
      }
      const size_t take =
          std::min(n - done, options_.max_batch_pairs - static_cast<size_t>(open_->indices_size()));
      open_->mutable_indices()->Add(indices.begin() + done, indices.begin() + done + take);
      open_->mutable_losses()->Add(losses.begin() + done, losses.begin() + done + take);
      if (!first.has_value()) {
        open_->mutable_positions()->Add(positions.begin() + done, positions.begin() + done + take);
      }
      done += take;
      if (static_cast<size_t>(open_->indices_size()) == options_.max_batch_pairs) SealLocked();
    }
    return absl::OkStatus();
  }

  // Whether pairs of `epoch` starting at `first` (or with positions listed, when unset) can be
  // appended to the open batch.
  bool Extends(uint64_t epoch, std::optional<uint64_t> first) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!open_.has_value() || open_->epoch() != epoch ||
        static_cast<size_t>(open_->indices_size()) >= options_.max_batch_pairs ||
        open_->has_first_position() != first.has_value()) {
      return false;
    }
    return !first.has_value() || open_->first_position() + open_->indices_size() == *first;
  }

  void SealLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!open_.has_value()) return;
    open_->set_seq(next_seq_++);
    sealed_.push_back(*std::move(open_));
    open_.reset();
  }

  // The first error stops the reporter: what is not yet acknowledged is dropped, and every
  // waiting or later call returns `error`.
  void StopLocked(absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!stopped_.ok()) return;
    stopped_ = std::move(error);
    open_.reset();
    sealed_.clear();
  }

  // Prefixes `status` with what the reporter was doing, keeping its code.
  absl::Status Explained(const absl::Status& status, const std::string& what) const {
    return absl::Status(status.code(), absl::StrCat("LossReporter (job \"", job_, "\", rank ",
                                                    rank_, "): ", what, ": ", status.message()));
  }

  // The background sender: takes the sealed batches (sealing the open one when there is
  // nothing else), sends them on one ReportLosses stream and counts the summary. Batches keep
  // being appended while a stream is in flight, so the batches grow with the load. A Report never
  // wakes the sender (a futex wake would cost the training thread microseconds per step): the
  // sender wakes for a full batch, a Flush, a Report waiting for room, or after `linger`; and
  // right after a stream it sends what accumulated meanwhile without lingering.
  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<v1::LossBatch> stream;
    bool just_sent = false;
    for (;;) {
      size_t pairs = 0;
      {
        absl::MutexLock lock(&mu_);
        if (!(just_sent && open_.has_value())) {
          mu_.AwaitWithTimeout(absl::Condition(this, &Impl::SendNowOrStopped), options_.linger);
        }
        if (!stopped_.ok()) return;
        if (sealed_.empty()) SealLocked();
        while (!sealed_.empty() && (stream.empty() || pairs + sealed_.front().indices_size() <=
                                                          options_.max_stream_pairs)) {
          pairs += sealed_.front().indices_size();
          stream.push_back(std::move(sealed_.front()));
          sealed_.pop_front();
        }
      }
      just_sent = !stream.empty();
      if (stream.empty()) continue;
      // Retried whole by the client on UNAVAILABLE: the positions make a resent batch count as
      // duplicates where its first send was applied.
      absl::StatusOr<v1::LossReportSummary> summary =
          options_.claim != nullptr ? client_->ReportLosses(absl::MakeSpan(stream), options_.claim)
                                    : client_->ReportLosses(stream);
      // Acknowledged batches keep their arrays for the next ones (Clear keeps the repeated
      // fields' capacity): in the steady state a Report neither allocates nor faults in fresh
      // pages, it copies. Whatever is freed is freed outside mu_, off the Reports' path.
      if (summary.ok()) {
        for (v1::LossBatch& batch : stream) batch.Clear();
      }
      {
        absl::MutexLock lock(&mu_);
        if (!summary.ok()) {
          const v1::LossBatch& first = stream.front();
          StopLocked(Explained(
              summary.status(),
              absl::StrCat("ReportLosses of batches seq ", first.seq(), " to ", stream.back().seq(),
                           " (the first: epoch ", first.epoch(), ", ", PositionsText(first), ")")));
          return;
        }
        counts_.accepted += summary->accepted();
        counts_.duplicates += summary->duplicates();
        counts_.stale += summary->stale();
        counts_.acknowledged += summary->accepted() + summary->duplicates() + summary->stale();
        counts_.batches += stream.size();
        counts_.streams += 1;
        buffered_pairs_ -= pairs;
        unacknowledged_pairs_ -= pairs;
        for (v1::LossBatch& batch : stream) {
          if (spare_.size() >= SpareLimit()) break;
          spare_.push_back(std::move(batch));
        }
      }
      stream.clear();
    }
  }

  absl::Status AllocateSlotsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::unique_ptr<device_port::LossStaging>> staging =
        device_port::NewLossStaging(options_.device_slots, options_.device_slot_pairs);
    if (!staging.ok()) return staging.status();
    staging_ = *std::move(staging);
    slots_.resize(options_.device_slots);
    for (size_t id = 0; id < slots_.size(); ++id) free_slots_.push_back(id);
    device_thread_ = std::thread([this] { DeviceLoop(); });
    return absl::OkStatus();
  }

  // The device thread: waits for each slot's copies in order, then reports its pairs as Report
  // would (validation included: a bad pair stops the reporter, surfacing at the next call).
  void DeviceLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    // The slots' fences belong to the trainer's device; a new thread starts on device 0.
    staging_->BindThread();
    for (;;) {
      PendingSlot pending;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Impl::DeviceWorkOrStop));
        if (device_pending_.empty()) return;
        pending = device_pending_.front();
      }
      // slots_ is not resized while the device thread runs; the slot is ours until freed.
      DeviceSlot& slot = slots_[pending.id];
      const absl::Status landed = staging_->Await(pending.id);
      const absl::Span<const uint64_t> indices(staging_->indices(pending.id), slot.pairs);
      const absl::Span<const float> losses(staging_->losses(pending.id), slot.pairs);
      absl::Status valid = landed;
      if (valid.ok() && pending.report) valid = ValidateLossPairs(indices, losses, num_samples_);
      absl::MutexLock lock(&mu_);
      if (pending.report && stopped_.ok()) {
        if (!valid.ok()) {
          StopLocked(Explained(
              valid, absl::StrCat("ReportFromDevice(epoch ", slot.epoch, ", first_position ",
                                  slot.first_position, ", n ", slot.pairs, ")")));
        } else {
          AppendLocked(slot.epoch, slot.first_position, {}, indices, losses).IgnoreError();
        }
      }
      device_pending_.pop_front();
      free_slots_.push_back(pending.id);
    }
  }

  // Conditions (mu_ held).
  // Enough spare batches for a full buffer of full batches, and one more being filled.
  size_t SpareLimit() const { return options_.max_buffered_pairs / options_.max_batch_pairs + 1; }

  bool SendNowOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stopped_.ok() || !sealed_.empty() || (urgent_waiters_ > 0 && open_.has_value());
  }
  bool FlushedOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stopped_.ok() || unacknowledged_pairs_ == 0;
  }
  bool RoomOrStoppedLocked(size_t pairs) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stopped_.ok() || buffered_pairs_ + pairs <= options_.max_buffered_pairs;
  }
  // The same as a functor for absl::Condition, which evaluates it with mu_ held.
  struct RoomOrStopped {
    const Impl* impl;
    size_t pairs;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return impl->RoomOrStoppedLocked(pairs);
    }
  };
  bool SlotFreeOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stopped_.ok() || !free_slots_.empty();
  }
  bool DeviceWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !device_pending_.empty() || device_thread_stop_;
  }

  SamplerClient* const client_;
  const std::string job_;
  const uint32_t rank_;
  const uint64_t num_samples_;
  // The job's current epoch and its deal at creation (the group's): later epochs start at deal 0.
  const uint64_t dealt_epoch_;
  const uint32_t dealt_deal_;
  const LossReporterOptions options_;

  // Serialises Close() (its joins) against itself.
  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // The reporter's phase: OK while it runs; else why it stopped (the first error, or
  // ClosedStatus() after Close). Every call returns it once it is not OK.
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
  // The batch Reports are appended to; sealed when full, when a Report does not extend it, or
  // when the sender has nothing else to send.
  std::optional<v1::LossBatch> open_ ABSL_GUARDED_BY(mu_);
  // Sealed batches, oldest first, not yet taken by the sender.
  std::deque<v1::LossBatch> sealed_ ABSL_GUARDED_BY(mu_);
  // Cleared batches whose arrays are reused (at most SpareLimit()).
  std::vector<v1::LossBatch> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Host pairs held (open, sealed and in flight): bounded by max_buffered_pairs.
  size_t buffered_pairs_ ABSL_GUARDED_BY(mu_) = 0;
  // Flush, Close and Reports waiting for room: the sender sends the open batch at once for them.
  int urgent_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // Pairs reported (host or device) and not yet acknowledged: Flush waits for 0.
  uint64_t unacknowledged_pairs_ ABSL_GUARDED_BY(mu_) = 0;
  LossCounts counts_ ABSL_GUARDED_BY(mu_);

  // ReportFromDevice's staging, made at its first call (through the device port: none in the
  // CPU-only library) and freed with the reporter, after Close joined the device thread.
  // staging_ and slots_ are written once, under mu_, before the device thread starts; the device
  // thread reads a slot outside mu_ only between taking it from device_pending_ and freeing it.
  std::unique_ptr<device_port::LossStaging> staging_;
  std::vector<DeviceSlot> slots_;
  std::vector<size_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingSlot> device_pending_ ABSL_GUARDED_BY(mu_);
  bool device_thread_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread device_thread_;

  std::thread sender_;  // Last: starts once everything above is constructed.
};

LossReporter::LossReporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LossReporter::~LossReporter() = default;

absl::StatusOr<std::unique_ptr<LossReporter>> LossReporter::Create(SamplerClient* client,
                                                                   const std::string& job,
                                                                   uint32_t rank,
                                                                   uint32_t world_size,
                                                                   LossReporterOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("client: null");
  if (world_size == 0 || world_size > v1::MAX_WORLD_SIZE) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", world_size, ": must be in [1, ", v1::MAX_WORLD_SIZE, "]"));
  }
  if (rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, ": must be < world_size = ", world_size));
  }
  if (options.max_batch_pairs == 0 || options.max_batch_pairs > v1::MAX_LOSS_BATCH_PAIRS) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch_pairs = ", options.max_batch_pairs,
                                                   ": must be in [1, ", v1::MAX_LOSS_BATCH_PAIRS,
                                                   "]"));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, size_t>{"max_buffered_pairs", options.max_buffered_pairs},
        {"max_stream_pairs", options.max_stream_pairs},
        {"device_slots", options.device_slots},
        {"device_slot_pairs", options.device_slot_pairs}}) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat(name, " = 0: must be >= 1"));
  }
  if (options.linger <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("linger = ", absl::FormatDuration(options.linger), ": must be > 0"));
  }
  absl::StatusOr<v1::Job> found = client->GetJob(job);
  if (!found.ok()) return found.status();
  if (found->world_size() != world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "world_size = ", world_size, " does not match the ", found->world_size(),
        " ranks that epoch ", found->current_epoch(), " of job \"", job,
        "\" is dealt to: a resized group's first rank calls SamplerClient::ResizeJob before "
        "its ranks create their reporters"));
  }
  return std::unique_ptr<LossReporter>(
      new LossReporter(std::make_unique<Impl>(client, job, rank, *found, options)));
}

absl::Status LossReporter::Report(uint64_t epoch, uint64_t first_position,
                                  absl::Span<const uint64_t> indices,
                                  absl::Span<const float> losses) {
  return impl_->Add(epoch, first_position, {}, indices, losses);
}

absl::Status LossReporter::ReportAt(uint64_t epoch, absl::Span<const uint64_t> positions,
                                    absl::Span<const uint64_t> indices,
                                    absl::Span<const float> losses) {
  return impl_->Add(epoch, std::nullopt, positions, indices, losses);
}

absl::Status LossReporter::ReportFromDevice(uint64_t epoch, uint64_t first_position,
                                            const int64_t* d_indices, const float* d_losses,
                                            size_t n, DeviceStream stream) {
  return impl_->AddFromDevice(epoch, first_position, d_indices, d_losses, n, stream);
}

absl::Status LossReporter::Flush() { return impl_->Flush(); }

absl::Status LossReporter::Close() { return impl_->Close(); }

LossCounts LossReporter::counts() const { return impl_->counts(); }

}  // namespace samplerd
