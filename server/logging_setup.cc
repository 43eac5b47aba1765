#include "server/logging_setup.h"

#include "glog/logging.h"

namespace samplerd {

void InitLogging(const char* argv0, int min_log_level, int verbosity) {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = min_log_level;
  FLAGS_v = verbosity;
  google::InitGoogleLogging(argv0);
}

void LogEvent(absl::string_view line) { LOG(INFO) << line; }

void LogErrorEvent(absl::string_view line) { LOG(ERROR) << line; }

}  // namespace samplerd
