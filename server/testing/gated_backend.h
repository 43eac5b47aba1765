// A ComputeBackend for server tests that can stop a plan half-way.
#ifndef SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_
#define SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/compute_backend.h"

namespace samplerd {
namespace testutil {

// The CPU backend, except that PlanEpoch can be held: Hold() makes the next PlanEpoch call wait
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
  absl::Status RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                absl::Span<const float> base, absl::Span<const float> current,
                                LossStatsView stats, absl::Span<float> out) override {
    return inner_->RecomputeWeights(policy, closed_epoch, base, current, stats, out);
  }
  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 absl::Span<const float> weights) override {
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

 private:
  ComputeBackend* const inner_;
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_
