// The CUDA ComputeBackend: checks and error messages are the CPU backend's (cpu_backend.cc), in
// the same order, so both return the same status for the same bad input; the work is the device
// kernels of device_plan.h and device_weights.h.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend_checks.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_loss_stats.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_weights.h"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/gpu_presence.h"
#include "kernels/cuda/mixture_window.h"
#include "kernels/cuda/recompute_params.h"
#include "kernels/loss_groups.h"
#include "kernels/loss_policies.h"
#include "kernels/mixture/window.h"
#include "kernels/plan_shard.h"

namespace samplerd {
namespace {

using cuda::CudaContext;
using cuda::CudaLossStats;
using cuda::CudaWeights;
using cuda::DeviceBuffer;
using cuda::Lane;

absl::StatusOr<const CudaWeights*> OwnWeights(const BackendWeights* weights, const char* field) {
  return OwnObject<CudaWeights>(weights, field, "cuda");
}

// Beyond this many entries of 8 bytes a byte count would overflow; no device holds them anyway.
constexpr uint64_t kMaxEntries = uint64_t{1} << 60;

absl::Status TooLarge(const char* what, uint64_t entries) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cuda: ", what, " of ", entries, " entries: more than device memory holds"));
}

// One element of a device array, copied back for an error message.
template <typename T>
absl::StatusOr<T> ReadElement(Lane& lane, const T* device_array, uint64_t i) {
  T value;
  SAMPLERD_RETURN_IF_ERROR(
      lane.CopyToHost(&value, device_array + i, sizeof(T), "an element for an error message"));
  return value;
}

// The CPU's error for sample i, the first with a bad entry (RecomputeCheck::first_bad): names
// the field and the value.
absl::Status BadRecomputeInput(Lane& lane, const CudaWeights* base, const CudaWeights* current,
                               const CudaLossStats& stats, uint64_t i) {
  auto valid_weight = [](float w) { return std::isfinite(w) && w >= 0; };
  if (base != nullptr) {
    absl::StatusOr<float> w = ReadElement(lane, base->device_data(), i);
    if (!w.ok()) return w.status();
    if (!valid_weight(*w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("base[", i, "] = ", *w, ": must be finite and >= 0"));
    }
  }
  if (current != nullptr) {
    absl::StatusOr<float> w = ReadElement(lane, current->device_data(), i);
    if (!w.ok()) return w.status();
    if (!valid_weight(*w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("current[", i, "] = ", *w, ": must be finite and >= 0"));
    }
  }
  absl::StatusOr<float> ema = ReadElement(lane, stats.device_stats().ema, i);
  if (!ema.ok()) return ema.status();
  return absl::InvalidArgumentError(
      absl::StrCat("stats[", i, "].ema_loss = ", *ema, ": must be finite and >= 0"));
}

// Frees a draw table on every path (FreeDrawTable is stream-ordered).
class DrawTableGuard {
 public:
  DrawTableGuard(gpu::DeviceDrawTable* table, cudaStream_t stream)
      : table_(table), stream_(stream) {}
  ~DrawTableGuard() { gpu::FreeDrawTable(table_, stream_); }

 private:
  gpu::DeviceDrawTable* table_;
  cudaStream_t stream_;
};

class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(std::shared_ptr<const CudaContext> context) : context_(std::move(context)) {}

  std::string name() const override { return "cuda"; }

  absl::StatusOr<std::shared_ptr<const BackendWeights>> MakeWeights(
      std::vector<float> weights) override;
  absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                 double ema_decay) override;
  using ComputeBackend::RecomputeWeights;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats,
      absl::Span<const float> irreducible) override;
  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 const BackendWeights* weights) override;
  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override;
  absl::StatusOr<std::vector<mixture::GroupCursor>> PlanMixtureWindow(
      uint64_t seed, uint64_t epoch, const mixture::GroupLayout& layout,
      absl::Span<const mixture::GroupCursor> cursors, absl::Span<const uint64_t> counts,
      absl::Span<uint64_t> out) override;
  uint64_t MixtureWindowScratchBytes(uint64_t groups, uint64_t window) const override;
  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override;
  absl::Status ImportanceWeights(const BackendWeights& weights, absl::Span<const uint64_t> indices,
                                 absl::Span<float> out) override;

  const CudaContext& context() const { return *context_; }

 private:
  // Computes the plan (validated inputs) on `lane` and copies it into `indices` (M entries).
  template <typename Index>
  absl::Status FillPlan(const PlanSpec& spec, uint64_t epoch, const CudaWeights* weights,
                        Lane& lane, LargeVector<Index>& indices) const;

  const std::shared_ptr<const CudaContext> context_;
};

