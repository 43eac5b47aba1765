// ddp_trainer: a C++ data-parallel trainer on samplerd, one process per GPU, gradients summed
// with NCCL. The C++ counterpart of examples/ddp_train.py (README "C++ DDP trainer").
//
// Each process (rank) holds the whole synthetic, class-imbalanced training set and a balanced
// test set in GPU memory (synthetic_data.h; every rank makes the same ones from the seed) and a
// two-layer perceptron (mlp.h, own CUDA kernels). The rank's EpochLoop (client/cpp/epoch_loop.h)
// hands each step the next batch of this rank's shard straight in device memory (its device
// delivery, ShardReader::NextToDevice); the step gathers the rows on the device, computes the
// per-sample losses there, hands them to the server from the device (LossSink::ReportFromDevice),
// back-propagates, sums the gradients of all ranks (ncclAllReduce) and takes an SGD step. Three
// runs, each on its own job (rank 0 creates it, replacing one of the same name):
//   1. "balanced x loss": CLASS_BALANCED base (labels uploaded) x LOSS policy, losses reported
//      every step: the server draws the rare classes and the hard samples more often;
//   2. "uniform": UNIFORM base, no loss policy, nothing reported; the same model, seed, samples
//      per epoch and steps: the baseline;
//   3. "reporter cost": the run of 1 again for --timing_epochs epochs, reporting on every other
//      step only, so that steps with and without ReportFromDevice alternate under the same
//      conditions; CUDA events around each step give both medians.
// Per epoch (at the end of the ranks' shards, before they end it), rank 0 prints the mean
// training loss, the balanced accuracy on the test set with the per-class recalls, the share of
// each class among the samples drawn, and the weight statistics of GetJobStatus (the weights the
// epoch was drawn from).
//
// Checkpoints (--checkpoint_dir, a directory every rank sees): each rank saves its loop's
// position and the model's parameters (examples/cpp/checkpointed_loop.h, the same code as
// cpu_trainer's) at the start of every --checkpoint_every-th step of a shard and at each end of
// shard. Started again (after a crash of any rank: NCCL takes the group down with it), a run
// whose ranks all find their checkpoints at one position resumes from them with the saved model,
// instead of creating its job again; ranks whose checkpoints disagree (a kill between two ranks'
// saves) stop with FAILED_PRECONDITION saying what to do. A run that finished is not trained
// again (its checkpoints are at the end of its last epoch).
//
// Ranks: --rank/--world_size/--local_rank, else RANK/WORLD_SIZE/LOCAL_RANK (rank_info.h); the
// GPU is --local_rank. The NCCL unique id goes from rank 0 to the others through
// --nccl_id_file (id_file.h), a path all ranks see; at world size 1 no file is used. Launch:
//   for r in 0 1; do RANK=$r WORLD_SIZE=2 ddp_trainer --address=HOST:PORT
//     --nccl_id_file=/tmp/ddp.id & done; wait
// Exit status: 0 on success; 2 when no usable GPU is present (the message names the CUDA
// runtime's reason); 1 on any other error (the message names the failed call).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/cuda_support.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "examples/cpp/balanced_accuracy.h"
#include "examples/cpp/checkpointed_loop.h"
#include "examples/cpp/id_file.h"
#include "examples/cpp/mlp.h"
#include "examples/cpp/mlp_init.h"
#include "examples/cpp/rank_info.h"
#include "examples/cpp/synthetic_data.h"
#include "kernels/plan_math.h"
#include "proto/samplerd.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "samplerd address (host:port)");
ABSL_FLAG(std::string, job_prefix, "cpp-ddp",
          "jobs <prefix>-balanced-loss, <prefix>-uniform, <prefix>-timing (rank 0 replaces "
          "existing jobs of these names)");
ABSL_FLAG(int64_t, rank, -1, "data-parallel rank (default: $RANK, else 0)");
ABSL_FLAG(int64_t, world_size, 0, "data-parallel ranks (default: $WORLD_SIZE, else 1)");
ABSL_FLAG(int64_t, local_rank, -1, "GPU of this process (default: $LOCAL_RANK, else the rank)");
ABSL_FLAG(std::string, nccl_id_file, "/tmp/samplerd_ddp_trainer.nccl_id",
          "file through which rank 0 hands the NCCL unique id to the others (world size > 1)");
ABSL_FLAG(int, features, 32, "input features");
ABSL_FLAG(int, hidden, 64, "hidden units");
ABSL_FLAG(int, classes, 4, "classes");
ABSL_FLAG(uint64_t, majority, 100000, "training samples of class 0");
ABSL_FLAG(double, imbalance, 100.0, "class 0's size over the last class's");
ABSL_FLAG(double, separation, 2.0, "distance of the class means from the origin (noise: 1)");
ABSL_FLAG(uint64_t, test_per_class, 2000, "test samples per class");
ABSL_FLAG(uint64_t, samples_per_epoch, 0,
          "M, samples drawn per epoch (0: N / 4, rounded down to a multiple of the world size)");
ABSL_FLAG(int, batch_size, 512, "samples per rank and step");
ABSL_FLAG(int, epochs, 10, "epochs of each of the two compared runs");
ABSL_FLAG(int, timing_epochs, 6,
          "epochs of the reporter-cost run (the first one is warm-up; 0 skips the run)");
