#include "kernels/backend_checks.h"

#include "absl/strings/str_cat.h"
#include "kernels/exact_sum.h"
#include "kernels/loss_policies.h"

namespace samplerd {

absl::Status ForeignObject(absl::string_view field, absl::string_view backend) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": made by another backend; the ", backend,
                                                 " backend takes only the objects it made"));
}

absl::Status CheckNewLossStats(uint64_t num_samples, double ema_decay) {
  if (num_samples == 0) return absl::InvalidArgumentError("num_samples = 0: must be >= 1");
  // The recompute's means are exact sums (exact_sum.h), defined up to 2^40 terms: refused here,
  // before 8 bytes per sample are allocated, rather than at the first epoch boundary.
  if (num_samples > exact_sum::kMaxTerms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_samples = ", num_samples, ": a loss policy supports at most 2^40 samples"));
  }
  if (!(ema_decay >= 0 && ema_decay < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ema_decay = ", ema_decay, " is outside [0, 1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckRecomputeInputs(const WeightPolicyParams& policy,
                                              const BackendWeights* base,
                                              const BackendWeights* current,
                                              const BackendLossStats* stats,
                                              absl::Span<const float> irreducible) {
  if (absl::Status s = ValidatePolicy(policy); !s.ok()) return s;
  const char* first = nullptr;
  uint64_t n = 0;
  struct Input {
    const char* field;
    bool given;
    uint64_t size;
  };
  for (const Input& in : {Input{"base", base != nullptr, base ? base->size() : 0},
                          Input{"current", current != nullptr, current ? current->size() : 0},
                          Input{"stats", stats != nullptr, stats ? stats->size() : 0}}) {
    if (!in.given) continue;
    if (first == nullptr) {
      first = in.field;
      n = in.size;
    } else if (in.size != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(in.field, ": ", in.size, " values, but ", first, " has ", n));
    }
  }
  if (UsesLossStats(policy) && stats == nullptr) {
    return absl::InvalidArgumentError(
        "stats: missing; a loss policy (policy.loss) needs the loss statistics");
  }
  if (absl::Status s = CheckGroupBase(policy, base != nullptr); !s.ok()) return s;
  if (absl::Status s = CheckIrreducible(policy, n, irreducible); !s.ok()) return s;
  return n;
}

absl::Status CheckIrreducible(const WeightPolicyParams& policy, uint64_t n,
                              absl::Span<const float> irreducible) {
  if (!UsesIrreducibleLosses(policy)) return absl::OkStatus();
  if (irreducible.empty()) {
    return absl::InvalidArgumentError(
        "irreducible_losses: missing; policy.loss = REDUCIBLE_LOSS needs them");
  }
  if (irreducible.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "irreducible_losses: ", irreducible.size(), " values for num_samples ", n));
  }
  return absl::OkStatus();
}

absl::Status CheckGroupBase(const WeightPolicyParams& policy, bool has_base) {
  if (!policy.loss_within_groups || has_base) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "base: missing; policy.loss_within_groups needs base weights (the groups are the samples "
      "of equal base weight)");
}

absl::Status CheckApplyArguments(uint64_t num_samples, absl::Span<const uint64_t> indices,
                                 absl::Span<const float> losses) {
  if (indices.size() != losses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("losses: ", losses.size(), " values for ", indices.size(), " indices"));
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k] >= num_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", k, "] = ", indices[k], " is outside [0, num_samples = ", num_samples, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckImportanceArguments(uint64_t num_samples, absl::Span<const uint64_t> indices,
                                      absl::Span<const float> out) {
  if (indices.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: ", out.size(), " values for ", indices.size(), " indices"));
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k] >= num_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", k, "] = ", indices[k], " is outside [0, num_samples = ", num_samples, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace samplerd
