// Fuzz target: a request's path from the bytes a client sends to the job's checks, without a
// network: ParseRequest (raw_request.h) parses the bytes as the method's request type, then the
// request goes to an in-process JobRegistry and Job as SamplerService's handlers pass it
// (server/sampler_service.cc: DoCreateJob, DoGetJob, DoRewindJob, DoResizeJob, DoEndEpoch,
// DoDeleteJob, DoGetJobStatus, LossStream::Add, the StreamShard reactor up to AcquireShard, and an
// upload of one chunk). The service's own wrappers (authorisation, metrics, gRPC status conversion)
// are not in the path: they are gRPC-bound and covered by the service's tests.
//
// Input: a sequence of calls, each [u8 method][u16 little-endian length][length bytes of the
// request]. Every input starts from a fresh registry holding job "j" (64 samples, 2 ranks, loss
// policy, epoch 0 planned), so that a request naming "j" reaches the job's checks. Method 10 is
// not an RPC: it reports the losses of positions the fuzzer asks for as the rank was really
// served them (the only way random bytes reach the job's paths that accept losses and end
// epochs); its bytes are [u8 rank][u8 first position][u8 count].
//
// Checks, beyond "no crash, no sanitizer report, no deadlock": a refused request leaves the job's
// observable state (Describe, Status) unchanged.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "kernels/compute_backend.h"
#include "kernels/cpu_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/loss_batch.h"
#include "server/raw_request.h"
#include "server/testing/job_shards.h"