ABSL_FLAG(double, lr, 0.5, "SGD learning rate");
ABSL_FLAG(uint64_t, seed, 7, "seed of the data, the model and the jobs");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory (seen by every rank) of the ranks' checkpoints <job>.rank-<rank>.ckpt: a "
          "run whose ranks all find theirs resumes from them instead of creating its job again "
          "(empty: no checkpoints)");
ABSL_FLAG(uint64_t, crash_at_step, 0,
          "for the restart test (run_on_gpu.sh): the process SIGKILLs itself at the start of its "
          "this-many-th training step, after that step's checkpoint if one is due (0: never)");
ABSL_FLAG(uint64_t, checkpoint_every, 20,
          "with --checkpoint_dir: save at the start of every this many steps of a shard (0: at "
          "ends of shard only)");

namespace {

using samplerd::CudaStatus;
using samplerd::examples::BalancedAccuracy;
using samplerd::examples::ClassRecalls;
using samplerd::examples::Dataset;
using samplerd::examples::MlpShape;
using samplerd::examples::RankInfo;
namespace v1 = samplerd::v1;
namespace ex = samplerd::examples;

#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    const absl::Status status_macro_value_ = (expr);           \
    if (!status_macro_value_.ok()) return status_macro_value_; \
  } while (0)

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

// A device array, freed in the destructor.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) {
      const absl::Status s = CudaStatus(cudaFree(data_), "cudaFree");
      if (!s.ok()) std::fprintf(stderr, "warning: %s\n", s.ToString().c_str());
    }
  }

  // `size` elements; `what` names the array in the error.
  static absl::StatusOr<DeviceArray> Allocate(size_t size, const std::string& what) {
    DeviceArray array;
    const std::string call = absl::StrCat("cudaMalloc(", what, ", ", size * sizeof(T), " bytes)");
    RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&array.data_, std::max<size_t>(1, size) * sizeof(T)), call.c_str()));
    array.size_ = size;
    return array;
  }
  // Allocate, then a copy of `host`, complete on return.
  static absl::StatusOr<DeviceArray> FromHost(const std::vector<T>& host, const std::string& what) {
    absl::StatusOr<DeviceArray> array = Allocate(host.size(), what);
    if (!array.ok()) return array.status();
    const std::string call = absl::StrCat("cudaMemcpy(", what, ", host to device)");
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(array->data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        call.c_str()));
    // cudaMemcpy from pageable memory returns once the data is staged, its DMA possibly still
    // running on the legacy stream, which the trainer's non-blocking stream does not wait for.
    RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), call.c_str()));
    return array;
  }

  T* get() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// Takes `expr` (a StatusOr) into `lhs` or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr)               \
  auto lhs##_or_ = (expr);                        \
  if (!lhs##_or_.ok()) return lhs##_or_.status(); \
  auto lhs = std::move(*lhs##_or_)

double Median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The process's GPU, stream and NCCL communicator.
class GpuGroup {
 public:
  GpuGroup(const GpuGroup&) = delete;
  GpuGroup& operator=(const GpuGroup&) = delete;
  ~GpuGroup() {
    // Errors here are only reported: the results are printed already.
    if (comm_ != nullptr) {
      const absl::Status s = NcclStatus(ncclCommDestroy(comm_), "ncclCommDestroy");
      if (!s.ok()) std::fprintf(stderr, "warning: %s\n", s.ToString().c_str());
    }
    if (stream_ != nullptr) {
      const absl::Status s = CudaStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy");
      if (!s.ok()) std::fprintf(stderr, "warning: %s\n", s.ToString().c_str());
    }
  }

  // Selects GPU `ranks.local_rank`, makes a stream and joins the NCCL group (rank 0 makes the
  // unique id and, at world size > 1, publishes it in `id_file`).
  static absl::StatusOr<std::unique_ptr<GpuGroup>> Create(const RankInfo& ranks,
                                                          const std::string& id_file) {
    int devices = 0;
    RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
    if (ranks.local_rank >= devices) {
      return absl::FailedPreconditionError(
          absl::StrCat("local rank ", ranks.local_rank, " has no GPU: this machine has ", devices));
    }
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ranks.local_rank), "cudaSetDevice"));
    std::unique_ptr<GpuGroup> group(new GpuGroup(ranks));
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&group->stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    ncclUniqueId id;
    const bool use_file = ranks.world_size > 1;
    if (ranks.rank == 0) {
      RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
      if (use_file) {
        RETURN_IF_ERROR(ex::PublishIdFile(id_file, std::string(id.internal, sizeof(id.internal))));
      }
    } else {
      ASSIGN_OR_RETURN(bytes, ex::ReadIdFile(id_file, sizeof(id.internal), absl::Minutes(5)));
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&group->comm_, static_cast<int>(ranks.world_size),
                                                id, static_cast<int>(ranks.rank)),
                               "ncclCommInitRank"));
    ASSIGN_OR_RETURN(scratch, DeviceArray<double>::Allocate(64, "NCCL scratch"));
    group->scratch_ = std::move(scratch);
    // Every rank has joined once the first collective returns: the file is no longer needed.
    RETURN_IF_ERROR(group->Barrier());
    if (use_file && ranks.rank == 0) RETURN_IF_ERROR(ex::RemoveIdFile(id_file));
    return group;
  }

  // Returns once every rank has called it (an all-reduce of one value, waited for).
  absl::Status Barrier() {
    std::vector<double> one = {1.0};
    return AllReduceHost(one);
  }

  // Sums `values` (at most 64) over the ranks, in place (or takes their maximum: `op`
  // ncclMax); waits for the result.
  absl::Status AllReduceHost(std::vector<double>& values, ncclRedOp_t op = ncclSum) {
    if (values.size() > scratch_.size()) {
      return absl::InternalError(absl::StrCat("AllReduceHost of ", values.size(), " values"));
    }
    const size_t bytes = values.size() * sizeof(double);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(scratch_.get(), values.data(), bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(all-reduce values, host to device)"));
    RETURN_IF_ERROR(NcclStatus(ncclAllReduce(scratch_.get(), scratch_.get(), values.size(),
                                             ncclDouble, op, comm_, stream_),
                               "ncclAllReduce(host values)"));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(values.data(), scratch_.get(), bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(all-reduce values, device to host)"));
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(all-reduce values)");
  }

  const RankInfo& ranks() const { return ranks_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }

 private:
  explicit GpuGroup(const RankInfo& ranks) : ranks_(ranks) {}

  const RankInfo ranks_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  DeviceArray<double> scratch_;
};

// Begin and end events of each step of an epoch, created as needed and reused.
class StepEvents {
 public:
  StepEvents() = default;
  StepEvents(const StepEvents&) = delete;
  StepEvents& operator=(const StepEvents&) = delete;
  ~StepEvents() {
    for (cudaEvent_t e : events_) {
      const absl::Status s = CudaStatus(cudaEventDestroy(e), "cudaEventDestroy");
      if (!s.ok()) std::fprintf(stderr, "warning: %s\n", s.ToString().c_str());
    }
  }

  // Records the begin (end = false) or end event of `step` on `stream`.
  absl::Status Record(size_t step, bool end, cudaStream_t stream) {
    const size_t slot = 2 * step + (end ? 1 : 0);
    while (events_.size() <= slot) {
      cudaEvent_t e;
      RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "cudaEventCreate(step timing)"));
      events_.push_back(e);
    }
    return CudaStatus(cudaEventRecord(events_[slot], stream), "cudaEventRecord(step timing)");
  }

  // Milliseconds between the begin and end events of `step` (both recorded and completed).
  absl::StatusOr<double> ElapsedMs(size_t step) const {
    float ms = 0.0f;
    RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, events_[2 * step], events_[2 * step + 1]),
                               "cudaEventElapsedTime(step timing)"));
    return static_cast<double>(ms);
  }

 private:
  std::vector<cudaEvent_t> events_;
};

