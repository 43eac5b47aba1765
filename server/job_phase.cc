// JobPhase: the job's state diagram (job_phase.h) as one function.
#include "server/job_phase.h"

#include <utility>

namespace samplerd {

using phase::AwaitingUpload;
using phase::Closed;
using phase::Failed;
using phase::Planning;
using phase::Serving;

namespace {

// Whether `to` is the kind of phase a failed `planning` goes back to.
bool GoesBack(const Planning& planning, const JobPhase& to) {
  if (!planning.previous.has_value()) return false;
  return std::visit(
      [&](const auto& previous) {
        using Previous = std::decay_t<decltype(previous)>;
        return std::holds_alternative<Previous>(to);
      },
      *planning.previous);
}

}  // namespace

bool MayTransition(const JobPhase& from, const JobPhase& to) {
  if (std::holds_alternative<Closed>(from)) return false;  // Terminal.
  if (std::holds_alternative<Closed>(to)) return true;     // Close, from any other phase.
  using Purpose = Planning::Purpose;
  const Planning* next_planning = std::get_if<Planning>(&to);
  if (std::holds_alternative<AwaitingUpload>(from)) {
    return next_planning != nullptr && (next_planning->purpose == Purpose::kUpload ||
                                        next_planning->purpose == Purpose::kRecovery);
  }
  if (const auto* planning = std::get_if<Planning>(&from)) {
    return std::holds_alternative<Serving>(to) || std::holds_alternative<Failed>(to) ||
           GoesBack(*planning, to);
  }
  if (std::holds_alternative<Serving>(from)) {
    // A resize with nothing done deals the same plan again (Serving to Serving).
    if (std::holds_alternative<Serving>(to) || std::holds_alternative<Failed>(to)) return true;
    return next_planning != nullptr && next_planning->purpose != Purpose::kRecovery;
  }
  // Failed: only a rewind leaves it (and the first failure's cause stays otherwise).
  return next_planning != nullptr && next_planning->purpose == Purpose::kRewind;
}

JobPhase FromSettled(phase::Settled settled) {
  return std::visit([](auto&& phase) -> JobPhase { return std::move(phase); }, std::move(settled));
}

const char* PhaseName(const JobPhase& phase) {
  if (const auto* planning = std::get_if<Planning>(&phase)) {
    switch (planning->purpose) {
      case Planning::Purpose::kNextEpoch:
        return "Planning(next epoch)";
      case Planning::Purpose::kUpload:
        return "Planning(upload)";
      case Planning::Purpose::kRewind:
        return "Planning(rewind)";
      case Planning::Purpose::kRedeal:
        return "Planning(re-deal)";
      case Planning::Purpose::kRecovery:
        return "Planning(recovery)";
    }
  }
  if (std::holds_alternative<AwaitingUpload>(phase)) return "AwaitingUpload";
  if (std::holds_alternative<Serving>(phase)) return "Serving";
  if (std::holds_alternative<Failed>(phase)) return "Failed";
  return "Closed";
}

}  // namespace samplerd