namespace samplerd {
namespace {

enum Method : uint8_t {
  kCreateJob,
  kGetJob,
  kRewindJob,
  kResizeJob,
  kEndEpoch,
  kReportLosses,
  kStreamShard,
  kUploadWeights,
  kGetJobStatus,
  kDeleteJob,
  kReportServed,  // Not an RPC: see the file comment.
  kMethodCount,
};

ComputeBackend& Backend() {
  static ComputeBackend* backend = NewCpuBackend(1).release();
  return *backend;
}

v1::JobSpec BaseSpec() {
  v1::JobSpec spec;
  spec.set_num_samples(64);
  spec.set_world_size(2);
  spec.set_seed(7);
  spec.mutable_policy()->set_base(v1::UNIFORM);
  spec.mutable_policy()->set_loss(v1::LOSS);
  return spec;
}

JobRegistry::Limits FuzzLimits() {
  JobRegistry::Limits limits;
  limits.max_jobs = 4;
  limits.job.max_samples_per_job = 4096;  // Keeps a fuzzed spec's job small.
  limits.max_memory_bytes = uint64_t{256} << 20;
  return limits;
}

grpc::ByteBuffer Raw(absl::string_view bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

template <typename Request>
bool Parse(absl::string_view bytes, Request* request) {
  return ParseRequest(Raw(bytes), request).ok();
}

// The job's observable state, to check that a refused call changed nothing.
std::string Observable(JobRegistry& registry) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry.Get("j");
  if (!job.ok()) return "no job";
  v1::JobStatus status = (*job)->Status();
  // Durations and times move on their own: the counts and the ranks' progress only.
  status.clear_last_recompute_ms();
  status.clear_last_plan_ms();
  status.clear_weights();
  return (*job)->Describe().SerializeAsString() + "|" + absl::StrCat(status.samples_seen()) + "|" +
         status.job().SerializeAsString() + "|" + absl::StrCat(status.ranks_size());
}

// Waits (up to 2 s) for a plan being made in the background (the last EndEpoch of an epoch
// starts the next one's), so that Observable does not change on its own during a call.
void Settle(JobRegistry& registry) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry.Get("j");
  if (!job.ok()) return;
  const v1::Job d = (*job)->Describe();
  if (d.plan_ready()) return;
  if (d.current_epoch() == 0 && d.spec().policy().base() != v1::UNIFORM) return;  // An upload.
  (void)testutil::AwaitShard(**job, d.current_epoch(), d.deal(), 0, d.world_size(),
                             absl::Now() + absl::Seconds(2));
}

// One call; returns its status (OK for a call that cannot fail).
absl::Status Call(JobRegistry& registry, uint8_t method, absl::string_view bytes) {
  const absl::Time now = absl::Now();  // Nothing waits: a wait is DEADLINE_EXCEEDED at once.
  auto get = [&](const std::string& name) { return registry.Get(name); };
  switch (method % kMethodCount) {
    case kCreateJob: {
      v1::CreateJobRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      return registry.Create(r.name(), r.spec(), now, r.resume()).status();
    }
    case kGetJob: {
      v1::GetJobRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.name());
      if (!job.ok()) return job.status();
      if (!r.has_rank()) {
        (void)(*job)->Describe();
        return absl::OkStatus();
      }
      return (*job)
          ->DescribeForRank(r.rank(),
                            r.has_epoch() ? std::optional<uint64_t>(r.epoch()) : std::nullopt)
          .status();
    }
    case kRewindJob: {
      v1::RewindJobRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.name());
      return job.ok() ? (*job)->Rewind(r.epoch()) : job.status();
    }
    case kResizeJob: {
      v1::ResizeJobRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.name());
      return job.ok() ? (*job)->Resize(r.epoch(), r.world_size()).status() : job.status();
    }
    case kEndEpoch: {
      v1::EndEpochRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.job());
      if (!job.ok()) return job.status();
      return (*job)->EndEpoch(r.epoch(), r.deal(), r.rank(), r.incarnation()).status();
    }
    case kReportLosses: {
      v1::LossBatch b;
      if (!Parse(bytes, &b)) return absl::InvalidArgumentError("parse");
      auto job = get(b.job());
      if (!job.ok()) return job.status();
      v1::LossReportSummary summary;
      return (*job)->ReportLosses(ViewOf(b), &summary);  // The claim is checked by the job.
    }
    case kStreamShard: {
      v1::StreamShardRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.job());
      if (!job.ok()) return job.status();
      absl::StatusOr<ShardLease> lease = (*job)->AcquireShard(
          r.epoch(), r.deal(), r.rank(), r.world_size(), ShardCaller{r.incarnation(), r.observe()});
      if (!lease.ok()) return lease.status();
      // What ShardChunks does next: the positions from start_offset, recorded as streamed.
      if (r.start_offset() >= lease->shard_length) return absl::OkStatus();
      std::vector<uint64_t> out(std::min<uint64_t>(lease->shard_length - r.start_offset(), 16));
      if (absl::Status s = Backend().ExtractShard(*lease->view.plan, lease->shard, r.rank(),
                                                  r.start_offset(), absl::MakeSpan(out));
          !s.ok()) {
        return s;
      }
      return (*job)->RecordStreamed(r.epoch(), r.deal(), r.rank(), r.start_offset() + out.size());
    }
    case kUploadWeights: {
      v1::UploadWeightsChunk c;
      if (!Parse(bytes, &c)) return absl::InvalidArgumentError("parse");
      auto job = get(c.job());
      if (!job.ok()) return job.status();
      return (*job)->UploadWeights(std::vector<float>(c.weights().begin(), c.weights().end()));
    }
    case kGetJobStatus: {
      v1::GetJobStatusRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.name());
      if (job.ok()) (void)(*job)->Status();
      return job.status();
    }
    case kDeleteJob: {
      v1::DeleteJobRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      return registry.Delete(r.name());
    }
    case kReportServed: {
      if (bytes.size() < 3) return absl::InvalidArgumentError("short");
      auto job = get("j");
      if (!job.ok()) return job.status();
      const v1::Job described = (*job)->Describe();
      const uint32_t rank = static_cast<uint8_t>(bytes[0]) % std::max(1u, described.world_size());
      absl::StatusOr<ShardLease> lease = (*job)->AcquireShard(
          described.current_epoch(), described.deal(), rank, described.world_size());
      if (!lease.ok()) return lease.status();
      const uint64_t first = static_cast<uint8_t>(bytes[1]);
      const uint64_t count = 1 + static_cast<uint8_t>(bytes[2]) % 16;
      if (first + count > lease->shard_length) return absl::OutOfRangeError("past the shard");
      std::vector<uint64_t> indices(count), positions(count);
      std::vector<float> losses(count);
      if (absl::Status s = Backend().ExtractShard(*lease->view.plan, lease->shard, rank, first,
                                                  absl::MakeSpan(indices));
          !s.ok()) {
        return s;
      }
      for (uint64_t k = 0; k < count; ++k) {
        positions[k] = first + k;
        losses[k] = 0.25f * static_cast<float>(k + bytes[2] % 7);
      }
      if (absl::Status s = (*job)->RecordStreamed(described.current_epoch(), described.deal(), rank,
                                                  first + count);
          !s.ok()) {
        return s;
      }
      LossBatchView view;
      view.epoch = described.current_epoch();
      view.rank = rank;
      view.deal = described.deal();
      view.indices = indices;
      view.losses = losses;
      view.positions = positions;
      v1::LossReportSummary summary;
      return (*job)->ReportLosses(view, &summary);
    }
  }
  return absl::OkStatus();
}

