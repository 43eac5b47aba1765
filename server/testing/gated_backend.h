// A ComputeBackend for server tests that can stop a plan, or a copy of recomputed weights to the
// host, half-way.
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

// Where a test holds a backend call: after Hold(), the next call that passes the gate waits
// until Release(); AwaitHeldCall() waits until one does.
class Gate {
 public:
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void AwaitHeldCall() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&waiting_));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  // Called by the gated call: returns at once unless held.
  void Pass() {
    absl::MutexLock lock(&mu_);
    if (!held_) return;
    waiting_ = true;
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
    mu_.Await(absl::Condition(&released));
    waiting_ = false;
  }

 private:
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
};

// The CPU backend (any inner backend: every call is forwarded to it, so the objects it makes go
// back to it), except that two kinds of calls pass a Gate:
//   - PlanEpoch and PlanMixtureWindow: Hold() / AwaitHeldCall() / Release(), so a test can act
//     while a plan (or a mixture job's window) is being computed;
//   - ToHost of the weights RecomputeWeights made (to_host()), so a test can act while an epoch
//     boundary copies them for its snapshot. Those weights are wrapped; every call unwraps them
//     before forwarding.
class GatedBackend : public ComputeBackend {
 public:
  explicit GatedBackend(ComputeBackend* inner) : inner_(inner) {}

  void Hold() { plans_.Hold(); }
  void AwaitHeldCall() { plans_.AwaitHeldCall(); }
  void Release() { plans_.Release(); }
  Gate& to_host() { return to_host_; }

  std::string name() const override { return inner_->name(); }
  absl::StatusOr<std::shared_ptr<const BackendWeights>> MakeWeights(
      std::vector<float> weights) override {
    return inner_->MakeWeights(std::move(weights));
  }
  absl::StatusOr<std::unique_ptr<BackendLossStats>> NewLossStats(uint64_t num_samples,
                                                                 double ema_decay) override {
    return inner_->NewLossStats(num_samples, ema_decay);
  }
  using ComputeBackend::RecomputeWeights;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> RecomputeWeights(
      const WeightPolicyParams& policy, uint64_t closed_epoch, const BackendWeights* base,
      const BackendWeights* current, const BackendLossStats* stats,
      absl::Span<const float> irreducible) override {
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made = inner_->RecomputeWeights(
        policy, closed_epoch, Inner(base), Inner(current), stats, irreducible);
    if (!made.ok() || *made == nullptr) return made;
    return std::make_shared<const GatedWeights>(*std::move(made), &to_host_);
  }
  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 const BackendWeights* weights) override {
    plans_.Pass();
    return inner_->PlanEpoch(spec, epoch, Inner(weights));
  }
  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override {
    return inner_->PlanScratchBytes(spec, weighted);
  }
  absl::StatusOr<std::vector<mixture::GroupCursor>> PlanMixtureWindow(
      uint64_t seed, uint64_t epoch, const mixture::GroupLayout& layout,
      absl::Span<const mixture::GroupCursor> cursors, absl::Span<const uint64_t> counts,
      absl::Span<uint64_t> out) override {
    plans_.Pass();
    return inner_->PlanMixtureWindow(seed, epoch, layout, cursors, counts, out);
  }
  uint64_t MixtureWindowScratchBytes(uint64_t groups, uint64_t window) const override {
    return inner_->MixtureWindowScratchBytes(groups, window);
  }
  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override {
    return inner_->ExtractShard(plan, shard, rank, start, out);
  }
  absl::Status ImportanceWeights(const BackendWeights& weights, absl::Span<const uint64_t> indices,
                                 absl::Span<float> out) override {
    return inner_->ImportanceWeights(*Inner(&weights), indices, out);
  }

 private:
  // Recomputed weights: the inner backend's, whose ToHost passes the gate first.
  class GatedWeights final : public BackendWeights {
   public:
    GatedWeights(std::shared_ptr<const BackendWeights> inner, Gate* gate)
        : inner_(std::move(inner)), gate_(gate) {}
    uint64_t size() const override { return inner_->size(); }
    const WeightSummary& summary() const override { return inner_->summary(); }
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> ToHost() const override {
      gate_->Pass();
      return inner_->ToHost();
    }
    const BackendWeights* inner() const { return inner_.get(); }

   private:
    const std::shared_ptr<const BackendWeights> inner_;
    Gate* const gate_;
  };

  // The inner backend's weights behind `weights` (null stays null).
  static const BackendWeights* Inner(const BackendWeights* weights) {
    const auto* gated = dynamic_cast<const GatedWeights*>(weights);
    return gated != nullptr ? gated->inner() : weights;
  }

  ComputeBackend* const inner_;
  Gate plans_;
  Gate to_host_;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_GATED_BACKEND_H_