absl::StatusOr<std::shared_ptr<const BackendWeights>> CudaBackend::MakeWeights(
    std::vector<float> weights) {
  if (absl::Status s = ValidateWeights(weights); !s.ok()) return s;
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::make_weights);
  absl::StatusOr<std::shared_ptr<CudaWeights>> made = CudaWeights::Upload(context_, weights);
  if (!made.ok()) return made.status();
  return std::shared_ptr<const BackendWeights>(*std::move(made));
}

absl::StatusOr<std::unique_ptr<BackendLossStats>> CudaBackend::NewLossStats(uint64_t num_samples,
                                                                            double ema_decay) {
  if (absl::Status s = CheckNewLossStats(num_samples, ema_decay); !s.ok()) return s;
  if (num_samples > kMaxEntries) return TooLarge("loss statistics", num_samples);
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::new_loss_stats);
  absl::StatusOr<std::unique_ptr<CudaLossStats>> made =
      CudaLossStats::Create(context_, num_samples, ema_decay);
  if (!made.ok()) return made.status();
  return std::unique_ptr<BackendLossStats>(*std::move(made));
}

absl::StatusOr<std::shared_ptr<const BackendWeights>> CudaBackend::RecomputeWeights(
    const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base_handle,
    const BackendWeights* current_handle, const BackendLossStats* stats_handle,
    absl::Span<const float> irreducible) {
  absl::StatusOr<const CudaWeights*> base = OwnWeights(base_handle, "base");
  if (!base.ok()) return base.status();
  absl::StatusOr<const CudaWeights*> current = OwnWeights(current_handle, "current");
  if (!current.ok()) return current.status();
  const CudaLossStats* stats = nullptr;
  if (stats_handle != nullptr) {
    absl::StatusOr<const CudaLossStats*> own =
        OwnObject<CudaLossStats>(stats_handle, "stats", "cuda");
    if (!own.ok()) return own.status();
    stats = *own;
  }
  absl::StatusOr<uint64_t> checked =
      CheckRecomputeInputs(policy, base_handle, current_handle, stats_handle, irreducible);
  if (!checked.ok()) return checked.status();
  const uint64_t n = *checked;
  if (!UsesLossStats(policy)) {
    if (*base == nullptr) return std::shared_ptr<const BackendWeights>();
    return std::shared_ptr<const BackendWeights>((*base)->shared_from_this());
  }
  // Every queued loss is on the device before the statistics are read.
  SAMPLERD_RETURN_IF_ERROR(stats->Flush());
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::recompute_weights);
  SAMPLERD_RETURN_IF_ERROR(context_->Enter());
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  const cudaStream_t stream = (*lane)->stream();
  DeviceBuffer out;
  SAMPLERD_RETURN_IF_ERROR(out.Allocate(n * sizeof(float), stream, "the recomputed weights"));
  gpu::RecomputeParams params = gpu::DeviceRecomputeParams(policy, closed_epoch);
  DeviceBuffer device_irreducible;
  if (UsesIrreducibleLosses(policy)) {
    // The irreducible losses (N of them: CheckRecomputeInputs; their values were validated when
    // the job took them, as for the CPU backend) to the device for this recompute; freed after
    // the kernels that read them (stream order). 4 B per sample of device memory while the
    // recompute runs.
    SAMPLERD_RETURN_IF_ERROR(
        device_irreducible.Allocate(n * sizeof(float), stream, "the irreducible losses"));
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToDevice(device_irreducible.as<void>(),
                                                   irreducible.data(), n * sizeof(float),
                                                   "the irreducible losses"));
    params.irreducible = device_irreducible.as<const float>();
  }
  LossGroupTable groups;
  if (params.within_groups) {
    // The groups' table is made on the host, from a copy of the base weights (the keys are
    // few: at most kMaxLossGroups).
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> host_base = (*base)->ToHost();
    if (!host_base.ok()) return host_base.status();
    if (!FindLossGroups((*host_base)->data(), n, kMaxLossGroups, &groups)) {
      return TooManyLossGroups();
    }
    params.group_keys = groups.keys.data();
    params.group_counts = groups.counts.data();
    params.num_groups = groups.size();
  }
  gpu::RecomputeCheck check;
  SAMPLERD_RETURN_IF_CUDA_ERROR(
      gpu::RecomputeWeights(params, n, *base ? (*base)->device_data() : nullptr,
                            *current ? (*current)->device_data() : nullptr, stats->device_stats(),
                            out.as<float>(), &check, stream),
      "RecomputeWeights");
  if (check.first_bad != ~uint64_t{0}) {
    return BadRecomputeInput(**lane, *base, *current, *stats, check.first_bad);
  }
  if (*base != nullptr && !check.base_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("base: all ", n, " weights are 0; at least one must be > 0"));
  }
  if (DescriptorOf(policy.loss).reads_current && *current != nullptr && !check.current_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("current: all ", n, " weights are 0; at least one must be > 0"));
  }
  absl::StatusOr<std::shared_ptr<CudaWeights>> made =
      CudaWeights::Adopt(context_, std::move(out), n, **lane);
  if (!made.ok()) return made.status();
  return std::shared_ptr<const BackendWeights>(*std::move(made));
}