enum class ReportMode {
  kNever,      // No loss policy: nothing to report.
  kEveryStep,  // What a trainer on a LOSS policy does.
  kAlternate,  // Even steps report, odd steps do not (the reporter-cost measurement).
};

struct RunSpec {
  std::string label;
  std::string job;
  bool balanced_loss_policy = false;  // Else UNIFORM, no loss policy.
  ReportMode report = ReportMode::kNever;
  int epochs = 0;
  bool print_epochs = true;
};

struct StepTimes {
  std::vector<double> with_report_ms, without_report_ms;            // CUDA events, begin to end.
  std::vector<double> with_report_host_us, without_report_host_us;  // Host time to enqueue.
};

struct RunResult {
  double final_balanced_accuracy = 0.0;
  StepTimes times;  // Of every epoch but the first (warm-up).
};

struct TrainerConfig {
  // Checkpoints (checkpointed_loop.h): <checkpoint_dir>/<job>.rank-<rank>.ckpt, saved at the
  // start of every checkpoint_every-th step of a shard and at its end; empty: none.
  std::string checkpoint_dir;
  uint64_t checkpoint_every = 0;
  uint64_t crash_at_step = 0;  // --crash_at_step.
  MlpShape shape;
  uint64_t samples_per_epoch = 0;
  size_t batch_size = 0;
  float lr = 0.0f;
  uint64_t seed = 0;
  std::string address;
};

