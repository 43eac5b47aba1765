// Fuzz target: a server's recovery of its jobs from --data_dir (JobRegistry::Recover: the
// journal's Recover, the snapshot's spec, Job::Restore and the replay of the logs through the
// job's own methods) on arbitrary job directories, the files a crash or a damaged disk leaves.
//
// Input: the files of one job directory <data_dir>/jobs/j/, each [u8 file][u32 little-endian
// length][length bytes]; file's low 3 bits name snapshot-0.bin, snapshot-1.bin, snapshot-2.bin,
// wal-0.log, wal-1.log, wal-2.log, rewind-1, rewind-2, its high 5 bits are checksum flags
// (server/persistence/fuzz_checksums.h: the checksums recomputed before recovery reads the
// file, so that mutations reach past them). The seeds are real directories: a job made
// with JobRegistry, served, reported to, its epochs ended and rewound, copied at several points;
// mixture jobs (static weights, changed by SetGroupWeights; online EXCESS_LOSS weights) and a
// REDUCIBLE_LOSS job with its irreducible losses uploaded.
//
// Checks, beyond "no crash, no sanitizer report, no deadlock": recovery either fails with
// DATA_LOSS, FAILED_PRECONDITION or NOT_FOUND (the codes JobRegistry::Recover and JobJournal::
// Recover document), or gives a job that answers Describe and Status; and a recovered directory
// recovers again, to the same epoch.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "kernels/compute_backend.h"
#include "kernels/cpu_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/loss_batch.h"
#include "server/persistence/fuzz_checksums.h"
#include "server/testing/job_shards.h"

namespace samplerd {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFiles[] = {"snapshot-0.bin", "snapshot-1.bin", "snapshot-2.bin", "wal-0.log",
                                  "wal-1.log",      "wal-2.log",      "rewind-1",       "rewind-2"};

ComputeBackend& Backend() {
  static ComputeBackend* backend = NewCpuBackend(1).release();
  return *backend;
}

JobRegistry::Limits FuzzLimits() {
  JobRegistry::Limits limits;
  limits.job.max_samples_per_job = 4096;  // A fuzzed spec cannot make a large job.
  limits.max_memory_bytes = uint64_t{256} << 20;
  return limits;
}

std::string DataDir() { return fuzz::ScratchDir() + "/data"; }
std::string JobDir() { return DataDir() + "/jobs/j"; }

// The job directory as a fuzz input.
std::string Pack() {
  std::string out;
  for (uint8_t i = 0; i < 8; ++i) {
    const std::string path = JobDir() + "/" + kFiles[i];
    if (!fs::exists(path)) continue;
    const std::string bytes = fuzz::ReadFile(path);
    const uint8_t fix = i < 3   ? fuzz::kFixSnapshot
                        : i < 6 ? fuzz::kFixHeadBlocks | fuzz::kFixRecords
                                : 0;
    out.push_back(static_cast<char>(i | (fix << 3)));
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((bytes.size() >> (8 * b)) & 0xff));
    out += bytes;
  }
  return out;
}

void Unpack(absl::string_view in) {
  fs::remove_all(DataDir());
  fs::create_directories(JobDir());
  while (in.size() >= 5) {
    const uint8_t file = static_cast<uint8_t>(in[0]) & 7;
    const uint8_t fix = static_cast<uint8_t>(in[0]) >> 3;
    uint32_t length = 0;
    for (int b = 0; b < 4; ++b) length |= uint32_t{static_cast<uint8_t>(in[1 + b])} << (8 * b);
    in.remove_prefix(5);
    const absl::string_view bytes = in.substr(0, length);
    in.remove_prefix(bytes.size());
    std::string contents(bytes);
    fuzz::FixChecksums(fix, contents);
    fuzz::WriteFile(JobDir() + "/" + kFiles[file], contents);
  }
}

