#include "client/cpp/shard_reader.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

// One epoch's shard streamed into the ring, by a thread of its own, from StartEpoch until the
// reader closes it. The ring is a single-producer single-consumer queue: the thread writes the
// indices at stream counts [produced_, released_ + capacity) outside the lock and publishes them
// by advancing produced_; the consumer reads [released_, produced_) and gives space back by
// advancing released_ (lazily: a batch stays readable until the next call). Counts are relative
// to the stream's start position; count k lives in ring slot k % capacity.
//
// Back-pressure: a stream is never held open while the queue is full (the server would end it at
// its deadline, and hold a thread and a buffer meanwhile). A chunk that does not fit is queued
// as far as it fits, the stream is cancelled, and reopened at the next position once half the
// queue is free or the consumer waits for more than is queued.
class ShardReader::EpochStream {
 public:
  // Where the stream stands; the consumer's view of it.
  enum class Phase {
    kOpening,    // No chunk yet: shard length unknown.
    kStreaming,  // Chunks arriving (or paused on a full queue); more to come.
    kComplete,   // The rest of the shard is queued.
    kFailed,     // Retries ran out, or the server refused: error_ says why.
  };

  EpochStream(SamplerClient* client, const ShardReaderOptions& options, uint32_t chunk_size,
              uint64_t* ring, uint64_t epoch, uint32_t deal, uint64_t start)
      : client_(client),
        options_(options),
        chunk_size_(chunk_size),
        ring_(ring),
        capacity_(options.queue_capacity),
        epoch_(epoch),
        deal_(deal),
        start_(start) {
    thread_ = std::thread([this] { Run(); });
  }