// The training data and model buffers on the device, and the runs over them.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerConfig& config, GpuGroup* gpu, std::shared_ptr<samplerd::SamplerClient> client,
      const Dataset& train, const Dataset& test) {
    std::unique_ptr<Trainer> t(new Trainer(config, gpu, std::move(client), train, test));
    const MlpShape& s = config.shape;
    const size_t b = config.batch_size;
    const size_t eval_rows = test.size();
    ASSIGN_OR_RETURN(x, DeviceArray<float>::FromHost(train.x, "training features"));
    ASSIGN_OR_RETURN(y, DeviceArray<uint32_t>::FromHost(train.y, "training labels"));
    ASSIGN_OR_RETURN(x_test, DeviceArray<float>::FromHost(test.x, "test features"));
    ASSIGN_OR_RETURN(params, DeviceArray<float>::Allocate(s.param_count(), "parameters"));
    ASSIGN_OR_RETURN(grads, DeviceArray<float>::Allocate(s.param_count(), "gradients"));
    ASSIGN_OR_RETURN(indices, DeviceArray<int64_t>::Allocate(b, "batch indices"));
    ASSIGN_OR_RETURN(xb, DeviceArray<float>::Allocate(b * s.features, "batch features"));
    ASSIGN_OR_RETURN(yb, DeviceArray<uint32_t>::Allocate(b, "batch labels"));
    ASSIGN_OR_RETURN(hidden,
                     DeviceArray<float>::Allocate(std::max(b, eval_rows) * s.hidden, "hidden"));
    ASSIGN_OR_RETURN(dhidden, DeviceArray<float>::Allocate(b * s.hidden, "hidden gradients"));
    ASSIGN_OR_RETURN(losses, DeviceArray<float>::Allocate(b, "losses"));
    ASSIGN_OR_RETURN(dlogits, DeviceArray<float>::Allocate(b * s.classes, "logit gradients"));
    ASSIGN_OR_RETURN(predictions, DeviceArray<uint32_t>::Allocate(eval_rows, "predictions"));
    ASSIGN_OR_RETURN(bad_index, DeviceArray<int>::Allocate(1, "bad index flag"));
    t->x_ = std::move(x);
    t->y_ = std::move(y);
    t->x_test_ = std::move(x_test);
    t->params_ = std::move(params);
    t->grads_ = std::move(grads);
    t->indices_ = std::move(indices);
    t->xb_ = std::move(xb);
    t->yb_ = std::move(yb);
    t->hidden_ = std::move(hidden);
    t->dhidden_ = std::move(dhidden);
    t->losses_ = std::move(losses);
    t->dlogits_ = std::move(dlogits);
    t->predictions_ = std::move(predictions);
    t->bad_index_ = std::move(bad_index);
    return t;
  }

  absl::StatusOr<RunResult> Run(const RunSpec& run) {
    const RankInfo& ranks = gpu_->ranks();
    const cudaStream_t stream = gpu_->stream();
    // This rank's checkpoint of the run's job, and whether the group resumes (every rank has
    // one, at the same position) or starts the job afresh (no rank has one).
    ex::CheckpointOptions checkpoints;
    if (!config_.checkpoint_dir.empty()) {
      checkpoints.path =
          absl::StrCat(config_.checkpoint_dir, "/", run.job, ".rank-", ranks.rank, ".ckpt");
      checkpoints.every_steps = config_.checkpoint_every;
    }
    ASSIGN_OR_RETURN(saved, ex::LoadCheckpointIfAny(checkpoints));
    ASSIGN_OR_RETURN(resuming, GroupResumes(run.job, saved));
    if (!resuming && ranks.rank == 0) RETURN_IF_ERROR(CreateJob(run));
    RETURN_IF_ERROR(gpu_->Barrier());  // The job exists for every rank.

    // The model: the checkpoint's (the same on every rank: saved after an all-reduced step), or
    // the initial one. On `stream`, not the legacy stream: the non-blocking stream's kernels
    // would not wait for cudaMemcpy's DMA from pageable memory nor for cudaMemset (both may
    // still run on return).
    std::vector<float> model = ex::InitialParams(config_.shape, config_.seed);
    if (resuming) RETURN_IF_ERROR(ParamsFromBytes(saved->model, checkpoints.path, model));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(params_.get(), model.data(), model.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, stream),
                   "cudaMemcpyAsync(parameters)"));
    RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(bad_index_.get(), 0, sizeof(int), stream),
                               "cudaMemsetAsync(bad index flag)"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(model)"));
    // The rank's loop: it claims the rank (a second live process of it is refused here), reads
    // each batch into indices_ on `stream`, reports from the device, flushes before EndEpoch.
    samplerd::EpochLoopOptions options;
    options.batch_size = config_.batch_size;
    options.queue_capacity = std::max(options.queue_capacity, 2 * config_.batch_size);
    options.device_indices = indices_.get();
    options.device_stream = stream;
    ASSIGN_OR_RETURN(
        loop, samplerd::EpochLoop::Create(client_, run.job, ranks.rank, ranks.world_size, options));

    const int classes = config_.shape.classes;
    if (ranks.rank == 0 && run.print_epochs) {
      std::printf("\n== %s (job %s, world size %u, M = %llu per epoch, batch %zu per rank)\n",
                  run.label.c_str(), run.job.c_str(), ranks.world_size,
                  static_cast<unsigned long long>(config_.samples_per_epoch), config_.batch_size);
      if (resuming) {
        std::printf("resumed from the checkpoints at epoch %llu position %llu\n",
                    static_cast<unsigned long long>(saved->position.epoch),
                    static_cast<unsigned long long>(saved->position.position));
      }
      std::printf("%5s %8s %8s  %-*s  %-*s  %8s %8s %10s %8s\n", "epoch", "loss", "bal.acc",
                  7 * classes, "recall per class", 7 * classes, "drawn share per class", "w min",
                  "w max", "ESS", "seen");
    }
    RunResult result;
    // The epoch's record, from its first step this process took: summed over the ranks at the
    // end of the shard, [loss sum, samples, samples drawn of each class].
    std::vector<double> totals;
    std::vector<bool> reported;
    std::vector<double> host_us;
    uint64_t epoch_open = UINT64_MAX;
    const auto begin_epoch = [&](uint64_t epoch) {
      if (epoch == epoch_open) return;
      epoch_open = epoch;
      totals.assign(2 + classes, 0.0);
      reported.clear();
      host_us.clear();
    };
    const samplerd::EpochLoop::Step step = [&](const samplerd::EpochBatch& batch,
                                               samplerd::LossSink& losses) -> absl::Status {
      if (++steps_taken_ == config_.crash_at_step) std::raise(SIGKILL);
      begin_epoch(batch.epoch);
      const size_t k = reported.size();  // This epoch's step, in this process.
      const auto host_begin = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(events_.Record(k, /*end=*/false, stream));
      const size_t n = batch.indices.size();
      for (uint64_t index : batch.indices) {
        // An index >= N is not read here either: the gather's flag reports it below.
        if (index < train_.y.size()) totals[2 + train_.y[index]] += 1.0;
      }
      const bool report = run.report == ReportMode::kEveryStep ||
                          (run.report == ReportMode::kAlternate && k % 2 == 0);
      RETURN_IF_ERROR(Step(n, report ? &losses : nullptr, step_loss_sums_.get() + k));
      RETURN_IF_ERROR(events_.Record(k, /*end=*/true, stream));
      host_us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_begin)
              .count());
      reported.push_back(report);
      totals[1] += static_cast<double>(n);
      return absl::OkStatus();
    };
    samplerd::LossCounts counts;
    // Before EndEpoch (the loop's), after the end-of-shard checkpoint: the epoch's checks, its
    // all-reduced record and rank 0's line.
    const samplerd::EpochLoop::ShardEndHook shard_end =
        [&](const samplerd::ShardEnd& end) -> absl::Status {
      begin_epoch(end.epoch);  // A shard this process took no step of (resumed at its end).
      counts = end.losses;
      RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(epoch)"));
      int bad = 0;
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(&bad, bad_index_.get(), sizeof(int), cudaMemcpyDeviceToHost),
                     "cudaMemcpy(bad index flag)"));
      if (bad != 0) {
        return absl::DataLossError(
            absl::StrCat("job ", run.job, " epoch ", end.epoch,
                         ": the server sent an index >= N = ", train_.size()));
      }
      std::vector<float> step_sums(reported.size());
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(step_sums.data(), step_loss_sums_.get(),
                                step_sums.size() * sizeof(float), cudaMemcpyDeviceToHost),
                     "cudaMemcpy(step loss sums)"));
      for (float sum : step_sums) totals[0] += sum;
      if (end.epoch > 0) {  // The first epoch warms up (allocations, NCCL, the reporter's buffers).
        for (size_t k = 0; k < reported.size(); ++k) {
          ASSIGN_OR_RETURN(ms, events_.ElapsedMs(k));
          (reported[k] ? result.times.with_report_ms : result.times.without_report_ms)
              .push_back(ms);
          (reported[k] ? result.times.with_report_host_us : result.times.without_report_host_us)
              .push_back(host_us[k]);
        }
      }
      RETURN_IF_ERROR(gpu_->AllReduceHost(totals));  // Also: every rank reached its shard's end.
      if (ranks.rank != 0 || !run.print_epochs) return absl::OkStatus();
      ASSIGN_OR_RETURN(recalls, Evaluate());
      // No rank has ended the epoch yet: the weights it was drawn from.
      ASSIGN_OR_RETURN(status, client_->GetJobStatus(run.job));
      std::string recall_text, drawn_text;
      for (int c = 0; c < classes; ++c) {
        absl::StrAppendFormat(&recall_text, "%6.3f ", recalls.recall[c]);
        absl::StrAppendFormat(&drawn_text, "%6.3f ",
                              totals[1] > 0 ? totals[2 + c] / totals[1] : 0.0);
      }
      const v1::WeightStats& w = status.weights();
      std::printf(
          "%5llu %8.4f %8.4f  %s  %s  %8.3g %8.3g %10.1f %8llu\n",
          static_cast<unsigned long long>(end.epoch), totals[1] > 0 ? totals[0] / totals[1] : 0.0,
          recalls.balanced_accuracy, recall_text.c_str(), drawn_text.c_str(), w.min(), w.max(),
          w.effective_sample_size(), static_cast<unsigned long long>(status.samples_seen()));
      std::fflush(stdout);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(ex::RunWithCheckpoints(
        *loop, checkpoints, ex::ResumeFrom(saved), /*current_epoch=*/0,
        static_cast<uint64_t>(run.epochs), [&] { return ParamsBytes(); }, step, shard_end,
        nullptr));
    if (ranks.rank == 0) {
      ASSIGN_OR_RETURN(recalls, Evaluate());  // Also when the checkpoints were past the end.
      result.final_balanced_accuracy = recalls.balanced_accuracy;
      if (run.print_epochs && run.report != ReportMode::kNever) {
        std::printf(
            "rank 0's reporter: %llu pairs reported, %llu accepted, %llu duplicates, "
            "%llu stale, %llu streams; positions served again: %llu\n",
            static_cast<unsigned long long>(counts.reported),
            static_cast<unsigned long long>(counts.accepted),
            static_cast<unsigned long long>(counts.duplicates),
            static_cast<unsigned long long>(counts.stale),
            static_cast<unsigned long long>(counts.streams),
            static_cast<unsigned long long>(loop->restart_summary().served_again));
      }
    }
    return result;
  }

  // Allocates the per-step loss sums for `steps_per_epoch` steps.
  absl::Status Reserve(size_t steps_per_epoch) {
    ASSIGN_OR_RETURN(sums, DeviceArray<float>::Allocate(steps_per_epoch, "step loss sums"));
    step_loss_sums_ = std::move(sums);
    return absl::OkStatus();
  }

 private:
  Trainer(const TrainerConfig& config, GpuGroup* gpu,
          std::shared_ptr<samplerd::SamplerClient> client, const Dataset& train,
          const Dataset& test)
      : config_(config), gpu_(gpu), client_(std::move(client)), train_(train), test_(test) {}

  // Rank 0: the run's job, replacing one of the same name from an earlier run.
  absl::Status CreateJob(const RunSpec& run) {
    const absl::Status deleted = client_->DeleteJob(run.job);
    if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
    v1::JobSpec spec;
    spec.set_num_samples(train_.size());
    spec.set_seed(config_.seed);
    spec.set_world_size(gpu_->ranks().world_size);
    spec.set_samples_per_epoch(config_.samples_per_epoch);
    if (run.balanced_loss_policy) {
      // The policy of examples/ddp_train.py.
      v1::WeightPolicy* policy = spec.mutable_policy();
      policy->set_base(v1::CLASS_BALANCED);
      policy->set_loss(v1::LOSS);
      policy->set_ema_decay(0.5);
      policy->set_alpha(1.0);
      policy->set_mix(0.1);
      policy->set_clamp_hi(20.0);
    } else {
      spec.mutable_policy()->set_base(v1::UNIFORM);
      spec.mutable_policy()->set_loss(v1::NONE);
    }
    absl::StatusOr<v1::Job> job = client_->CreateJob(run.job, spec);
    if (!job.ok()) return job.status();
    if (run.balanced_loss_policy) return client_->UploadLabels(run.job, train_.y);
    return absl::OkStatus();
  }

  // One training step on the batch of `n` indices the loop put in indices_: gather, forward,
  // per-sample losses (reported from the device through `losses` if set), backward, all-reduce,
  // SGD. Enqueues only; the batch's loss sum goes to *loss_sum (device).
  absl::Status Step(size_t n, samplerd::LossSink* losses, float* loss_sum) {
    const MlpShape& s = config_.shape;
    const cudaStream_t stream = gpu_->stream();
    RETURN_IF_ERROR(
        CudaStatus(ex::GatherBatch(x_.get(), y_.get(), train_.size(), s.features, indices_.get(), n,
                                   xb_.get(), yb_.get(), bad_index_.get(), stream),
                   "GatherBatch kernel"));
    RETURN_IF_ERROR(CudaStatus(ex::Forward(s, params_.get(), xb_.get(), n, hidden_.get(), stream),
                               "Forward kernel"));
    RETURN_IF_ERROR(CudaStatus(ex::LossAndLogitGrad(s, params_.get(), hidden_.get(), yb_.get(), n,
                                                    losses_.get(), dlogits_.get(), stream),
                               "LossAndLogitGrad kernel"));
    if (losses != nullptr) RETURN_IF_ERROR(losses->ReportFromDevice(losses_.get()));
    RETURN_IF_ERROR(
        CudaStatus(ex::SumLosses(losses_.get(), n, loss_sum, stream), "SumLosses kernel"));
    RETURN_IF_ERROR(
        CudaStatus(ex::Backward(s, params_.get(), xb_.get(), hidden_.get(), dlogits_.get(), n,
                                dhidden_.get(), grads_.get(), stream),
                   "Backward kernels"));
    RETURN_IF_ERROR(NcclStatus(ncclAllReduce(grads_.get(), grads_.get(), s.param_count(), ncclFloat,
                                             ncclSum, gpu_->comm(), stream),
                               "ncclAllReduce(gradients)"));
    const float scale = config_.lr / static_cast<float>(gpu_->ranks().world_size);
    return CudaStatus(ex::SgdUpdate(params_.get(), grads_.get(), s.param_count(), scale, stream),
                      "SgdUpdate kernel");
  }

  // The parameters as bytes, for a checkpoint (waits for the device: between two steps).
  absl::StatusOr<std::string> ParamsBytes() {
    std::string bytes(config_.shape.param_count() * sizeof(float), '\0');
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(bytes.data(), params_.get(), bytes.size(),
                                               cudaMemcpyDeviceToHost, gpu_->stream()),
                               "cudaMemcpyAsync(parameters for a checkpoint)"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(gpu_->stream()), "cudaStreamSynchronize(checkpoint)"));
    return bytes;
  }

  // `bytes` (a checkpoint's, from `path`) into `params`: DATA_LOSS if they are not this
  // model's parameters (another --features/--hidden/--classes).
  absl::Status ParamsFromBytes(const std::string& bytes, const std::string& path,
                               std::vector<float>& params) const {
    if (bytes.size() != params.size() * sizeof(float)) {
      return absl::DataLossError(
          absl::StrCat("trainer checkpoint ", path, ": ", bytes.size(),
                       " model bytes, but this model (", config_.shape.features, "-",
                       config_.shape.hidden, "-", config_.shape.classes, ") has ", params.size(),
                       " parameters of 4 bytes: remove it, or run with the flags "
                       "it was saved with"));
    }
    std::memcpy(params.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  }

  // Whether the group resumes `job` from its checkpoints: every rank has one, at the same
  // position (the ranks step together, so their checkpoints are taken at the same steps); or
  // starts it afresh: no rank has one. Anything else (a rank killed between two ranks' saves,
  // a file removed on one rank only) is FAILED_PRECONDITION naming what the ranks have and what
  // to do, the same on every rank.
  absl::StatusOr<bool> GroupResumes(const std::string& job,
                                    const std::optional<ex::TrainerCheckpoint>& saved) {
    const bool has = saved.has_value();
    const double epoch = has ? static_cast<double>(saved->position.epoch) : -1.0;
    const double position = has ? static_cast<double>(saved->position.position) : -1.0;
    // Maxima, and minima as maxima of the negated values.
    std::vector<double> seen = {has ? 1.0 : 0.0, has ? -1.0 : 0.0, epoch,
                                -epoch,          position,         -position};
    RETURN_IF_ERROR(gpu_->AllReduceHost(seen, ncclMax));
    const bool all = -seen[1] == 1.0, none = seen[0] == 0.0;
    if (none) return false;
    if (all && seen[2] == -seen[3] && seen[4] == -seen[5]) return true;
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job, ": the ranks' checkpoints (", config_.checkpoint_dir, "/", job,
        ".rank-R.ckpt) are not all at one position: ",
        all ? absl::StrCat("epochs ", -seen[3], " to ", seen[2], ", positions ", -seen[5], " to ",
                           seen[4])
            : "some ranks have none",
        ". A data-parallel group resumes from one common step: remove this job's checkpoint "
        "files on every rank to train it afresh (rank 0 creates the job again)"));
  }

  // The model's recalls on the test set (waits for the device).
  absl::StatusOr<ClassRecalls> Evaluate() {
    const MlpShape& s = config_.shape;
    const cudaStream_t stream = gpu_->stream();
    const size_t n = test_.size();
    RETURN_IF_ERROR(
        CudaStatus(ex::Forward(s, params_.get(), x_test_.get(), n, hidden_.get(), stream),
                   "Forward kernel (test set)"));
    RETURN_IF_ERROR(
        CudaStatus(ex::Predict(s, params_.get(), hidden_.get(), n, predictions_.get(), stream),
                   "Predict kernel"));
    std::vector<uint32_t> predictions(n);
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(predictions.data(), predictions_.get(), n * sizeof(uint32_t),
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync(predictions)"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(evaluate)"));
    return BalancedAccuracy(predictions, test_.y, s.classes);
  }

  const TrainerConfig config_;
  GpuGroup* const gpu_;
  const std::shared_ptr<samplerd::SamplerClient> client_;
  const Dataset& train_;
  const Dataset& test_;
  StepEvents events_;
  uint64_t steps_taken_ = 0;  // Over the process's runs (TrainerConfig::crash_at_step).
  DeviceArray<float> x_, x_test_, params_, grads_, xb_, hidden_, dhidden_, losses_, dlogits_,
      step_loss_sums_;
  DeviceArray<uint32_t> y_, yb_, predictions_;
  DeviceArray<int64_t> indices_;
  DeviceArray<int> bad_index_;
};

