// Fuzz target: a request's path from the bytes a client sends to the job's checks, without a
// network: ParseRequest (raw_request.h) parses the bytes as the method's request type, then the
// request goes to an in-process JobRegistry and Job as SamplerService's handlers pass it
// (server/sampler_service.cc: every RPC of samplerd.v1.Sampler: DoCreateJob, DoGetJob, DoListJobs,
// DoDeleteJob, DoRewindJob, DoResizeJob, DoSetGroupWeights, DoEndEpoch, DoGetJobStatus,
// LossStream::Add, the StreamShard reactor up to AcquireShard, the ClaimRank reactor's
// Job::ClaimRank, and the upload streams of UploadWeights, UploadLabels and
// UploadIrreducibleLosses, client_streams.h's UploadStream itself). The service's own wrappers
// (authorisation, metrics, gRPC status conversion, ClaimRank's range check of world_size, which
// the job's check of the deal's world size covers) are not in the path: they are gRPC-bound and
// covered by the service's tests.
//
// Input: a sequence of calls, each [u8 method][u16 little-endian length][length bytes of the
// request]; method is the byte modulo 16 (the Method enum). An upload's (a client stream's)
// bytes are its messages, each [u16 little-endian length][the chunk], ended after the last one
// (none: an empty stream). Every input starts from a fresh registry holding job "j" (64 samples,
// 2 ranks, loss policy, epoch 0 planned), so that a request naming "j" reaches the job's checks;
// a CreateJob makes others (a mixture job, a REDUCIBLE_LOSS one: the seeds do). Method 10 is not
// an RPC: it reports the losses of positions the fuzzer asks for as rank of job "j" was really
// served them (the only way random bytes reach the job's paths that accept losses and end
// epochs); its bytes are [u8 rank][u8 first position][u8 count]. A rank claimed with ClaimRank
// stays claimed until the input ends.
//
// Checks, beyond "no crash, no sanitizer report, no deadlock": a refused request leaves every
// job's observable state (Describe, Status) unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
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
#include "proto/status_util.h"
#include "server/auth/authorizer.h"
#include "server/client_streams.h"
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
  kListJobs,
  kUploadLabels,
  kClaimRank,
  kUploadIrreducibleLosses,
  kSetGroupWeights,
  kMethodCount,  // 16: a method byte's value modulo 16 (the seeds' bytes are the enum's).
};
static_assert(kMethodCount == 16);

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

// The registry's jobs, by name.
std::vector<std::shared_ptr<Job>> Jobs(JobRegistry& registry) {
  std::vector<std::shared_ptr<Job>> jobs = registry.List();
  std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) {
    return a->Describe().name() < b->Describe().name();
  });
  return jobs;
}

// The jobs' observable state, to check that a refused call changed nothing.
std::string Observable(JobRegistry& registry) {
  std::string out;
  for (const std::shared_ptr<Job>& job : Jobs(registry)) {
    v1::JobStatus status = job->Status();
    // Durations and times move on their own: the counts and the ranks' progress only.
    status.clear_last_recompute_ms();
    status.clear_last_plan_ms();
    status.clear_weights();
    absl::StrAppend(&out, job->Describe().SerializeAsString(), "|", status.samples_seen(), "|",
                    status.job().SerializeAsString(), "|", status.ranks_size(), "|",
                    status.mixture().SerializeAsString(), "\n");
  }
  return out;
}

// Waits (up to 2 s each) for the plans being made in the background (the last EndEpoch of an
// epoch starts the next one's), so that Observable does not change on its own during a call. A
// job awaiting an upload is not planning: it is left as it is.
void Settle(JobRegistry& registry) {
  for (const std::shared_ptr<Job>& job : Jobs(registry)) {
    const v1::JobStatus status = job->Status();
    if (!status.planning()) continue;
    const v1::Job& d = status.job();
    // As an observer: a claim held on rank 0 would be refused at once, planning or not.
    (void)testutil::AwaitShard(*job, d.current_epoch(), d.deal(), 0, d.world_size(),
                               absl::Now() + absl::Seconds(2),
                               ShardCaller{/*incarnation=*/0, /*observe=*/true});
  }
}