// Reports the losses of positions [first, first + count) of `rank`'s shard of the current epoch.
void ReportServed(Job& job, uint32_t rank, uint64_t first, uint64_t count) {
  const v1::Job d = job.Describe();
  absl::StatusOr<ShardLease> lease = testutil::AwaitShard(
      job, d.current_epoch(), d.deal(), rank, d.world_size(), absl::Now() + absl::Seconds(30));
  SAMPLERD_FUZZ_CHECK(lease.ok(), lease.status().ToString());
  std::vector<uint64_t> indices(count), positions(count);
  std::vector<float> losses(count, 0.75f);
  SAMPLERD_FUZZ_CHECK(
      Backend()
          .ExtractShard(*lease->view.plan, lease->shard, rank, first, absl::MakeSpan(indices))
          .ok(),
      "extract");
  for (uint64_t k = 0; k < count; ++k) positions[k] = first + k;
  SAMPLERD_FUZZ_CHECK(job.RecordStreamed(d.current_epoch(), d.deal(), rank, first + count).ok(),
                      "streamed");
  LossBatchView view;
  view.epoch = d.current_epoch();
  view.rank = rank;
  view.deal = d.deal();
  view.indices = indices;
  view.losses = losses;
  view.positions = positions;
  v1::LossReportSummary summary;
  absl::Status s = job.ReportLosses(view, &summary);
  SAMPLERD_FUZZ_CHECK(s.ok(), s.ToString());
  SAMPLERD_FUZZ_CHECK(job.Sync().ok(), "sync");
}

void EndEpoch(Job& job) {
  const v1::Job d = job.Describe();
  for (uint32_t rank = 0; rank < d.world_size(); ++rank) {
    auto ended = job.EndEpoch(d.current_epoch(), d.deal(), rank);
    SAMPLERD_FUZZ_CHECK(ended.ok(), ended.status().ToString());
  }
  // The next epoch is planned in the background: wait until it is served.
  (void)testutil::AwaitShard(job, d.current_epoch() + 1, 0, 0, d.world_size(),
                             absl::Now() + absl::Seconds(30));
}

// `*registry` replaced by a registry on an empty data directory (the previous one, if any,
// destroyed first).
void FreshRegistry(std::unique_ptr<JobRegistry>* registry) {
  registry->reset();
  fs::remove_all(DataDir());
  *registry = std::make_unique<JobRegistry>(FuzzLimits(), &Backend(), DataDir());
  SAMPLERD_FUZZ_CHECK((*registry)->Recover().ok(), "recover");
}

// Job "j" of `spec`, created in `registry` (which holds it).
Job& CreateJob(JobRegistry& registry, const v1::JobSpec& spec) {
  absl::StatusOr<std::shared_ptr<Job>> created = registry.Create("j", spec);
  SAMPLERD_FUZZ_CHECK(created.ok(), created.status().ToString());
  return **created;
}

