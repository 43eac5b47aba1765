// glog set up for the samplerd binary, from main.cc's flags.
//
// Why main.cc does not do this itself: glog's own flags (--v, --minloglevel...) are gflags,
// which absl::ParseCommandLine does not know (it rejects "--v=1"), so main.cc declares --v as an
// Abseil flag; and an Abseil flag named v defines a global FLAGS_v that clashes with the one
// glog's header declares. So main.cc does not include glog, and hands the values over here.
#ifndef SAMPLERD_SERVER_LOGGING_SETUP_H_
#define SAMPLERD_SERVER_LOGGING_SETUP_H_

#include "absl/strings/string_view.h"

namespace samplerd {

// Logs to stderr only, from `min_log_level` (0 INFO, 1 WARNING, 2 ERROR), with VLOG(n) lines
// for n <= `verbosity`. Call once, first thing in main.
void InitLogging(const char* argv0, int min_log_level, int verbosity);

// One event line at INFO, e.g. "event=signal signal=Terminated" (docs/OPERATIONS.md).
void LogEvent(absl::string_view line);
// One event line at ERROR.
void LogErrorEvent(absl::string_view line);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOGGING_SETUP_H_
