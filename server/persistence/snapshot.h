// Snapshot files: a job's whole state at the start of an epoch, written atomically.
//
// Format (little-endian): "SMPLRDSN" | u32 header length | SnapshotHeader (proto) | base weights
// (float32 x base_count) | W_epoch (float32 x weights_count) | loss statistics (8-byte
// SampleLossStats x loss_stats_count) | irreducible losses (float32 x irreducible_count) | u32
// crc32 of everything before it.
// Written to "<path>.tmp", fsynced, renamed over <path>, and the directory fsynced: a crash
// leaves either the old file or the new one, never a mix.
#ifndef SAMPLERD_SERVER_PERSISTENCE_SNAPSHOT_H_
#define SAMPLERD_SERVER_PERSISTENCE_SNAPSHOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/loss_stats.h"
#include "server/persistence/state.pb.h"

namespace samplerd {

// The version of a job directory's format, kept in each snapshot. 2: the logs have a head
// (record_log.h format 2) that says how far they had been synced, and a snapshot's epoch always
// has its log. A directory of another version is refused (FAILED_PRECONDITION), not converted.
inline constexpr uint32_t kSnapshotFormatVersion = 2;

struct Snapshot {
  state::SnapshotHeader header;
  std::vector<float> base;
  std::vector<float> weights;
  std::vector<SampleLossStats> loss_stats;
  std::vector<float> irreducible;  // REDUCIBLE_LOSS's irreducible losses; empty: none.
};

// Writes `header` (its counts and format_version are set from the spans) and the arrays to
// `path` atomically and durably: StageSnapshot, then CommitSnapshot.
absl::Status WriteSnapshot(const std::string& path, state::SnapshotHeader header,
                           absl::Span<const float> base, absl::Span<const float> weights,
                           absl::Span<const SampleLossStats> loss_stats,
                           absl::Span<const float> irreducible = {});

// The two halves of WriteSnapshot, so that the slow one (the fsync) can run after the caller has
// moved on: StageSnapshot writes "<path>.tmp" (to the page cache: the arrays may change once it
// returns); CommitSnapshot fsyncs it, renames it to `path` and fsyncs the directory.
absl::Status StageSnapshot(const std::string& path, state::SnapshotHeader header,
                           absl::Span<const float> base, absl::Span<const float> weights,
                           absl::Span<const SampleLossStats> loss_stats,
                           absl::Span<const float> irreducible = {});
absl::Status CommitSnapshot(const std::string& path);

// Reads and verifies a snapshot. NOT_FOUND if absent; DATA_LOSS naming the file when it is
// truncated, its checksum does not match, or its header is malformed; FAILED_PRECONDITION for
// an unknown format version.
absl::StatusOr<Snapshot> ReadSnapshot(const std::string& path);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_SNAPSHOT_H_
