// RankClaim: this process's claim of a data-parallel rank of a job (proto ClaimRank, "Rank
// claims" in proto/samplerd.proto), held from Create until destruction (RAII).
//
// While it is held, the server refuses another live process that claims the same rank
// (FAILED_PRECONDITION naming the job, the rank and the holder), unless both declare themselves
// peers (tensor/pipeline/context-parallel peers of one data-parallel rank: `peer`). The claim
// lives as long as one open ClaimRank call, made with gRPC's callback API: no thread. It ends when
// the RankClaim is destroyed (the call is cancelled; the rank is free at once), when the process
// dies (its connection closes), or when the server shuts down or the job is deleted.
//
// A trainer hands the claim (a ClaimSource) to every call of its rank: ShardReaderOptions::claim,
// LossReporterOptions::claim, SamplerClient::EndEpoch (EpochLoop does all three itself). If the
// call broke (a server restart, a lost connection), Incarnation() claims again, naming the old
// incarnation as replaced (ClaimRankRequest.replaces), within the client's retries.
//
// Thread-safe: the reader's prefetch thread, the reporter's sender and the training thread use
// one claim.
#ifndef SAMPLERD_CLIENT_CPP_RANK_CLAIM_H_
#define SAMPLERD_CLIENT_CPP_RANK_CLAIM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/sampler_client.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

class RankClaim final : public ClaimSource {
 public:
  // Claims `rank` of `job` (world_size must be the job's current one) and returns once the
  // server answered: FAILED_PRECONDITION if another live process holds the rank (or a world
  // size mismatch), INVALID_ARGUMENT (rank >= world_size, an empty job), NOT_FOUND, or the
  // transport's error after the client's retries. The client is kept alive by the claim.
  static absl::StatusOr<std::unique_ptr<RankClaim>> Create(std::shared_ptr<SamplerClient> client,
                                                           const std::string& job, uint32_t rank,
                                                           uint32_t world_size, bool peer = false);
  // Cancels the claim's call (the rank is free at once) and waits for it to end.
  ~RankClaim() override;
  RankClaim(const RankClaim&) = delete;
  RankClaim& operator=(const RankClaim&) = delete;

  absl::StatusOr<uint64_t> Incarnation() override ABSL_LOCKS_EXCLUDED(mu_);
  void Renew(uint64_t stale) override ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& job() const { return request_.job(); }
  uint32_t rank() const { return request_.rank(); }
  bool peer() const { return request_.peer(); }

 private:
  class Call;

  RankClaim(std::shared_ptr<SamplerClient> client, v1::ClaimRankRequest request);
  // Opens a new call (retried as any call) and waits for its RankClaim.
  absl::Status ClaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<SamplerClient> client_;
  const v1::ClaimRankRequest request_;  // Without `replaces` (set per call).
  absl::Mutex mu_;
  std::shared_ptr<Call> call_ ABSL_GUARDED_BY(mu_);  // The open call; null: none.
  // Of call_, or of the last claim held (this process's last released one at first).
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_RANK_CLAIM_H_
