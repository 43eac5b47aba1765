// The real samplerd binary as a child process, for tests: started on a port (0: a free one, read
// back from its "samplerd listening on" line), killed with SIGKILL (a crash) or SIGTERM.
#ifndef SAMPLERD_TESTS_SAMPLERD_PROCESS_H_
#define SAMPLERD_TESTS_SAMPLERD_PROCESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace samplerd {
namespace testutil {

class SamplerdProcess {
 public:
  // Runs `binary` --plaintext --port=<port> plus `flags`; address() is empty if it did not come
  // up.
  SamplerdProcess(const std::string& binary, int port, const std::vector<std::string>& flags) {
    int out[2];
    if (pipe(out) != 0) return;
    std::vector<std::string> args = {binary, "--plaintext", absl::StrCat("--port=", port),
                                     "--log_level=1"};
    args.insert(args.end(), flags.begin(), flags.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
    char line[256];
    if (stdout_ != nullptr && std::fgets(line, sizeof line, stdout_) != nullptr) {
      std::string text(line);
      const std::string prefix = "samplerd listening on ";
      if (absl::StartsWith(text, prefix)) {
        address_ = text.substr(prefix.size());
        while (!address_.empty() && (address_.back() == '\n' || address_.back() == '\r')) {
          address_.pop_back();
        }
      }
    }
  }
  ~SamplerdProcess() {
    if (pid_ > 0 && !waited_) Signal(SIGKILL);
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  SamplerdProcess(const SamplerdProcess&) = delete;
  SamplerdProcess& operator=(const SamplerdProcess&) = delete;

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // The next line the server printed after its listening line (e.g. "samplerd metrics on URL"
  // with --metrics_port), without its newline; empty at the end of its output.
  std::string NextLine() {
    char line[256];
    if (stdout_ == nullptr || std::fgets(line, sizeof line, stdout_) == nullptr) return "";
    std::string text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
  }
  int port() const {
    int port = 0;
    const size_t colon = address_.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(address_.substr(colon + 1), &port))
      return 0;
    return port;
  }

  // Sends `signal` and waits; returns the status waitpid reports.
  int Signal(int signal) {
    waited_ = true;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    return status;
  }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  std::string address_;
  bool waited_ = false;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_TESTS_SAMPLERD_PROCESS_H_
