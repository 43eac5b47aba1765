#include "kernels/mixture/apportion.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace mixture {
namespace {

using uint128 = unsigned __int128;

constexpr int kQuantBits = 95;  // q_k < 2^(kQuantBits - BitWidth(K)): Q < 2^96.

uint64_t BitsOf(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// floor(w 2^s) for a finite w >= 0, exactly, from its bits (the result is below 2^96 here).
uint128 ScaledFloor(double w, int s) {
  const uint64_t bits = BitsOf(w) & ~(uint64_t{1} << 63);
  const int biased = static_cast<int>(bits >> 52);
  const uint64_t significand =
      (bits & ((uint64_t{1} << 52) - 1)) | (biased > 0 ? uint64_t{1} << 52 : 0);
  const int shift = std::max(1, biased) - 1075 + s;  // w 2^s = significand 2^shift.
  if (shift >= 0) return uint128{significand} << shift;
  return -shift >= 64 ? 0 : uint128{significand >> -shift};
}

// floor(q 2^63 / total) and its remainder, for q <= total < 2^96, in two 128-bit divisions.
std::pair<uint64_t, uint128> ShareOf(uint128 q, uint128 total) {
  const uint128 high = q << 31;  // < 2^127.
  const uint128 t1 = high / total, r1 = high % total;
  const uint128 low = r1 << 32;  // r1 < 2^96.
  const uint128 t2 = low / total, r2 = low % total;
  return {static_cast<uint64_t>((t1 << 32) + t2), r2};
}

std::string Int128ToString(int128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  uint128 u = negative ? -static_cast<uint128>(v) : static_cast<uint128>(v);
  std::string digits;
  while (u > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> SharesOf(absl::Span<const double> weights) {
  const uint64_t k_groups = weights.size();
  if (k_groups == 0 || k_groups > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: ", k_groups, " group weights; a mixture has 1 to ", kMaxGroups, " groups"));
  }
  double w_max = 0;
  for (uint64_t k = 0; k < k_groups; ++k) {
    const double w = weights[k];
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights[", k, "] = ", w, ": a group weight must be finite and >= 0"));
    }
    w_max = std::max(w_max, w);
  }
  if (!(w_max > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: all ", k_groups, " group weights are 0; at least one must be positive"));
  }
  // E: w_max < 2^E. A normal w_max of biased exponent be is below 2^(be - 1022); a subnormal one
  // below 2^-1022.
  const int biased = static_cast<int>((BitsOf(w_max) >> 52) & 0x7ff);
  const int e_max = std::max(1, biased) - 1022;
  const int s = kQuantBits - plan_math::BitWidth(k_groups) - e_max;
  std::vector<uint128> q(k_groups);
  uint128 total = 0;
  for (uint64_t k = 0; k < k_groups; ++k) {
    q[k] = ScaledFloor(weights[k], s);
    if (q[k] == 0 && weights[k] > 0) q[k] = 1;
    total += q[k];
  }
  std::vector<uint64_t> shares(k_groups);
  std::vector<uint128> remainders(k_groups);
  uint64_t assigned = 0;
  for (uint64_t k = 0; k < k_groups; ++k) {
    const auto [share, remainder] = ShareOf(q[k], total);
    shares[k] = share;
    remainders[k] = remainder;
    assigned += share;  // <= 2^63: the floors add up to at most D.
  }
  const uint64_t left = kShareUnit - assigned;  // < K (each floor loses less than 1).
  if (left > 0) {
    std::vector<uint32_t> order(k_groups);
    std::iota(order.begin(), order.end(), 0);
    const auto larger = [&](uint32_t a, uint32_t b) {
      return remainders[a] != remainders[b] ? remainders[a] > remainders[b] : a < b;
    };
    std::nth_element(order.begin(), order.begin() + (left - 1), order.end(), larger);
    for (uint64_t i = 0; i < left; ++i) ++shares[order[i]];
  }
  return shares;
}

absl::StatusOr<Apportioner> Apportioner::Create(uint64_t groups) {
  if (groups == 0 || groups > kMaxGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups: ", groups, "; a mixture has 1 to ", kMaxGroups, " groups"));
  }
  return Apportioner(std::vector<int128>(groups, 0));
}

absl::StatusOr<Apportioner> Apportioner::FromLags(std::vector<int128> lags) {
  const uint64_t k_groups = lags.size();
  if (k_groups == 0 || k_groups > kMaxGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("lags: ", k_groups, " groups; a mixture has 1 to ", kMaxGroups, " groups"));
  }
  const int128 unit = static_cast<int128>(kShareUnit);
  const int128 upper = static_cast<int128>(k_groups - 1) * unit;
  int128 sum = 0;
  for (uint64_t k = 0; k < k_groups; ++k) {
    if (lags[k] <= -unit || (k_groups > 1 && lags[k] >= upper) || (k_groups == 1 && lags[k] != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lags[", k, "] = ", Int128ToString(lags[k]), ": outside (-2^63, (K - 1) 2^63) for K = ",
          k_groups, " groups (a corrupt apportionment state)"));
    }
    sum += lags[k];
  }
  if (sum != 0) {
    return absl::InvalidArgumentError(absl::StrCat("lags: they add up to ", Int128ToString(sum),
                                                   ", not 0 (a corrupt apportionment state)"));
  }
  return Apportioner(std::move(lags));
}

absl::StatusOr<WindowCounts> Apportioner::Next(absl::Span<const uint64_t> shares,
                                               uint64_t window_size) {
  const uint64_t k_groups = lags_.size();
  if (shares.size() != k_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("shares: ", shares.size(), " shares for a mixture of ", k_groups, " groups"));
  }
  if (window_size > kShareUnit) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_size: ", window_size, "; at most 2^63 samples per window"));
  }
  uint128 share_sum = 0;
  for (uint64_t p : shares) share_sum += p;
  if (share_sum != kShareUnit) {
    return absl::InvalidArgumentError(absl::StrCat("shares: they add up to ",
                                                   Int128ToString(static_cast<int128>(share_sum)),
                                                   ", not 2^63 (shares come from SharesOf)"));
  }
  const int128 unit = static_cast<int128>(kShareUnit);
  std::vector<int128> next(k_groups);  // a_k, then the new lags.
  WindowCounts result;
  result.counts.assign(k_groups, 0);
  uint64_t base_sum = 0;  // S: at most M + K.
  for (uint64_t k = 0; k < k_groups; ++k) {
    const int128 a = lags_[k] + static_cast<int128>(window_size) * shares[k];
    const uint64_t base = a >= 0 ? static_cast<uint64_t>(a >> kShareBits) : 0;
    result.counts[k] = base;
    next[k] = a - static_cast<int128>(base) * unit;  // rem_k.
    base_sum += base;
  }
  std::vector<uint32_t> order(k_groups);
  std::iota(order.begin(), order.end(), 0);
  if (base_sum <= window_size) {
    const uint64_t extra = window_size - base_sum;  // < K: the remainders add up to extra D.
    if (extra > 0) {
      const auto larger = [&](uint32_t a, uint32_t b) {
        return next[a] != next[b] ? next[a] > next[b] : a < b;
      };
      std::nth_element(order.begin(), order.begin() + (extra - 1), order.end(), larger);
      for (uint64_t i = 0; i < extra; ++i) {
        ++result.counts[order[i]];
        next[order[i]] -= unit;
      }
    }
  } else {
    // Take back S - M units, one at a time from the group of count >= 1 with the smallest
    // rem_k (ties: the higher number). A unit taken raises that group's rem by D, so the order
    // among the groups is kept within one round over them: round after round over the sorted
    // candidates, each group losing at most one unit per round.
    uint64_t to_take = base_sum - window_size;
    order.erase(std::remove_if(order.begin(), order.end(),
                               [&](uint32_t k) { return result.counts[k] == 0; }),
                order.end());
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return next[a] != next[b] ? next[a] < next[b] : a > b;
    });
    result.taken_back = to_take;
    while (to_take > 0) {
      bool took = false;
      for (uint32_t k : order) {
        if (to_take == 0) break;
        if (result.counts[k] == 0) continue;
        --result.counts[k];
        next[k] += unit;
        --to_take;
        took = true;
      }
      if (!took) break;  // Unreachable: sum of counts = S > M >= 0 while to_take > 0.
    }
  }
  lags_ = std::move(next);
  return result;
}

}  // namespace mixture
}  // namespace samplerd
