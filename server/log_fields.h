// The value of a key=value field of samplerd's event log lines (docs/OPERATIONS.md):
//
//   LOG(INFO) << "event=job_created job=" << LogValue(name) << " num_samples=" << n;
//
// A value made only of [A-Za-z0-9._:/+-] is written as it is; any other (empty, with spaces,
// quotes, "=" or control characters, e.g. an error message) is double-quoted with C escapes, so
// that a line always splits into its fields the same way (logfmt; `"` and `\` escaped).
#ifndef SAMPLERD_SERVER_LOG_FIELDS_H_
#define SAMPLERD_SERVER_LOG_FIELDS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace samplerd {

std::string LogValue(absl::string_view value);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOG_FIELDS_H_