void WriteSeeds() {
  std::unique_ptr<JobRegistry> registry;
  FreshRegistry(&registry);
  v1::JobSpec spec;
  spec.set_num_samples(32);
  spec.set_world_size(2);
  spec.set_seed(3);
  spec.mutable_policy()->set_base(v1::UNIFORM);
  spec.mutable_policy()->set_loss(v1::LOSS);
  Job& job = CreateJob(*registry, spec);
  fuzz::WriteSeed("created", Pack());
  ReportServed(job, 0, 0, 4);
  ReportServed(job, 1, 2, 5);
  fuzz::WriteSeed("losses_in_epoch_0", Pack());
  EndEpoch(job);
  ReportServed(job, 1, 0, 3);
  fuzz::WriteSeed("epoch_1_opened", Pack());
  auto resized = job.Resize(1, 3);
  SAMPLERD_FUZZ_CHECK(resized.ok(), resized.status().ToString());
  ReportServed(job, 2, 0, 2);
  fuzz::WriteSeed("resized_in_epoch_1", Pack());
  EndEpoch(job);
  fuzz::WriteSeed("epoch_2_opened", Pack());
  SAMPLERD_FUZZ_CHECK(job.Rewind(1).ok(), "rewind");
  fuzz::WriteSeed("rewound_to_1", Pack());
  registry->CloseAll();

  // A mixture job: its snapshots hold the groups' state (state.proto MixtureState), restored
  // with the epoch it must be of.
  FreshRegistry(&registry);
  v1::JobSpec mixture;
  mixture.set_world_size(2);
  mixture.set_seed(5);
  mixture.set_samples_per_epoch(8);
  for (uint64_t n : {5, 3, 20}) mixture.mutable_mixture()->add_group_sizes(n);
  for (double w : {2.0, 1.0, 1.0}) mixture.mutable_mixture()->add_group_weights(w);
  Job& made = CreateJob(*registry, mixture);
  EndEpoch(made);
  EndEpoch(made);
  fuzz::WriteSeed("mixture_epoch_2_opened", Pack());
  registry->CloseAll();

  // The same mixture job whose weights SetGroupWeights changed in epoch 1: its log holds the
  // group_weights_set record, then the snapshot of epoch 2 the weights it planned with.
  FreshRegistry(&registry);
  Job& static_job = CreateJob(*registry, mixture);
  EndEpoch(static_job);
  auto weights_set = static_job.SetGroupWeights({1.0, 4.0, 0.5});
  SAMPLERD_FUZZ_CHECK(weights_set.ok(), weights_set.status().ToString());
  SAMPLERD_FUZZ_CHECK(static_job.Sync().ok(), "sync");
  fuzz::WriteSeed("mixture_group_weights_set", Pack());
  EndEpoch(static_job);
  fuzz::WriteSeed("mixture_group_weights_set_epoch_2_opened", Pack());
  registry->CloseAll();

  // A mixture job with online weights (EXCESS_LOSS): epoch 0's losses reported, so that the
  // snapshot of epoch 1 holds the rule's state (the groups' loss averages and weights).
  FreshRegistry(&registry);
  v1::JobSpec excess = mixture;
  excess.mutable_mixture()->set_rule(v1::EXCESS_LOSS);
  for (double l : {0.5, 0.25, 1.0}) excess.mutable_mixture()->add_reference_losses(l);
  excess.mutable_mixture()->mutable_online()->set_eta(0.5);
  Job& online_job = CreateJob(*registry, excess);
  ReportServed(online_job, 0, 0, 4);
  ReportServed(online_job, 1, 0, 4);
  fuzz::WriteSeed("mixture_online_losses_in_epoch_0", Pack());
  EndEpoch(online_job);
  ReportServed(online_job, 0, 0, 2);
  fuzz::WriteSeed("mixture_online_epoch_1_opened", Pack());
  registry->CloseAll();

  // A REDUCIBLE_LOSS job: its irreducible losses uploaded (the snapshot of epoch 0 holds them),
  // losses reported, an epoch ended.
  FreshRegistry(&registry);
  v1::JobSpec rho = spec;
  rho.mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
  Job& rho_job = CreateJob(*registry, rho);
  fuzz::WriteSeed("reducible_loss_created", Pack());
  std::vector<float> irreducible(32);
  for (size_t i = 0; i < irreducible.size(); ++i) irreducible[i] = 0.0625f * (i % 7);
  absl::Status uploaded = rho_job.UploadIrreducibleLosses(irreducible);
  SAMPLERD_FUZZ_CHECK(uploaded.ok(), uploaded.ToString());
  SAMPLERD_FUZZ_CHECK(rho_job.Sync().ok(), "sync");
  fuzz::WriteSeed("reducible_loss_uploaded", Pack());
  ReportServed(rho_job, 0, 0, 4);
  ReportServed(rho_job, 1, 3, 5);
  EndEpoch(rho_job);
  ReportServed(rho_job, 1, 0, 2);
  fuzz::WriteSeed("reducible_loss_epoch_1_opened", Pack());
  registry->CloseAll();
}

}  // namespace
}  // namespace samplerd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;  // Recovery logs every file it skips or removes.
  samplerd::fuzz::WriteSeedsIfAsked(&samplerd::WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT: a fuzz target's entry point.
  Unpack(absl::string_view(reinterpret_cast<const char*>(data), size));
  uint64_t epoch = 0;
  {
    JobRegistry registry(FuzzLimits(), &Backend(), DataDir());
    const absl::Status recovered = registry.Recover();
    if (!recovered.ok()) {
      SAMPLERD_FUZZ_CHECK(absl::IsDataLoss(recovered) || absl::IsFailedPrecondition(recovered) ||
                              absl::IsNotFound(recovered),
                          recovered.ToString());
      return 0;
    }
    absl::StatusOr<std::shared_ptr<Job>> job = registry.Get("j");
    if (!job.ok()) return 0;  // No snapshot: a job never acknowledged, removed.
    epoch = (*job)->Describe().current_epoch();
    (void)(*job)->Status();
    registry.CloseAll();
  }
  JobRegistry again(FuzzLimits(), &Backend(), DataDir());
  const absl::Status recovered = again.Recover();
  SAMPLERD_FUZZ_CHECK(recovered.ok(), "second recovery: " + recovered.ToString());
  absl::StatusOr<std::shared_ptr<Job>> job = again.Get("j");
  SAMPLERD_FUZZ_CHECK(job.ok(), "second recovery lost the job");
  SAMPLERD_FUZZ_CHECK((*job)->Describe().current_epoch() == epoch,
                      absl::StrCat("epoch ", (*job)->Describe().current_epoch(), " vs ", epoch));
  again.CloseAll();
  return 0;
}
