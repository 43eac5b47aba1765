// A ComputeBackend for server tests that can stop a plan half-way.
#ifndef SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_
#define SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/compute_backend.h"

namespace samplerd {
namespace testutil {

// The CPU backend (any inner backend: every call is forwarded to it, so the objects it makes go
// back to it), except that PlanEpoch can be held: Hold() makes the next PlanEpoch call wait
// until Release(), so a test can act while a plan is being computed.
class GatedBackend : public ComputeBackend {
 public:
  explicit GatedBackend(ComputeBackend* inner) : inner_(inner) {}

  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  // Waits until a PlanEpoch call is held.
  void AwaitHeldCall() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&waiting_));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }

  std::string name() const override { return inner_->name(); }
  absl::StatusOr<std::shared_ptr<const BackendWeights>> MakeWeights(
      std::vector<float> weights) override {
    return inner_->MakeWeights(std::move(weights));
  }
  absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                 double ema_decay) override {
    return inner_->NewLossStats(num_samples, ema_decay);
  }
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats) override {
    return inner_->RecomputeWeights(policy, closed_epoch, base, current, stats);
  }
  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 const BackendWeights* weights) override {
    {
      absl::MutexLock lock(&mu_);
      if (held_) {
        waiting_ = true;
        auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
        mu_.Await(absl::Condition(&released));
        waiting_ = false;
      }
    }
    return inner_->PlanEpoch(spec, epoch, weights);
  }
  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override {
    return inner_->PlanScratchBytes(spec, weighted);
  }
  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override {
    return inner_->ExtractShard(plan, shard, rank, start, out);
  }
  absl::Status ImportanceWeights(const BackendWeights& weights, absl::Span<const uint64_t> indices,
                                 absl::Span<float> out) override {
    return inner_->ImportanceWeights(weights, indices, out);
  }

 private:
  ComputeBackend* const inner_;
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_
