// The API's rule for the (index, loss) pairs of a LossBatch (proto/samplerd.proto): as many
// losses as indices, every index < num_samples, every loss finite and >= 0. One home for the
// server (server/loss_batch.cc) and the C++ client (client/cpp/loss_reporter.cc, which checks at
// the call so that a bad argument fails there).
#ifndef SAMPLERD_PROTO_LOSS_PAIRS_H_
#define SAMPLERD_PROTO_LOSS_PAIRS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace samplerd {

// OK if the pairs follow the rule; INVALID_ARGUMENT naming the first offending field, position
// and value otherwise ("indices[3] = 12 is outside [0, num_samples = 10)"; an index above
// INT64_MAX is also shown as the int64 it was on a device). The common case is one branch-free
// pass over each array; the offender is looked for only after a failure.
absl::Status ValidateLossPairs(absl::Span<const uint64_t> indices, absl::Span<const float> losses,
                               uint64_t num_samples);

}  // namespace samplerd

#endif  // SAMPLERD_PROTO_LOSS_PAIRS_H_