// One client-streaming call through the service's own stream (client_streams.h): `bytes` holds
// its messages, each [u16 little-endian length][message]; then the end of the stream.
template <typename S>
absl::Status RunStream(S stream, absl::string_view bytes) {
  while (bytes.size() >= 2) {
    const size_t length = static_cast<uint8_t>(bytes[0]) | (static_cast<uint8_t>(bytes[1]) << 8);
    bytes.remove_prefix(2);
    const absl::string_view message = bytes.substr(0, length);
    bytes.remove_prefix(message.size());
    if (std::optional<grpc::Status> ended = stream.Add(Raw(message)); ended.has_value()) {
      return FromGrpcStatus(*ended);
    }
  }
  return FromGrpcStatus(stream.End());
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
      v1::UploadSummary summary;
      return RunStream(MakeWeightsUpload(&registry, Caller::Unrestricted(), &summary), bytes);
    }
    case kUploadLabels: {
      v1::UploadSummary summary;
      return RunStream(MakeLabelsUpload(&registry, Caller::Unrestricted(), &summary), bytes);
    }
    case kUploadIrreducibleLosses: {
      v1::UploadSummary summary;
      return RunStream(MakeIrreducibleLossesUpload(&registry, Caller::Unrestricted(), &summary),
                       bytes);
    }
    case kListJobs: {
      v1::ListJobsRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      for (const std::shared_ptr<Job>& job : registry.List()) (void)job->Describe();
      return absl::OkStatus();
    }
    case kClaimRank: {
      v1::ClaimRankRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.job());
      if (!job.ok()) return job.status();
      // Held until the input ends (CloseAll ends it: `ended` has nothing to do then).
      return (*job)
          ->ClaimRank(
              r.rank(), r.world_size(), r.peer(), [](const absl::Status&) {}, r.replaces())
          .status();
    }
    case kSetGroupWeights: {
      v1::SetGroupWeightsRequest r;
      if (!Parse(bytes, &r)) return absl::InvalidArgumentError("parse");
      auto job = get(r.job());
      if (!job.ok()) return job.status();
      absl::StatusOr<v1::Job> set = (*job)->SetGroupWeights(
          std::vector<double>(r.group_weights().begin(), r.group_weights().end()));
      if (!set.ok()) return set.status();
      if (absl::Status s = (*job)->Sync(); !s.ok()) return s;
      (void)(*job)->RewindableEpochs();
      return absl::OkStatus();
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
  // A client stream's call: its messages, each framed.
  auto upload = [](uint8_t method, const std::vector<const google::protobuf::Message*>& chunks) {
    std::string bytes;
    for (const google::protobuf::Message* chunk : chunks) {
      const std::string c = chunk->SerializeAsString();
      bytes.push_back(static_cast<char>(c.size() & 0xff));
      bytes.push_back(static_cast<char>(c.size() >> 8));
      bytes += c;
    }
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
      call(kReportLosses, batch) + upload(kUploadWeights, {&weights}) + call(kDeleteJob, del));

  // ListJobs and ClaimRank: a claim taken, one refused (rank outside the world), one of another
  // world size, a replacement of the first; then rank 1 served without the claim's incarnation.
  v1::ListJobsRequest list;
  v1::ClaimRankRequest claim, outside, other_world, replace;
  claim.set_job("j");
  claim.set_rank(1);
  claim.set_world_size(2);
  outside = claim;
  outside.set_rank(2);
  other_world = claim;
  other_world.set_world_size(3);
  replace = claim;
  replace.set_replaces(1);
  fuzz::WriteSeed("list_claim", call(kListJobs, list) + call(kClaimRank, claim) +
                                    call(kClaimRank, outside) + call(kClaimRank, other_world) +
                                    call(kClaimRank, replace) + served(1, 0, 4) +
                                    call(kListJobs, list));

  // SetGroupWeights on a mixture job "m" (static weights): set, then refused (a negative weight,
  // the wrong count, all zero), on job "j" (not a mixture job), and after an epoch of "m" ended.
  v1::CreateJobRequest mixture;
  mixture.set_name("m");
  mixture.mutable_spec()->set_world_size(1);
  mixture.mutable_spec()->set_seed(5);
  mixture.mutable_spec()->set_samples_per_epoch(8);
  for (uint64_t n : {5, 3, 20}) mixture.mutable_spec()->mutable_mixture()->add_group_sizes(n);
  for (double w : {2.0, 1.0, 1.0}) mixture.mutable_spec()->mutable_mixture()->add_group_weights(w);
  v1::SetGroupWeightsRequest set, negative, short_count, zeros, not_mixture;
  set.set_job("m");
  for (double w : {1.0, 2.0, 3.0}) set.add_group_weights(w);
  negative.set_job("m");
  for (double w : {1.0, -1.0, 3.0}) negative.add_group_weights(w);
  short_count.set_job("m");
  for (double w : {1.0, 2.0}) short_count.add_group_weights(w);
  zeros.set_job("m");
  for (int k = 0; k < 3; ++k) zeros.add_group_weights(0.0);
  not_mixture = set;
  not_mixture.set_job("j");
  v1::EndEpochRequest end_m;
  end_m.set_job("m");
  v1::GetJobStatusRequest status_m;
  status_m.set_name("m");
  fuzz::WriteSeed("mixture_group_weights",
                  call(kCreateJob, mixture) + call(kSetGroupWeights, set) +
                      call(kSetGroupWeights, negative) + call(kSetGroupWeights, short_count) +
                      call(kSetGroupWeights, zeros) + call(kSetGroupWeights, not_mixture) +
                      call(kEndEpoch, end_m) + call(kSetGroupWeights, set) +
                      call(kGetJobStatus, status_m));

  // UploadLabels to a CLASS_BALANCED job "c": two chunks; then refused: a gap between chunks,
  // too many labels, chunks naming two jobs, an empty stream, and job "j" (a UNIFORM base).
  v1::CreateJobRequest balanced = create;
  balanced.set_name("c");
  balanced.mutable_spec()->mutable_policy()->set_base(v1::CLASS_BALANCED);
  v1::UploadLabelsChunk labels0, labels1, gap, too_many, other_job, labels_j;
  labels0.set_job("c");
  for (uint32_t i = 0; i < 32; ++i) labels0.add_labels(i % 3);
  labels1 = labels0;
  labels1.set_offset(32);
  gap = labels0;
  gap.set_offset(40);
  too_many = labels0;
  for (uint32_t i = 0; i < 40; ++i) too_many.add_labels(i);
  other_job = labels1;
  other_job.set_job("j");
  labels_j = labels0;
  labels_j.set_job("j");
  for (uint32_t i = 0; i < 32; ++i) labels_j.add_labels(1);
  fuzz::WriteSeed("labels_upload",
                  call(kCreateJob, balanced) + upload(kUploadLabels, {&labels0, &labels1}) +
                      upload(kUploadLabels, {&labels0, &gap}) +
                      upload(kUploadLabels, {&too_many, &labels1}) +
                      upload(kUploadLabels, {&labels0, &other_job}) + upload(kUploadLabels, {}) +
                      upload(kUploadLabels, {&labels_j}));

  // UploadIrreducibleLosses to a REDUCIBLE_LOSS job "r": two chunks; then refused: a negative
  // loss, a NaN, too few losses, job "j" (policy LOSS); then "r" served (a shard) and its
  // losses uploaded again after it started.
  v1::CreateJobRequest reducible = create;
  reducible.set_name("r");
  reducible.mutable_spec()->mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
  v1::UploadIrreducibleLossesChunk losses0, losses1, negative_loss, nan_loss, losses_j;
  losses0.set_job("r");
  for (int i = 0; i < 32; ++i) losses0.add_losses(0.125f * static_cast<float>(i % 5));
  losses1 = losses0;
  losses1.set_offset(32);
  negative_loss = losses1;
  negative_loss.set_losses(3, -0.5f);
  nan_loss = losses1;
  nan_loss.set_losses(7, std::numeric_limits<float>::quiet_NaN());
  losses_j = losses0;
  losses_j.set_job("j");
  v1::UploadIrreducibleLossesChunk losses_j1 = losses1;
  losses_j1.set_job("j");
  v1::StreamShardRequest stream_r;
  stream_r.set_job("r");
  stream_r.set_world_size(2);
  fuzz::WriteSeed(
      "irreducible_losses_upload",
      call(kCreateJob, reducible) + upload(kUploadIrreducibleLosses, {&losses0, &losses1}) +
          upload(kUploadIrreducibleLosses, {&losses0, &negative_loss}) +
          upload(kUploadIrreducibleLosses, {&losses0, &nan_loss}) +
          upload(kUploadIrreducibleLosses, {&losses0}) +
          upload(kUploadIrreducibleLosses, {&losses_j, &losses_j1}) + call(kStreamShard, stream_r) +
          upload(kUploadIrreducibleLosses, {&losses0, &losses1}));
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
