#include "server/memory_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/job_memory.h"

namespace samplerd {

absl::StatusOr<MemoryBudget> MakeMemoryBudget(uint64_t max_memory_bytes,
                                              uint64_t max_stream_buffer_bytes,
                                              uint64_t max_transport_buffer_bytes) {
  MemoryBudget budget;
  budget.total = max_memory_bytes != 0 ? max_memory_bytes : DefaultMaxMemoryBytes();
  budget.stream_buffers = max_stream_buffer_bytes != 0
                              ? max_stream_buffer_bytes
                              : std::min(kDefaultMaxStreamBufferBytes, budget.total / 4);
  budget.transport_buffers = max_transport_buffer_bytes != 0
                                 ? max_transport_buffer_bytes
                                 : std::min(kDefaultMaxTransportBufferBytes, budget.total / 4);
  // Compared without adding: each is at most UINT64_MAX.
  if (budget.stream_buffers >= budget.total ||
      budget.transport_buffers >= budget.total - budget.stream_buffers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the serving reserve, --max_stream_buffer_bytes = ", FormatBytes(budget.stream_buffers),
        " plus --max_transport_buffer_bytes = ", FormatBytes(budget.transport_buffers),
        ", leaves nothing of --max_memory_bytes = ", FormatBytes(budget.total),
        (max_memory_bytes == 0 ? " (its default: 80% of this machine's or container's memory)"
                               : ""),
        " for jobs; raise --max_memory_bytes or lower the other two (docs/OPERATIONS.md, "
        "\"Memory\")"));
  }
  return budget;
}

}  // namespace samplerd
