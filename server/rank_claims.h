// RankClaims: which live processes hold which data-parallel ranks of one job (proto
// ClaimRank, "Rank claims" in proto/samplerd.proto). The rule:
//
//   - A rank is free, held by one claimant (not a peer), or held by any number of peers
//     (tensor/pipeline/context-parallel peers of one data-parallel rank, declared). Claim
//     refuses a claimant that does not fit the live holders: any second claimant of a rank held
//     by a non-peer, a non-peer of a rank held by peers (FAILED_PRECONDITION naming the job, the
//     rank, a holder's incarnation, how long it has held it, and what to do).
//   - A claim lives exactly as long as its holder's ClaimRank call: the service calls Release
//     when the call ends, whichever way. There is no timer: liveness is the open connection.
//   - Check, for a request of the rank: an incarnation != 0 must be a live claim of that rank
//     (ABORTED otherwise: the claim ended, claim again); incarnation 0 (a caller that does not
//     claim) is accepted only while nobody holds the rank (FAILED_PRECONDITION otherwise).
//   - Incarnations are > 0 and increase per job from `first_incarnation` (the job passes the
//     clock in microseconds at its start-up, so that one issued before a server restart is not
//     issued again after it).
//   - In memory only: nothing is persisted (after a restart every client claims again).
//   - Close ends every claim (job deleted: NOT_FOUND; shutting down: UNAVAILABLE): each
//     holder's `ended` callback runs once, with the reason, and later claims are refused with it.
//
// Thread-safe. Callbacks run without the lock held, on the thread that called Close.
#ifndef SAMPLERD_SERVER_RANK_CLAIMS_H_
#define SAMPLERD_SERVER_RANK_CLAIMS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace samplerd {

class RankClaims {
 public:
  // Called once if the claim is ended by Close (not by Release), without the lock.
  using Ended = std::function<void(const absl::Status& reason)>;

  // `job` names the job in messages; `now` is the clock (tests pass their own).
  RankClaims(
      std::string job, uint64_t first_incarnation,
      std::function<absl::Time()> now = [] { return absl::Now(); });

  RankClaims(const RankClaims&) = delete;
  RankClaims& operator=(const RankClaims&) = delete;

  // Claims `rank` (range-checked by the caller); returns the claim's incarnation. `ended` may
  // be null. `replaces`: the caller's previous claim of the rank (0: none); if it still holds
  // the rank it is released first (its `ended` is not run: its call ends on its own), so that a
  // client whose connection broke silently can claim again before the server notices.
  // Errors: FAILED_PRECONDITION (held by an incompatible live claimant), the close reason once
  // closed.
  absl::StatusOr<uint64_t> Claim(uint32_t rank, bool peer, Ended ended, uint64_t replaces = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The claim `incarnation` of `rank` ended (its call ended). A no-op if it is not held (ended
  // already, or closed).
  void Release(uint32_t rank, uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a request of `rank` carrying `incarnation` may proceed (see the rule above).
  absl::Status Check(uint32_t rank, uint64_t incarnation) const ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every claim with `reason` (not OK) and refuses later ones with it.
  void Close(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Claims held now (a metric).
  int64_t open() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Holder {
    absl::Time since;
    Ended ended;
  };
  // The live holders of one rank: one non-peer, or peers.
  struct Holders {
    bool peer = false;
    std::map<uint64_t, Holder> by_incarnation;
  };
  // The last claim of a rank that ended, for Check's message.
  struct LastEnded {
    uint64_t incarnation = 0;
    absl::Time at;
  };

  // "incarnation 7, claimed 42 s ago" of the longest-held holder.
  std::string Describe(const Holders& holders) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "rank 1 of job 'j'".
  std::string RankOf(uint32_t rank) const;

  const std::string job_;
  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, Holders> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, LastEnded> last_ended_ ABSL_GUARDED_BY(mu_);
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // OK while open.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_RANK_CLAIMS_H_
