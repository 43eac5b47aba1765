#include "server/service_calls.h"

#include <chrono>
#include <utility>

namespace samplerd {

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

void ServiceCalls::Begin(SamplerMethod) {
  absl::MutexLock lock(&mu_);
  ++in_flight_;
}

void ServiceCalls::End(SamplerMethod) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

int64_t ServiceCalls::InFlight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

bool ServiceCalls::AwaitNone(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void ServiceCalls::Schedule(SamplerMethod method, std::function<void()> work) {
  ++waiting_[method];
  pool_.Schedule([this, method, work = std::move(work)] {
    --waiting_[method];
    work();
  });
}

void ServiceCalls::ShardStreamWriting(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&mu_);
  shard_streams_.insert(context);
  if (shard_streams_ended_) context->TryCancel();
}

void ServiceCalls::ShardStreamDone(grpc::ServerContextBase* context) {
  absl::MutexLock lock(&mu_);
  shard_streams_.erase(context);
}

void ServiceCalls::EndShardStreams() {
  absl::MutexLock lock(&mu_);
  shard_streams_ended_ = true;
  // Under mu_: a context stays registered, so alive, until its call is done.
  for (grpc::ServerContextBase* context : shard_streams_) context->TryCancel();
}

}  // namespace samplerd
