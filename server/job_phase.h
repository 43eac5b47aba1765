// JobPhase: the phase a Job is in, one at a time, and the one rule of which phase may follow
// which (the state diagram of job.h, in code). Plain values: testable without a Job or a thread.
//
//   AwaitingUpload ──upload──> Planning(kUpload) ──> Serving(0)
//   Serving(e) ──every rank EndEpoch(e)──> Planning(kNextEpoch) ──> Serving(e+1) ...
//   Serving(e) ──Rewind(e')──> Planning(kRewind) ──> Serving(e')
//   Failed ──Rewind(e')──> Planning(kRewind) ──> Serving(e')
//   Serving(e) ──Resize, nothing done──> Serving(e) (the next deal of the same plan)
//   Serving(e) ──Resize, some done──> Planning(kRedeal) ──> Serving(e) (the remaining positions)
//   Serving(0), not started ──re-upload──> Planning(kUpload) ──> Serving(0)
//   AwaitingUpload (restored snapshot) ──> Planning(kRecovery) ──> Serving(e)
//   Planning(p) ──failed, p = kUpload, kRewind, kRedeal──> back to `previous` (nothing changed)
//   Planning(any) ──planning, a write or the device failed──> Failed
//   Serving ──applying losses or snapshotting failed──> Failed
//   any phase but Closed ──Close──> Closed (terminal)
//
// Thread-safety: plain values; their owner (the Job) serialises access.
#ifndef SAMPLERD_SERVER_JOB_PHASE_H_
#define SAMPLERD_SERVER_JOB_PHASE_H_

#include <optional>
#include <variant>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/epoch_planner.h"

namespace samplerd {
namespace phase {

// A STATIC / CLASS_BALANCED job before its first upload (epoch 0, no plan), or a restored job
// before its snapshot's epoch is planned again.
struct AwaitingUpload {};
// The job's epoch's plan is published: shards are served, losses applied, ranks end the epoch.
struct Serving {
  EpochView view;
};
// Planning the epoch failed (a server bug, a failed write or a device error), or the backend
// failed while serving it: calls fail with INTERNAL naming `error` and `during`.
struct Failed {
  absl::Status error;
  const char* during = "planning";  // What failed, for messages: "<during> epoch <e> failed".
};
// Deleted (NOT_FOUND) or shutting down (UNAVAILABLE): calls fail with `reason`. Terminal.
struct Closed {
  absl::Status reason;
};

// A phase a Planning can go back to when it fails without failing the job.
using Settled = std::variant<AwaitingUpload, Serving, Failed>;

// The job's epoch's plan (or deal) is being computed, off the job's lock: nothing writes the
// loss statistics, losses and EndEpoch are refused, shards wait.
struct Planning {
  enum class Purpose {
    kNextEpoch,  // Every rank ended the previous epoch (on the planner's thread).
    kUpload,     // Epoch 0 of an upload or of the creation of a UNIFORM job.
    kRewind,     // The epoch the job is rewound to, planned again.
    kRedeal,     // A resize dealing what the current deal has not done (no plan computed).
    kRecovery,   // A restored job's snapshot epoch, planned again before its log is replayed.
  };
  Purpose purpose = Purpose::kNextEpoch;
  absl::Time since;
  // kUpload, kRewind, kRedeal: the phase to return to if this fails (the job as it was).
  std::optional<Settled> previous;
  // What the job serves once this is published: the epoch, its deal and the deal's world size
  // (GetJobStatus shows them while planning, with no rank's progress: the epoch being planned,
  // never the previous one's progress). A rewind shows the current world size: the one its
  // kept start records (which may differ) is read while it plans.
  uint64_t epoch = 0;
  uint32_t deal = 0;
  uint32_t world_size = 0;
};

}  // namespace phase

using JobPhase = std::variant<phase::AwaitingUpload, phase::Planning, phase::Serving, phase::Failed,
                              phase::Closed>;

// Whether a job may go from `from` to `to` (the diagram above). A Planning goes back only to
// the kind of phase it came from (its `previous`).
bool MayTransition(const JobPhase& from, const JobPhase& to);

// The phase `settled` as a JobPhase (a Planning's `previous`, to go back to).
JobPhase FromSettled(phase::Settled settled);

// "AwaitingUpload", "Planning(rewind)", "Serving", ..., for messages and CHECKs.
const char* PhaseName(const JobPhase& phase);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_PHASE_H_