void PrintTimes(const char* what, const StepTimes& t) {
  const double with_ms = Median(t.with_report_ms), without_ms = Median(t.without_report_ms);
  std::printf(
      "%s: median step %.4f ms with ReportFromDevice (%zu steps), %.4f ms without (%zu "
      "steps): %+.2f%%; host time to enqueue a step %.1f us with, %.1f us without\n",
      what, with_ms, t.with_report_ms.size(), without_ms, t.without_report_ms.size(),
      100.0 * (with_ms - without_ms) / without_ms, Median(t.with_report_host_us),
      Median(t.without_report_host_us));
}

// `*no_gpu` is set when the run failed for want of a usable GPU (the status says why).
absl::Status Main(const RankInfo& ranks, bool* no_gpu) {
  ex::DatasetSpec data_spec;
  data_spec.features = absl::GetFlag(FLAGS_features);
  data_spec.classes = absl::GetFlag(FLAGS_classes);
  data_spec.majority = absl::GetFlag(FLAGS_majority);
  data_spec.imbalance = absl::GetFlag(FLAGS_imbalance);
  data_spec.separation = absl::GetFlag(FLAGS_separation);
  data_spec.seed = absl::GetFlag(FLAGS_seed);
  ASSIGN_OR_RETURN(train_counts, ex::ImbalancedClassCounts(data_spec));
  ASSIGN_OR_RETURN(train, ex::MakeDataset(data_spec, train_counts, data_spec.seed + 1));
  const std::vector<uint64_t> test_counts(data_spec.classes, absl::GetFlag(FLAGS_test_per_class));
  ASSIGN_OR_RETURN(test, ex::MakeDataset(data_spec, test_counts, data_spec.seed + 2));

  TrainerConfig config;
  config.shape = {data_spec.features, absl::GetFlag(FLAGS_hidden), data_spec.classes};
  config.seed = absl::GetFlag(FLAGS_seed);
  config.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  config.address = absl::GetFlag(FLAGS_address);
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  config.crash_at_step = absl::GetFlag(FLAGS_crash_at_step);
  if (absl::GetFlag(FLAGS_hidden) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden must be >= 1, got ", absl::GetFlag(FLAGS_hidden)));
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size must be >= 1, got ", absl::GetFlag(FLAGS_batch_size)));
  }
  config.batch_size = static_cast<size_t>(absl::GetFlag(FLAGS_batch_size));
  uint64_t m = absl::GetFlag(FLAGS_samples_per_epoch);
  if (m == 0) m = train.size() / 4 / ranks.world_size * ranks.world_size;
  if (m < ranks.world_size || m > train.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--samples_per_epoch ", m, " must be in [",
                                                   ranks.world_size,
                                                   " (world size), N = ", train.size(), "]"));
  }
  config.samples_per_epoch = m;
  if (absl::GetFlag(FLAGS_epochs) < 1 || absl::GetFlag(FLAGS_timing_epochs) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--epochs (", absl::GetFlag(FLAGS_epochs),
                                                   ") must be >= 1 and --timing_epochs (",
                                                   absl::GetFlag(FLAGS_timing_epochs), ") >= 0"));
  }

  // Everything above is host-only; from here on a GPU is needed.
  if (absl::Status gpu = samplerd::GpuAvailable(); !gpu.ok()) {
    *no_gpu = true;
    return gpu;
  }
  ASSIGN_OR_RETURN(group, GpuGroup::Create(ranks, absl::GetFlag(FLAGS_nccl_id_file)));
  ASSIGN_OR_RETURN(client_unique, samplerd::SamplerClient::Create(config.address));
  std::shared_ptr<samplerd::SamplerClient> client = std::move(client_unique);
  ASSIGN_OR_RETURN(trainer, Trainer::Create(config, group.get(), client, train, test));
  // This rank's shard length in the jobs' layout (the server's default, PAD: every shard has
  // ceil(M / R) indices), by the one rule of kernels/plan_math.h.
  samplerd::ShardSpec layout;
  layout.world_size = ranks.world_size;
  layout.uneven = samplerd::UnevenMode::kPad;
  const uint64_t shard = samplerd::plan_math::ShardLength(m, layout, ranks.rank);
  RETURN_IF_ERROR(trainer->Reserve((shard + config.batch_size - 1) / config.batch_size));

  if (ranks.rank == 0) {
    std::string counts;
    for (uint64_t c : train.class_counts) absl::StrAppend(&counts, counts.empty() ? "" : ":", c);
    std::printf(
        "ddp_trainer: %u rank(s); training set N = %llu (classes %s), test set %llu "
        "(balanced); MLP %d-%d-%d, SGD lr %g\n",
        ranks.world_size, static_cast<unsigned long long>(train.size()), counts.c_str(),
        static_cast<unsigned long long>(test.size()), config.shape.features, config.shape.hidden,
        config.shape.classes, config.lr);
  }
  const std::string prefix = absl::GetFlag(FLAGS_job_prefix);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  ASSIGN_OR_RETURN(balanced, trainer->Run({"class-balanced x loss (ReportFromDevice every step)",
                                           prefix + "-balanced-loss", true, ReportMode::kEveryStep,
                                           epochs, true}));
  ASSIGN_OR_RETURN(uniform,
                   trainer->Run({"uniform (no loss policy, nothing reported)", prefix + "-uniform",
                                 false, ReportMode::kNever, epochs, true}));
  RunResult timing;
  if (absl::GetFlag(FLAGS_timing_epochs) > 0) {
    ASSIGN_OR_RETURN(
        t, trainer->Run({"reporter cost", prefix + "-timing", true, ReportMode::kAlternate,
                         absl::GetFlag(FLAGS_timing_epochs), false}));
    timing = std::move(t);
  }
  if (ranks.rank == 0) {
    std::printf("\n== comparison after %d epochs of M = %llu\n", epochs,
                static_cast<unsigned long long>(m));
    std::printf("balanced accuracy: class-balanced x loss %.4f, uniform %.4f\n",
                balanced.final_balanced_accuracy, uniform.final_balanced_accuracy);
    if (absl::GetFlag(FLAGS_timing_epochs) > 1) {
      PrintTimes("reporter cost (alternating steps, one run)", timing.times);
    }
    StepTimes across;
    across.with_report_ms = balanced.times.with_report_ms;
    across.with_report_host_us = balanced.times.with_report_host_us;
    across.without_report_ms = uniform.times.without_report_ms;
    across.without_report_host_us = uniform.times.without_report_host_us;
    if (epochs > 1) PrintTimes("reporter cost (balanced x loss run vs uniform run)", across);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // LossReporter's header: Debian's Abseil checks every absl::Mutex for deadlocks, which costs
  // every lock a process-wide spinlock; a trainer does not need it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ex::RankFlags flags;
  flags.rank = absl::GetFlag(FLAGS_rank);
  flags.world_size = absl::GetFlag(FLAGS_world_size);
  flags.local_rank = absl::GetFlag(FLAGS_local_rank);
  const absl::StatusOr<RankInfo> ranks = ex::ResolveRankInfo(flags, ex::GetEnv);
  if (!ranks.ok()) {
    std::fprintf(stderr, "ddp_trainer: %s\n", ranks.status().ToString().c_str());
    return 1;
  }
  bool no_gpu = false;
  const absl::Status status = Main(*ranks, &no_gpu);
  if (status.ok()) return 0;
  if (no_gpu) {
    std::fprintf(stderr, "ddp_trainer (rank %u): no usable GPU: %s\n", ranks->rank,
                 std::string(status.message()).c_str());
    return 2;
  }
  std::fprintf(stderr, "ddp_trainer (rank %u): %s\n", ranks->rank, status.ToString().c_str());
  return 1;
}