absl::StatusOr<Plan> CudaBackend::PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                            const BackendWeights* weights_handle) {
  if (absl::Status s = ValidatePlanSpec(spec); !s.ok()) return s;
  absl::StatusOr<const CudaWeights*> weights = OwnWeights(weights_handle, "weights");
  if (!weights.ok()) return weights.status();
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  if (*weights != nullptr && (*weights)->size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", (*weights)->size(), " values for num_samples ", n));
  }
  // Backend weights are valid by construction (MakeWeights validated them, a recompute makes
  // valid ones), so their summary's zero count gives the positive ones without another pass.
  const uint64_t positive = *weights != nullptr ? n - (*weights)->summary().zero_count : n;
  if (!spec.replacement && spec.order == SampleOrder::kWeightedRandom && positive < m) {
    // Without replacement every drawn sample must have a positive weight.
    return absl::FailedPreconditionError(
        absl::StrCat("samples_per_epoch = ", m, " without replacement needs ", m,
                     " samples with positive weight; ", positive, " have one"));
  }
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::plan_epoch);
  SAMPLERD_RETURN_IF_ERROR(context_->Enter());
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  Plan plan;
  plan.epoch = epoch;
  plan.num_samples = n;
  if (Plan::Narrow(n)) {
    SAMPLERD_RETURN_IF_ERROR(FillPlan(spec, epoch, *weights, **lane, plan.indices32));
  } else {
    SAMPLERD_RETURN_IF_ERROR(FillPlan(spec, epoch, *weights, **lane, plan.indices64));
  }
  return plan;
}

template <typename Index>
absl::Status CudaBackend::FillPlan(const PlanSpec& spec, uint64_t epoch, const CudaWeights* weights,
                                   Lane& lane, LargeVector<Index>& indices) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  if (m > kMaxEntries) return TooLarge("a plan", m);  // M is unbounded with replacement.
  const cudaStream_t stream = lane.stream();
  const float* w = weights != nullptr ? weights->device_data() : nullptr;
  DeviceBuffer out;
  SAMPLERD_RETURN_IF_ERROR(out.Allocate(m * sizeof(Index), stream, "the plan"));
  Index* plan = out.as<Index>();
  if (spec.order == SampleOrder::kSequential) {
    SAMPLERD_RETURN_IF_CUDA_ERROR(gpu::SequentialPlan<Index>(n, plan, stream), "SequentialPlan");
  } else if (spec.replacement) {
    if (w == nullptr) {
      SAMPLERD_RETURN_IF_CUDA_ERROR(
          gpu::UniformDraws<Index>(spec.seed, epoch, n, 0, m, plan, stream), "UniformDraws");
    } else {
      // The quantisation needs the largest weight's bits: the summary's maximum is that weight
      // (a float widened to double, exactly).
      const float max_weight = static_cast<float>(weights->summary().max);
      uint32_t max_bits;
      std::memcpy(&max_bits, &max_weight, sizeof max_bits);
      gpu::DeviceDrawTable table;
      const DrawTableGuard guard(&table, stream);
      SAMPLERD_RETURN_IF_CUDA_ERROR(gpu::BuildDrawTable<Index>(w, n, max_bits, &table, stream),
                                    "BuildDrawTable");
      SAMPLERD_RETURN_IF_CUDA_ERROR(
          gpu::WeightedDraws<Index>(table, spec.seed, epoch, 0, m, plan, stream), "WeightedDraws");
    }
  } else if (spec.EveryIndexOnce()) {
    // Every sample exactly once: the weights cannot matter, only the order.
    SAMPLERD_RETURN_IF_CUDA_ERROR(gpu::Shuffle<Index>(spec.seed, epoch, m, nullptr, plan, stream),
                                  "Shuffle");
  } else {
    DeviceBuffer selected;
    SAMPLERD_RETURN_IF_ERROR(selected.Allocate(m * sizeof(Index), stream, "the selected samples"));
    SAMPLERD_RETURN_IF_CUDA_ERROR(gpu::SelectEfraimidisSpirakis<Index>(
                                      spec.seed, epoch, n, m, w, selected.as<Index>(), stream),
                                  "SelectEfraimidisSpirakis");
    SAMPLERD_RETURN_IF_CUDA_ERROR(
        gpu::Shuffle<Index>(spec.seed, epoch, m, selected.as<const Index>(), plan, stream),
        "Shuffle");
  }
  // Not written by resize (large_array.h): the copy below touches its pages first.
  indices.resize(m);
  return lane.CopyToHost(indices.data(), plan, m * sizeof(Index), "the plan");
}

