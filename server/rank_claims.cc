#include "server/rank_claims.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

// "42 s" (whole seconds; "0 s" for a claim just made).
std::string Ago(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Seconds(std::max(d, absl::ZeroDuration())), " s");
}

}  // namespace

RankClaims::RankClaims(std::string job, uint64_t first_incarnation, std::function<absl::Time()> now)
    : job_(std::move(job)),
      now_(std::move(now)),
      next_incarnation_(std::max<uint64_t>(first_incarnation, 1)) {}

std::string RankClaims::RankOf(uint32_t rank) const {
  return absl::StrCat("rank ", rank, " of job '", job_, "'");
}

std::string RankClaims::Describe(const Holders& holders) const {
  const auto& [incarnation, holder] = *holders.by_incarnation.begin();  // The oldest.
  std::string s =
      absl::StrCat("incarnation ", incarnation, ", claimed ", Ago(now_() - holder.since), " ago");
  if (holders.peer) {
    absl::StrAppend(&s, ", as a peer; ", holders.by_incarnation.size(), " peer claim",
                    holders.by_incarnation.size() == 1 ? "" : "s", " held");
  }
  return s;
}

absl::StatusOr<uint64_t> RankClaims::Claim(uint32_t rank, bool peer, Ended ended,
                                           uint64_t replaces) {
  Ended replaced;  // Destroyed after the lock is released.
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  Holders& holders = held_[rank];
  if (auto old = holders.by_incarnation.find(replaces);
      replaces != 0 && old != holders.by_incarnation.end()) {
    replaced = std::move(old->second.ended);
    holders.by_incarnation.erase(old);
    --open_;
    last_ended_[rank] = LastEnded{replaces, now_()};
  }
  if (!holders.by_incarnation.empty() && !(holders.peer && peer)) {
    const std::string what =
        holders.peer
            ? absl::StrCat(
                  "peers (tensor/pipeline-parallel) of the data-parallel rank "
                  "hold ",
                  RankOf(rank), " (", Describe(holders),
                  ") and this claim is not a peer's; claim with peer=True "
                  "(samplerd.torch: shared_rank=True) like them, or stop them")
            : absl::StrCat("another live process holds ", RankOf(rank), " (", Describe(holders),
                           "); stop it, or, for tensor/pipeline peers of one data-parallel "
                           "rank, claim with peer=True (samplerd.torch: shared_rank=True) in "
                           "every peer");
    return absl::FailedPreconditionError(what);
  }
  const uint64_t incarnation = next_incarnation_++;
  holders.peer = peer;
  holders.by_incarnation.emplace(incarnation, Holder{now_(), std::move(ended)});
  ++open_;
  return incarnation;
}

void RankClaims::Release(uint32_t rank, uint64_t incarnation) {
  Ended dropped;  // Destroyed after the lock is released (it may own the caller's state).
  absl::MutexLock lock(&mu_);
  auto it = held_.find(rank);
  if (it == held_.end()) return;
  auto holder = it->second.by_incarnation.find(incarnation);
  if (holder == it->second.by_incarnation.end()) return;
  dropped = std::move(holder->second.ended);
  it->second.by_incarnation.erase(holder);
  if (it->second.by_incarnation.empty()) held_.erase(it);
  --open_;
  last_ended_[rank] = LastEnded{incarnation, now_()};
}

absl::Status RankClaims::Check(uint32_t rank, uint64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(rank);
  if (incarnation == 0) {
    if (it == held_.end()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "another live process holds ", RankOf(rank), " (", Describe(it->second),
        ") and this request carries no incarnation: a second process is reading this rank. "
        "Stop one of them, or claim the rank (ClaimRank) in every process that reads it, with "
        "peer=True (samplerd.torch: shared_rank=True) for tensor/pipeline peers of one "
        "data-parallel rank"));
  }
  if (it != held_.end() && it->second.by_incarnation.count(incarnation) != 0) {
    return absl::OkStatus();
  }
  auto ended = last_ended_.find(rank);
  const std::string why =
      !closed_.ok() ? absl::StrCat("the job was closed: ", closed_.message())
      : ended != last_ended_.end() && ended->second.incarnation == incarnation
          ? absl::StrCat("its ClaimRank call ended ", Ago(now_() - ended->second.at),
                         " ago: the client closed it or its connection broke")
          : "it is not a live claim of this rank: its ClaimRank call ended, or it was issued "
            "before the server restarted";
  return absl::AbortedError(absl::StrCat("incarnation ", incarnation, " no longer holds ",
                                         RankOf(rank), " (", why, "); claim the rank again"));
}

void RankClaims::Close(const absl::Status& reason) {
  std::vector<Ended> ended;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return;
    closed_ = reason;
    for (auto& [rank, holders] : held_) {
      for (auto& [incarnation, holder] : holders.by_incarnation) {
        if (holder.ended) ended.push_back(std::move(holder.ended));
      }
    }
    held_.clear();
    open_ = 0;
  }
  for (Ended& e : ended) e(reason);
}

int64_t RankClaims::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace samplerd
