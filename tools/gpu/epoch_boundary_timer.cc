#include "tools/gpu/epoch_boundary_timer.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/gpu/synthetic_inputs.h"

namespace samplerd {
namespace gpu_e2e {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The first `count` positions of a rank's shard (fewer if the shard is shorter). The stream is
// stopped once they have arrived; *first_chunk is set when the first chunk arrives.
absl::StatusOr<std::vector<uint64_t>> ReadPrefix(SamplerClient& client, const std::string& job,
                                                 uint64_t epoch, uint32_t rank, uint32_t world,
                                                 uint64_t count,
                                                 std::optional<Clock::time_point>* first_chunk) {
  // A status only this function makes: the callback's way to stop the stream early.
  const absl::Status enough = absl::CancelledError("epoch_boundary_timer: prefix complete");
  std::vector<uint64_t> prefix;
  StreamShardOptions options;
  options.max_chunk_size = static_cast<uint32_t>(
      std::min<uint64_t>(count, static_cast<uint64_t>(v1::DEFAULT_SHARD_CHUNK_SIZE)));
  absl::Status s =
      client.StreamShard(job, epoch, rank, world, options, [&](const ShardSlice& slice) {
        if (first_chunk != nullptr && !first_chunk->has_value()) *first_chunk = Clock::now();
        const size_t take =
            static_cast<size_t>(std::min<uint64_t>(slice.indices.size(), count - prefix.size()));
        prefix.insert(prefix.end(), slice.indices.begin(), slice.indices.begin() + take);
        return prefix.size() == count ? enough : absl::OkStatus();
      });
  if (!s.ok() && s != enough) return s;
  return prefix;
}

absl::Status ReportPrefix(SamplerClient& client, const std::string& job, uint64_t epoch,
                          uint32_t rank, const std::vector<uint64_t>& prefix) {
  constexpr size_t kPairsPerBatch = 65536;
  std::vector<v1::LossBatch> batches;
  for (size_t begin = 0; begin < prefix.size(); begin += kPairsPerBatch) {
    const size_t end = std::min(prefix.size(), begin + kPairsPerBatch);
    v1::LossBatch& batch = batches.emplace_back();
    batch.set_job(job);
    batch.set_epoch(epoch);
    batch.set_rank(rank);
    batch.set_seq(batches.size() - 1);
    batch.set_first_position(begin);
    for (size_t p = begin; p < end; ++p) {
      batch.add_indices(prefix[p]);
      batch.add_losses(SyntheticLoss(0xb0da, epoch, prefix[p]));
    }
  }
  if (batches.empty()) return absl::OkStatus();
  return client.ReportLosses(batches).status();
}

absl::Status Run(SamplerClient& client, const BoundaryOptions& options, BoundaryTiming* timing) {
  const std::string& job = options.job;
  const uint32_t world = options.world_size;
  auto where = [&](uint64_t epoch, const char* call) {
    return absl::StrCat("job ", job, " epoch ", epoch, ": ", call);
  };
  auto annotated = [](const absl::Status& s, const std::string& w) {
    return absl::Status(s.code(), absl::StrCat(w, ": ", s.message()));
  };
  std::vector<std::vector<uint64_t>> prefixes(world);
  // Every rank's prefix of `epoch`, from rank `first` on.
  auto read = [&](uint64_t epoch, uint32_t first) -> absl::Status {
    for (uint32_t r = first; r < world; ++r) {
      absl::StatusOr<std::vector<uint64_t>> prefix =
          ReadPrefix(client, job, epoch, r, world, options.losses_per_rank, nullptr);
      if (!prefix.ok()) return annotated(prefix.status(), where(epoch, "StreamShard"));
      prefixes[r] = *std::move(prefix);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read(0, 0); !s.ok()) return s;
  for (uint64_t epoch = 0; epoch < static_cast<uint64_t>(options.boundaries); ++epoch) {
    for (uint32_t r = 0; r < world; ++r) {
      if (absl::Status s = ReportPrefix(client, job, epoch, r, prefixes[r]); !s.ok()) {
        return annotated(s, where(epoch, "ReportLosses"));
      }
    }
    Clock::time_point ended;
    for (uint32_t r = 0; r < world; ++r) {
      absl::StatusOr<v1::EndEpochResponse> end = client.EndEpoch(job, epoch, r);
      ended = Clock::now();
      if (!end.ok()) return annotated(end.status(), where(epoch, "EndEpoch"));
      if (end->epoch_closed() != (r + 1 == world)) {
        return absl::InternalError(absl::StrCat(where(epoch, "EndEpoch"), " of rank ", r,
                                                ": epoch_closed = ", end->epoch_closed()));
      }
    }
    // The boundary: from the last EndEpoch's return to the next epoch's first chunk at rank 0
    // (its stream waits while the server recomputes and plans).
    std::optional<Clock::time_point> first_chunk;
    absl::StatusOr<std::vector<uint64_t>> prefix =
        ReadPrefix(client, job, epoch + 1, 0, world, options.losses_per_rank, &first_chunk);
    if (!prefix.ok()) return annotated(prefix.status(), where(epoch + 1, "StreamShard"));
    if (!first_chunk.has_value()) {
      return absl::InternalError(
          absl::StrCat(where(epoch + 1, "StreamShard"), " of rank 0: the shard is empty"));
    }
    timing->boundary_ms.push_back(MsSince(ended, *first_chunk));
    prefixes[0] = *std::move(prefix);
    if (absl::Status s = read(epoch + 1, 1); !s.ok()) return s;
    absl::StatusOr<v1::JobStatus> status = client.GetJobStatus(job);
    if (!status.ok()) return annotated(status.status(), where(epoch + 1, "GetJobStatus"));
    timing->backend = status->backend();
    timing->recompute_ms.push_back(status->last_recompute_ms());
    timing->plan_ms.push_back(status->last_plan_ms());
  }
  return absl::OkStatus();
}

}  // namespace

double BoundaryTiming::median_ms() const { return Median(boundary_ms); }

absl::StatusOr<BoundaryTiming> TimeEpochBoundaries(SamplerClient& client,
                                                   const BoundaryOptions& options) {
  if (options.num_samples < 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples = ", options.num_samples, " must be >= 10"));
  }
  const uint64_t m =
      options.samples_per_epoch == 0 ? options.num_samples / 10 : options.samples_per_epoch;
  if (m > options.num_samples) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples_per_epoch = ", m, " must be <= num_samples = ", options.num_samples));
  }
  if (options.world_size < 1) return absl::InvalidArgumentError("world_size = 0 must be >= 1");
  if (options.boundaries < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundaries = ", options.boundaries, " must be >= 1"));
  }
  if (options.losses_per_rank < 1) {
    return absl::InvalidArgumentError("losses_per_rank = 0 must be >= 1");
  }
  v1::JobSpec spec;
  spec.set_num_samples(options.num_samples);
  spec.set_samples_per_epoch(m);
  spec.set_world_size(options.world_size);
  spec.set_seed(0xb0da);
  spec.set_order(v1::WEIGHTED_RANDOM);
  spec.mutable_policy()->set_base(v1::UNIFORM);
  spec.mutable_policy()->set_loss(v1::LOSS);
  BoundaryTiming timing;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::Job> created = client.CreateJob(options.job, spec);
  if (!created.ok()) {
    return absl::Status(
        created.status().code(),
        absl::StrCat("job ", options.job, ": CreateJob: ", created.status().message()));
  }
  if (created->current_epoch() != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("job ", options.job, " exists already at epoch ", created->current_epoch()));
  }
  timing.create_ms = MsSince(start, Clock::now());
  absl::Status run = Run(client, options, &timing);
  absl::Status deleted = client.DeleteJob(options.job);
  if (!run.ok()) return run;
  if (!deleted.ok()) return deleted;
  return timing;
}

std::string FormatBoundaryTiming(const BoundaryOptions& options, const BoundaryTiming& timing) {
  const uint64_t m =
      options.samples_per_epoch == 0 ? options.num_samples / 10 : options.samples_per_epoch;
  auto minmax = std::minmax_element(timing.boundary_ms.begin(), timing.boundary_ms.end());
  const bool any = !timing.boundary_ms.empty();
  return absl::StrFormat(
      "BOUNDARY backend=%s n=%d m=%d world=%d boundaries=%d median_ms=%.1f min_ms=%.1f "
      "max_ms=%.1f recompute_ms=%.1f plan_ms=%.1f create_ms=%.1f",
      timing.backend.empty() ? "?" : timing.backend, options.num_samples, m, options.world_size,
      timing.boundary_ms.size(), timing.median_ms(), any ? *minmax.first : 0.0,
      any ? *minmax.second : 0.0, Median(timing.recompute_ms), Median(timing.plan_ms),
      timing.create_ms);
}

}  // namespace gpu_e2e
}  // namespace samplerd