uint64_t CudaBackend::PlanScratchBytes(const PlanSpec& spec, bool weighted) const {
  // Everything but the plan is device memory; on the host, PlanEpoch may make a new lane whose
  // pinned staging buffers carry the plan over PCIe (kept afterwards for later calls).
  static_cast<void>(spec);
  static_cast<void>(weighted);
  return 2 * cuda::kStagingBytes;
}

absl::StatusOr<std::vector<mixture::GroupCursor>> CudaBackend::PlanMixtureWindow(
    uint64_t seed, uint64_t epoch, const mixture::GroupLayout& layout,
    absl::Span<const mixture::GroupCursor> cursors, absl::Span<const uint64_t> counts,
    absl::Span<uint64_t> out) {
  // The host's checks, once (the CPU backend's are the same function: the same status).
  absl::StatusOr<uint64_t> m = mixture::ValidateWindowInto(layout, cursors, counts, out.size());
  if (!m.ok()) return m.status();
  if (*m > 0) {
    const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::plan_epoch);
    SAMPLERD_RETURN_IF_ERROR(context_->Enter());
    absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
    if (!lane.ok()) return lane.status();
    const cudaStream_t stream = (*lane)->stream();
    // The groups to the device, O(K): offsets, sizes, cursors and the counts' exclusive prefix
    // sums (K + 1), in one buffer of 8-byte words (a cursor is two).
    const uint64_t k_groups = layout.groups();
    std::vector<uint64_t> words(k_groups + k_groups + 2 * k_groups + k_groups + 1);
    uint64_t* offsets = words.data();
    uint64_t* sizes = offsets + k_groups;
    uint64_t* cursor_words = sizes + k_groups;
    uint64_t* prefix = cursor_words + 2 * k_groups;
    static_assert(sizeof(mixture::GroupCursor) == 2 * sizeof(uint64_t), "a cursor is two words");
    std::memcpy(offsets, layout.offsets().data(), k_groups * sizeof(uint64_t));
    std::memcpy(sizes, layout.sizes().data(), k_groups * sizeof(uint64_t));
    std::memcpy(cursor_words, cursors.data(), k_groups * sizeof(mixture::GroupCursor));
    prefix[0] = 0;
    for (uint64_t k = 0; k < k_groups; ++k) prefix[k + 1] = prefix[k] + counts[k];
    DeviceBuffer groups_buffer, window;
    SAMPLERD_RETURN_IF_ERROR(groups_buffer.Allocate(words.size() * sizeof(uint64_t), stream,
                                                    "the mixture window's groups"));
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToDevice(groups_buffer.as<void>(), words.data(),
                                                   words.size() * sizeof(uint64_t),
                                                   "the mixture window's groups"));
    const uint64_t* device_words = groups_buffer.as<const uint64_t>();
    gpu::DeviceMixtureGroups groups;
    groups.groups = layout.groups();
    groups.offsets = device_words;
    groups.sizes = device_words + k_groups;
    groups.cursors = reinterpret_cast<const mixture::GroupCursor*>(device_words + 2 * k_groups);
    groups.count_prefix = device_words + 4 * k_groups;
    SAMPLERD_RETURN_IF_ERROR(window.Allocate(*m * sizeof(uint64_t), stream, "the mixture window"));
    SAMPLERD_RETURN_IF_CUDA_ERROR(
        gpu::PlanMixtureWindow(seed, epoch, groups, *m, window.as<uint64_t>(), stream),
        "PlanMixtureWindow");
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToHost(out.data(), window.as<const uint64_t>(),
                                                 *m * sizeof(uint64_t), "the mixture window"));
  }
  // The cursors after the window: O(K) on the host.
  return mixture::CursorsAfter(layout, cursors, counts);
}

