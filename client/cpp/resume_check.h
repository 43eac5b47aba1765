// CheckResume: whether a saved ReaderPosition can be resumed where it says, given what the
// server says of the job now -- the one home of that rule in the C++ trainer library (the Python
// client's is samplerd/resume_check.py; both are tested on the same vectors,
// client/testdata/resume_cases.json, so that they cannot drift). Pure logic: no RPC,
// no gRPC; EpochLoop::Resume gathers the facts (GetJobStatus, and GetJob for a shard length the
// position does not carry) and acts on the answer. PositionsServedAgain (below) is the rule of
// the other kind of restart, one without a saved position, on the same facts.
//
// The rule, for a position (epoch E, deal D, position P, shard length L if known) of this rank,
// the job at epoch C in deal D' (checked in this order):
//
//   1. P > L: INVALID_ARGUMENT (not a position of that shard).
//   2. E < C (E closed since the save):
//      - P = L (the shard consumed whole; the process that saved it ended E, or the others did
//        after it died): the next epoch follows. If E + 1 = C, kNextEpoch: read epoch C from its
//        start. If E + 1 < C, epoch E + 1 closed too without this rank's model having trained
//        it: as below, for position 0 of epoch E + 1.
//      - otherwise (P < L, or L unknown): FAILED_PRECONDITION -- the positions from P on were
//        trained, and their losses reported, after the checkpoint by the process that died, and
//        can no longer be served. The message names the two ways on: rewind the job to E's start
//        if kept (SamplerClient::RewindJob, `samplerctl rewind JOB E`) and resume every rank
//        from position 0 of E; or continue with epoch C without this position (Run(C, ...)).
//   3. P = 0: kPosition (an epoch's start: nothing before it to lose).
//   4. E = C and D != D' (the epoch was dealt again since): kPosition; the server refuses the
//      replaced deal itself (StreamShard: FAILED_PRECONDITION naming the current deal).
//   5. P <= S, S the rank's indices_streamed in the current epoch and deal (0 for any other
//      epoch; GetJobStatus shows 0 while the current epoch is planned: nothing of it was
//      streamed yet): kPosition. A position is at most what the server
//      streamed to the rank (the reader handed out only what it received).
//   6. Otherwise FAILED_PRECONDITION: the position predates a rewind of the job (RewindJob clears
//      the rank's record; the losses before P are no longer counted) or the job was made again.
//      The message names what to do: resume from a position saved at the epoch's start or after
//      the rewind, or run epoch C from its start.
//
// Every refusal names job, epoch, rank and position (and deal where it decides). Which rank,
// job and world size the position belongs to is ReaderPosition::CheckOwner's (checked first;
// EpochLoop::Resume lets a position of another world size through only when this rule says
// kNextEpoch).
#ifndef SAMPLERD_CLIENT_CPP_RESUME_CHECK_H_
#define SAMPLERD_CLIENT_CPP_RESUME_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/reader_position.h"

namespace samplerd {

// What the server says of the job and the resuming rank now (GetJobStatus).
struct ServerProgress {
  uint64_t current_epoch = 0;
  uint32_t current_deal = 0;
  // Epoch starts RewindJob can go back to (v1::Job::rewindable_epochs).
  std::vector<uint64_t> rewindable_epochs;
  // The rank's v1::RankProgress::indices_streamed as GetJobStatus shows it (0 if the server has
  // no record of the rank). Always the current epoch's: while it is planned, 0
  // (v1::JobStatus::planning).
  uint64_t indices_streamed = 0;
  // The rank's v1::RankProgress::losses_accepted, as indices_streamed: the current epoch's (0
  // without a record of the rank, or while the epoch is planned).
  uint64_t losses_accepted = 0;
};

enum class ResumeAt {
  // Read position.epoch from position.position, in position.deal.
  kPosition,
  // Read the next epoch (position.epoch + 1, the current one) from its start, in the deal the
  // reader would open it in; nothing is left of position.epoch (no end-of-shard hook, no
  // EndEpoch: it closed).
  kNextEpoch,
};

// The rule above. `from.shard_length` is the shard's length where known (the position's own, or
// the server's for an epoch it still answers about).
absl::StatusOr<ResumeAt> CheckResume(const ReaderPosition& from, const ServerProgress& server);

// PositionsServedAgain: the rule of a restart without a saved position -- a rank that starts
// `epoch` from position 0, in deal `deal`, without resuming a ReaderPosition (EpochLoop::Run; the
// Python sampler's first iteration without load_state_dict: samplerd/resume_check.py
// served_again; both run client/testdata/served_again_cases.json). With the job at epoch C in
// deal D': if epoch = C, deal = D' and the server accepted A > 0 losses of the rank in it, those
// A positions (trained by a previous process of the rank, or an earlier Run) are served and
// trained again -- their losses count once, as duplicates -- and the answer is A; also when the
// rank has ended C while other ranks are still in it (its whole shard is served again: the
// server streams an open epoch to a rank that ended it). Otherwise 0 (another epoch or deal: none
// of its losses were reported; while C is planned no rank has progress in it). A restart that
// resumes its saved position replays only the positions after it (documented, not counted).
uint64_t PositionsServedAgain(uint64_t epoch, uint32_t deal, const ServerProgress& server);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_RESUME_CHECK_H_