  // Cancels the stream and joins the thread.
  ~EpochStream() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    cancellation_.Cancel();
    thread_.join();
  }

  uint64_t epoch() const { return epoch_; }
  uint32_t deal() const { return deal_; }
  uint64_t start() const { return start_; }
  // The shard's length: known once the stream opened (every chunk carries it).
  uint64_t shard_length() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return shard_length_;
  }

  // Waits for the first chunk or a failure; the failure, if any.
  absl::Status AwaitOpened() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Phase* phase) { return *phase != Phase::kOpening; }, &phase_));
    return phase_ == Phase::kFailed ? error_ : absl::OkStatus();
  }

  // Gives back the ring up to `read` (what the consumer has taken), then waits until `count`
  // more indices from `read` are queued, or the shard ends first, or the stream failed. Returns
  // how many of them are queued (< count only at the end of the shard), or the error.
  absl::StatusOr<uint64_t> Take(uint64_t read, uint64_t count, uint64_t* shard_length)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    released_ = read;
    wanted_ = read + count;
    mu_.Await(absl::Condition(this, &EpochStream::CanTake));
    *shard_length = shard_length_;
    if (produced_ >= wanted_) return count;
    if (phase_ == Phase::kComplete) return produced_ - read;
    return error_;
  }

 private:
  bool CanTake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return produced_ >= wanted_ || phase_ == Phase::kComplete || phase_ == Phase::kFailed;
  }
  // A paused stream reopens when half the queue is free, or when the consumer waits for more
  // than is queued (it has released everything it read, so what it waits for fits).
  bool CanResume() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || capacity_ - (produced_ - released_) >= capacity_ / 2 || wanted_ > produced_;
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t next = start_;  // First shard position not queued.
    for (;;) {
      bool paused = false;
      StreamShardOptions stream_options;
      stream_options.start_offset = next;
      stream_options.max_chunk_size = chunk_size_;
      stream_options.cancellation = &cancellation_;
      stream_options.deal = deal_;
      stream_options.claim = options_.claim;
      absl::Status status = client_->StreamShard(
          options_.job, epoch_, options_.rank, options_.world_size, stream_options,
          [&](const ShardSlice& slice) { return Queue(slice, &next, &paused); });
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (paused) {
        mu_.Await(absl::Condition(this, &EpochStream::CanResume));
        if (stop_) return;
        continue;
      }
      // SamplerClient::StreamShard's errors name the shard and the position already.
      if (status.ok() && phase_ != Phase::kComplete) {
        status = ShardStreamError(
            absl::InternalError(absl::StrCat(
                "the stream ended before the end of the shard (length ", shard_length_, ")")),
            options_.job, epoch_, options_.rank, options_.world_size, next);
      }
      if (!status.ok()) {
        phase_ = Phase::kFailed;
        error_ = status;
      }
      return;
    }
  }

  // StreamShard's callback: queues as much of `slice` as fits; sets *paused (and stops the
  // stream) if not all of it did.
  absl::Status Queue(const ShardSlice& slice, uint64_t* next, bool* paused)
      ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t produced, free;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::CancelledError("the reader closed the epoch");
      shard_length_ = slice.shard_length;
      produced = produced_;
      free = capacity_ - (produced_ - released_);
    }
    const uint64_t fits = std::min<uint64_t>(free, slice.indices.size());
    // Outside the lock: the consumer reads only below produced_, and never the slots written here.
    const uint64_t slot = produced % capacity_;
    const uint64_t first = std::min<uint64_t>(fits, capacity_ - slot);
    std::memcpy(ring_ + slot, slice.indices.data(), first * sizeof(uint64_t));
    std::memcpy(ring_, slice.indices.data() + first, (fits - first) * sizeof(uint64_t));
    *next += fits;
    absl::MutexLock lock(&mu_);
    produced_ += fits;
    phase_ = *next >= shard_length_ ? Phase::kComplete : Phase::kStreaming;
    if (fits < slice.indices.size()) {
      *paused = true;
      return absl::ResourceExhaustedError("the reader's queue is full");  // Not an error.
    }
    return absl::OkStatus();
  }

  SamplerClient* const client_;
  const ShardReaderOptions& options_;
  const uint32_t chunk_size_;
  uint64_t* const ring_;
  const uint64_t capacity_;
  const uint64_t epoch_;
  const uint32_t deal_;
  const uint64_t start_;
  StreamCancellation cancellation_;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kOpening;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // Set in kFailed.
  uint64_t shard_length_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t produced_ ABSL_GUARDED_BY(mu_) = 0;  // Queued so far.
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;  // Given back by the consumer.
  uint64_t wanted_ ABSL_GUARDED_BY(mu_) = 0;    // What the consumer waits for (or last did).
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Last: runs Run(), which uses everything above.
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Create(
    std::shared_ptr<SamplerClient> client, ShardReaderOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("client: must not be null");
  if (options.job.empty()) return absl::InvalidArgumentError("job = \"\": must not be empty");
  if (options.world_size == 0) return absl::InvalidArgumentError("world_size = 0: must be >= 1");
  if (options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", options.rank, ": must be < world_size = ", options.world_size));
  }
  if (options.queue_capacity < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_capacity = ", options.queue_capacity, ": must be >= 2"));
  }
  if (options.max_chunk_size > static_cast<uint32_t>(v1::MAX_SHARD_CHUNK_SIZE)) {
    return absl::InvalidArgumentError(absl::StrCat("max_chunk_size = ", options.max_chunk_size,
                                                   ": must be <= ", v1::MAX_SHARD_CHUNK_SIZE));
  }
  if (options.device_staging_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_staging_slots = ", options.device_staging_slots, ": must be >= 1"));
  }
  return std::unique_ptr<ShardReader>(new ShardReader(std::move(client), std::move(options)));
}