void WriteSeeds() {
  auto call = [](uint8_t method, const google::protobuf::Message& m) {
    const std::string bytes = m.SerializeAsString();
    std::string out(1, static_cast<char>(method));
    out.push_back(static_cast<char>(bytes.size() & 0xff));
    out.push_back(static_cast<char>(bytes.size() >> 8));
    return out + bytes;
  };
  auto served = [](uint8_t rank, uint8_t first, uint8_t count) {
    return std::string{
        static_cast<char>(kReportServed), 3, 0, static_cast<char>(rank), static_cast<char>(first),
        static_cast<char>(count)};
  };
  v1::CreateJobRequest create;
  create.set_name("k");
  *create.mutable_spec() = BaseSpec();
  v1::GetJobRequest get;
  get.set_name("j");
  get.set_rank(1);
  v1::EndEpochRequest end0, end1;
  end0.set_job("j");
  end1.set_job("j");
  end1.set_rank(1);
  v1::ResizeJobRequest resize;
  resize.set_name("j");
  resize.set_world_size(3);
  v1::RewindJobRequest rewind;
  rewind.set_name("j");
  v1::StreamShardRequest stream;
  stream.set_job("j");
  stream.set_world_size(2);
  stream.set_start_offset(4);
  v1::LossBatch batch;
  batch.set_job("j");
  batch.add_indices(3);
  batch.add_losses(0.5f);
  batch.add_positions(0);
  v1::UploadWeightsChunk weights;
  weights.set_job("j");
  for (int i = 0; i < 64; ++i) weights.add_weights(1.0f + i);
  v1::GetJobStatusRequest status;
  status.set_name("j");
  v1::DeleteJobRequest del;
  del.set_name("j");
  fuzz::WriteSeed("create_get", call(kCreateJob, create) + call(kGetJob, get));
  fuzz::WriteSeed("epoch_ends_then_rewind", served(0, 0, 5) + served(1, 2, 9) +
                                                call(kEndEpoch, end0) + call(kEndEpoch, end1) +
                                                call(kRewindJob, rewind) +
                                                call(kGetJobStatus, status));
  fuzz::WriteSeed("resize_stream",
                  call(kStreamShard, stream) + call(kResizeJob, resize) + served(2, 0, 3));
  fuzz::WriteSeed(
      "losses_upload_delete",
      call(kReportLosses, batch) + call(kUploadWeights, weights) + call(kDeleteJob, del));
}

}  // namespace
}  // namespace samplerd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;  // The job's INFO/WARNING lines on every refusal would drown the output.
  samplerd::fuzz::WriteSeedsIfAsked(&samplerd::WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT: a fuzz target's entry point.
  JobRegistry registry(FuzzLimits(), &Backend());
  absl::StatusOr<std::shared_ptr<Job>> job = registry.Create("j", BaseSpec());
  SAMPLERD_FUZZ_CHECK(job.ok(), job.status().ToString());
  job->reset();
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  for (int calls = 0; in.size() >= 3 && calls < 16; ++calls) {
    const uint8_t method = static_cast<uint8_t>(in[0]);
    const size_t length = static_cast<uint8_t>(in[1]) | (static_cast<uint8_t>(in[2]) << 8);
    in.remove_prefix(3);
    const absl::string_view bytes = in.substr(0, length);
    in.remove_prefix(bytes.size());
    Settle(registry);
    const std::string before = Observable(registry);
    const absl::Status status = Call(registry, method, bytes);
    // A refusal changes nothing (DEADLINE_EXCEEDED and planning failures aside: a wait that
    // ended, or a Failed job, are states of their own).
    if (absl::IsInvalidArgument(status) || absl::IsNotFound(status) || absl::IsOutOfRange(status)) {
      SAMPLERD_FUZZ_CHECK(Observable(registry) == before,
                          absl::StrCat("method ", method % kMethodCount, ": ", status.ToString()));
    }
  }
  registry.CloseAll();
  return 0;
}
