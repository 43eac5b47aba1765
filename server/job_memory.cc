#include "server/job_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/loss_policies.h"
#include "server/mixture_planner.h"
#include "server/position_set.h"

namespace samplerd {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kBytesPerRank = 64;

uint64_t AddSat(uint64_t a, uint64_t b) { return a > kMax - b ? kMax : a + b; }
uint64_t MulSat(uint64_t a, uint64_t b) { return b != 0 && a > kMax / b ? kMax : a * b; }

// "512.0 GiB", "64 B".
std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit + 1 < 6) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

// A cgroup memory limit file: a number of bytes, or "max" (no limit). kMax if absent or
// unlimited.
uint64_t ReadCgroupLimit(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return kMax;
  unsigned long long limit = 0;  // NOLINT(runtime/int): the scanf type.
  const bool numeric = std::fscanf(f, "%llu", &limit) == 1;
  std::fclose(f);
  return numeric && limit > 0 ? static_cast<uint64_t>(limit) : kMax;
}

// A mixture job: nothing per sample (see job_memory.h).
JobMemoryEstimate EstimateMixtureMemory(const JobConfig& config, const ComputeBackend& backend,
                                        bool persisted) {
  const uint64_t n = config.plan.num_samples, m = config.plan.samples_per_epoch;
  const uint64_t k = config.mixture->layout.groups();
  JobMemoryEstimate e;
  e.plans = MulSat(MulSat(2, m), Plan::Narrow(n) ? sizeof(uint32_t) : sizeof(uint64_t));
  e.weights = AddSat(config.mixture->Bytes(), MixturePlanner::kWeightHistoryBytes);
  e.scratch = MixturePlanner::ScratchBytes(backend, k, m, n);
  const uint64_t shard_length = ShardLength(m, config.shard, 0).value_or(0);
  e.ranks =
      MulSat(config.shard.world_size, AddSat(kBytesPerRank, PositionSet::BytesFor(shard_length)));
  // In memory, each kept epoch start holds its groups' state (its snapshot's encoding: ~4 words
  // of up to 10 bytes per group, the weights and an online rule's tracks ~40 more) and the
  // weight history.
  if (!persisted) {
    e.rewind =
        MulSat(config.rewind_epochs, AddSat(MulSat(k, 80), MixturePlanner::kWeightHistoryBytes));
  }
  const uint64_t rest = AddSat(AddSat(AddSat(e.weights, e.scratch), e.ranks), e.rewind);
  const bool by_m = e.plans > rest;
  e.driving_field = by_m ? "spec.samples_per_epoch" : "spec.mixture.group_sizes";
  e.driving_value = by_m ? m : k;
  return e;
}

}  // namespace

uint64_t JobMemoryEstimate::total() const {
  return AddSat(AddSat(AddSat(AddSat(AddSat(plans, weights), loss_stats), scratch), ranks), rewind);
}

std::string JobMemoryEstimate::ToString() const {
  return absl::StrCat("plans ", HumanBytes(plans), ", weights ", HumanBytes(weights),
                      ", loss statistics ", HumanBytes(loss_stats), ", planning scratch ",
                      HumanBytes(scratch), ", ranks ", HumanBytes(ranks), ", rewind ",
                      HumanBytes(rewind));
}

JobMemoryEstimate EstimateJobMemory(const JobConfig& config, const ComputeBackend& backend,
                                    bool persisted) {
  if (config.mixture != nullptr) return EstimateMixtureMemory(config, backend, persisted);
  const PlanSpec& plan = config.plan;
  const uint64_t n = plan.num_samples, m = plan.samples_per_epoch;
  const bool weighted_base = config.policy.base != BaseWeightKind::kUniform;
  const bool loss_policy = UsesLossStats(config.policy);
  JobMemoryEstimate e;
  e.plans = MulSat(MulSat(2, m), Plan::Narrow(n) ? sizeof(uint32_t) : sizeof(uint64_t));
  const uint64_t weight_vectors = (weighted_base ? 2 : 0) + (loss_policy ? 2 : 0);
  e.weights = MulSat(MulSat(weight_vectors, n), sizeof(float));
  // The policy's own per-sample inputs (REDUCIBLE_LOSS: the irreducible losses, 4 bytes).
  e.weights = AddSat(e.weights,
                     MulSat(n, DescriptorOf(config.policy.loss).extra_bytes_per_sample));
  e.loss_stats = loss_policy ? MulSat(MulSat(persisted ? 3 : 1, n), sizeof(SampleLossStats)) : 0;
  // Persisted: the closed epoch's log read back to derive the snapshot, twice its size (the file
  // and its records), about 22 bytes per reported pair; one pair per plan position.
  if (loss_policy && persisted) e.loss_stats = AddSat(e.loss_stats, MulSat(m, 44));
  e.scratch = backend.PlanScratchBytes(plan, /*weighted=*/weighted_base || loss_policy);
  // Rank 0's shard is the longest (ShardLength): a bound on every rank's PositionSet.
  const uint64_t shard_length = ShardLength(m, config.shard, 0).value_or(0);
  e.ranks =
      MulSat(config.shard.world_size, AddSat(kBytesPerRank, PositionSet::BytesFor(shard_length)));
  // Without a loss policy an epoch start is its (shared) weights only: nothing is copied.
  if (!persisted && loss_policy && config.rewind_epochs > 0) {
    const uint64_t k = config.rewind_epochs;
    e.rewind = AddSat(MulSat(MulSat(k, n), sizeof(SampleLossStats)),
                      MulSat(MulSat(k - 1, n), sizeof(float)));
  }
  const uint64_t rest =
      AddSat(AddSat(AddSat(AddSat(e.weights, e.loss_stats), e.scratch), e.ranks), e.rewind);
  // With M == N (M's default) the plans grow with N too: N is the knob a client turned.
  const bool by_m = e.plans > rest && m != n;
  e.driving_field = by_m ? "spec.samples_per_epoch" : "spec.num_samples";
  e.driving_value = by_m ? m : n;
  return e;
}

uint64_t DefaultMaxMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);    // NOLINT(runtime/int): sysconf's type.
  const long page_size = sysconf(_SC_PAGESIZE);  // NOLINT(runtime/int)
  uint64_t memory = pages > 0 && page_size > 0
                        ? MulSat(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size))
                        : kMax;
  memory = std::min({memory, ReadCgroupLimit("/sys/fs/cgroup/memory.max"),
                     ReadCgroupLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes")});
  return memory == kMax ? kMax : memory / 5 * 4;
}

std::string FormatBytes(uint64_t bytes) {
  return absl::StrCat(bytes, " bytes (", HumanBytes(bytes), ")");
}

}  // namespace samplerd