ShardReader::ShardReader(std::shared_ptr<SamplerClient> client, ShardReaderOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      chunk_size_(static_cast<uint32_t>(std::min<uint64_t>(
          options_.max_chunk_size == 0 ? static_cast<uint64_t>(v1::DEFAULT_SHARD_CHUNK_SIZE)
                                       : options_.max_chunk_size,
          options_.queue_capacity / 2))),
      // Not value-initialised: the stream writes every slot before the consumer reads it.
      ring_(new uint64_t[options_.queue_capacity]) {}

ShardReader::~ShardReader() { CloseEpoch(); }

void ShardReader::CloseEpoch() {
  stream_.reset();
  read_ = 0;
}

absl::Status ShardReader::StartEpoch(uint64_t epoch, uint64_t start_position, uint32_t deal) {
  CloseEpoch();
  auto stream = std::make_unique<EpochStream>(client_.get(), options_, chunk_size_, ring_.get(),
                                              epoch, deal, start_position);
  if (absl::Status s = stream->AwaitOpened(); !s.ok()) return s;
  stream_ = std::move(stream);
  return absl::OkStatus();
}

absl::Status ShardReader::Resume(const ReaderPosition& position) {
  if (absl::Status s = position.CheckOwner(options_.job, options_.rank, options_.world_size);
      !s.ok()) {
    return s;
  }
  return StartEpoch(position.epoch, position.position, position.deal);
}

absl::Status ShardReader::CheckCanRead(size_t n) const {
  if (n == 0) return absl::InvalidArgumentError("n = 0: must be >= 1");
  if (n > options_.queue_capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("n = ", n, ": must be <= queue_capacity = ", options_.queue_capacity));
  }
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", options_.job, "\" rank ", options_.rank,
        ": no epoch is open (call StartEpoch or Resume first, or again after it failed)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardBatch> ShardReader::Next(size_t n) {
  if (absl::Status s = CheckCanRead(n); !s.ok()) return s;
  ShardBatch batch;
  batch.epoch = stream_->epoch();
  batch.position = stream_->start() + read_;
  absl::StatusOr<uint64_t> count = stream_->Take(read_, n, &batch.shard_length);
  if (!count.ok()) return count.status();
  const uint64_t capacity = options_.queue_capacity;
  const uint64_t slot = read_ % capacity;
  if (slot + *count <= capacity) {
    batch.indices = absl::MakeConstSpan(ring_.get() + slot, *count);
  } else {  // Wraps around the end of the ring: copied to be contiguous.
    const uint64_t first = capacity - slot;
    wrapped_.assign(ring_.get() + slot, ring_.get() + capacity);
    wrapped_.insert(wrapped_.end(), ring_.get(), ring_.get() + (*count - first));
    batch.indices = absl::MakeConstSpan(wrapped_);
  }
  read_ += *count;
  return batch;
}

absl::StatusOr<ShardBatch> ShardReader::NextToDevice(size_t n, int64_t* device_indices,
                                                     DeviceStream stream) {
  if (absl::Status s = CheckCanRead(n); !s.ok()) return s;
  if (uploader_ == nullptr) {
    absl::StatusOr<std::unique_ptr<device_port::Uploader>> uploader =
        device_port::NewUploader(options_.device_staging_slots);
    if (!uploader.ok()) return uploader.status();
    uploader_ = *std::move(uploader);
  }
  absl::StatusOr<ShardBatch> batch = Next(n);
  if (!batch.ok() || batch->end_of_shard()) return batch;
  // uint64_t and int64_t agree bit for bit on indices < 2^63.
  if (absl::Status s = uploader_->Upload(
          batch->indices.data(), batch->indices.size() * sizeof(uint64_t), device_indices, stream);
      !s.ok()) {
    // Not consumed: the ring is given back only by the next Take, so the batch is still there.
    read_ -= batch->indices.size();
    return s;
  }
  return batch;
}

absl::StatusOr<ReaderPosition> ShardReader::position() const {
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", options_.job, "\" rank ", options_.rank, ": no epoch is open, no position"));
  }
  ReaderPosition p;
  p.job = options_.job;
  p.epoch = stream_->epoch();
  p.deal = stream_->deal();
  p.rank = options_.rank;
  p.world_size = options_.world_size;
  p.position = stream_->start() + read_;
  p.shard_length = stream_->shard_length();  // Opened: its first chunk said it.
  return p;
}

}  // namespace samplerd
