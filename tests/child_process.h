// A child process a test talks to over pipes, for the trainer-rank tools of the process tests:
// the test reads the lines the child prints (stdout) and answers on its stdin, so that each
// step of a scenario (kill samplerd while every rank waits at a known point, then let the ranks
// go on) happens at a point the child reached, not after a guessed sleep. The child's stderr
// is the test's.
#ifndef SAMPLERD_TESTS_CHILD_PROCESS_H_
#define SAMPLERD_TESTS_CHILD_PROCESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace samplerd {
namespace testutil {

class ChildProcess {
 public:
  // Runs argv[0] with `argv` (argv[0] included).
  explicit ChildProcess(std::vector<std::string> argv) {
    int in[2], out[2];
    if (pipe(in) != 0) return;
    if (pipe(out) != 0) {
      close(in[0]);
      close(in[1]);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = fdopen(in[1], "w");
    stdout_ = fdopen(out[0], "r");
  }
  ~ChildProcess() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (stdin_ != nullptr) std::fclose(stdin_);
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Reads lines until one starts with `prefix` and returns it (without its newline); "" if the
  // child's stdout ends first. Every line read is kept in output().
  std::string AwaitLine(const std::string& prefix) {
    char line[4096];
    while (stdout_ != nullptr && std::fgets(line, sizeof line, stdout_) != nullptr) {
      std::string text(line);
      output_ += text;
      if (!text.empty() && text.back() == '\n') text.pop_back();
      if (absl::StartsWith(text, prefix)) return text;
    }
    return "";
  }

  // Writes `line` and a newline to the child's stdin.
  void WriteLine(const std::string& line) {
    if (stdin_ == nullptr) return;
    std::fputs((line + "\n").c_str(), stdin_);
    std::fflush(stdin_);
  }

  // Reads the rest of stdout, waits for the exit and returns the exit code (128 + the signal
  // for a child killed by one).
  int Wait() {
    if (pid_ <= 0) return -1;
    AwaitLine("\x01");  // No line starts so: reads to the end.
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    waited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Sends `signal` to the child (SIGKILL: a crash), then Wait()s: reads what it printed before
  // and returns 128 + the signal.
  int Signal(int signal) {
    if (pid_ > 0 && !waited_) kill(pid_, signal);
    return Wait();
  }

  // Everything the child printed that was read so far.
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  bool waited_ = false;
  FILE* stdin_ = nullptr;
  FILE* stdout_ = nullptr;
  std::string output_;
};

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_TESTS_CHILD_PROCESS_H_