uint64_t CudaBackend::MixtureWindowScratchBytes(uint64_t groups, uint64_t window) const {
  // On the host: the groups' words to upload (5 K + 1) and, as for a plan, the staging buffers
  // of a new lane. The window and its shuffle are device memory.
  static_cast<void>(window);
  if (groups >= ~uint64_t{0} / 64) return ~uint64_t{0};  // The count would overflow.
  return (5 * groups + 1) * sizeof(uint64_t) + 2 * cuda::kStagingBytes;
}

absl::Status CudaBackend::ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                       uint64_t start, absl::Span<uint64_t> out) {
  // The plan is on the host already (PlanEpoch copied it there once).
  return CopyShard(plan, shard, rank, start, out);
}

absl::Status CudaBackend::ImportanceWeights(const BackendWeights& weights_handle,
                                            absl::Span<const uint64_t> indices,
                                            absl::Span<float> out) {
  absl::StatusOr<const CudaWeights*> weights = OwnWeights(&weights_handle, "weights");
  if (!weights.ok()) return weights.status();
  const uint64_t n = (*weights)->size();
  if (absl::Status s = CheckImportanceArguments(n, indices, out); !s.ok()) return s;
  if (indices.empty()) return absl::OkStatus();
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::importance_weights);
  SAMPLERD_RETURN_IF_ERROR(context_->Enter());
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  const cudaStream_t stream = (*lane)->stream();
  // In pieces of one staging buffer of indices: a streamed chunk is one piece.
  const uint64_t piece = cuda::kStagingBytes / sizeof(uint64_t);
  const uint64_t first_piece = std::min<uint64_t>(piece, indices.size());
  DeviceBuffer device_indices, device_out;
  SAMPLERD_RETURN_IF_ERROR(device_indices.Allocate(first_piece * sizeof(uint64_t), stream,
                                                   "importance weights' indices"));
  SAMPLERD_RETURN_IF_ERROR(
      device_out.Allocate(first_piece * sizeof(float), stream, "importance weights"));
  for (uint64_t begin = 0; begin < indices.size(); begin += piece) {
    const uint64_t count = std::min<uint64_t>(piece, indices.size() - begin);
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToDevice(
        device_indices.as<void>(), indices.data() + begin, count * sizeof(uint64_t), "indices"));
    SAMPLERD_RETURN_IF_CUDA_ERROR(
        gpu::GatherImportance((*weights)->device_data(), device_indices.as<const uint64_t>(), count,
                              device_out.as<float>(), stream),
        "GatherImportance");
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToHost(out.data() + begin, device_out.as<float>(),
                                                 count * sizeof(float), "importance weights"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeBackend>> NewCudaBackend(const CudaBackendOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device = ", options.device, ": must be >= 0"));
  }
  // CheckGpu asks about device 0 (and its free memory); another device is asked below.
  const gpu::GpuPresence presence = gpu::CheckGpu(options.device == 0 ? options.min_free_bytes : 0);
  if (!presence.usable()) {
    return absl::FailedPreconditionError(absl::StrCat("cuda backend: ", presence.message));
  }
  if (options.device != 0) {
    int count = 0;
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (options.device >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda backend: no CUDA device ", options.device, ": ", count, " visible"));
    }
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device),
                                  absl::StrCat("cudaSetDevice(", options.device, ")"));
    size_t free_bytes = 0, total_bytes = 0;
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (free_bytes < options.min_free_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda backend: GPU out of memory: ", options.min_free_bytes,
                       " bytes needed, ", free_bytes, " free on device ", options.device));
    }
  }
  // Scratch freed by one plan stays in the pool for the next (device_plan.h).
  SAMPLERD_RETURN_IF_CUDA_ERROR(gpu::KeepPoolMemory(options.device), "KeepPoolMemory");
  absl::StatusOr<std::shared_ptr<CudaContext>> context = CudaContext::Create(options.device);
  if (!context.ok()) return context.status();
  return std::unique_ptr<ComputeBackend>(new CudaBackend(*std::move(context)));
}

std::optional<CudaMemoryPeaks> CudaMemoryPeaksOf(const ComputeBackend& backend, bool reset) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return std::nullopt;
  return cuda_backend->context().Peaks(reset);
}

}  // namespace samplerd
