// Test helper: how much resident memory a piece of code really takes at its peak (Linux).
#ifndef SAMPLERD_KERNELS_TESTING_PEAK_MEMORY_H_
#define SAMPLERD_KERNELS_TESTING_PEAK_MEMORY_H_

#include <fcntl.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace samplerd {
namespace testutil {

// A "VmRSS:" / "VmHWM:" field of /proc/self/status, in bytes; 0 if absent.
inline uint64_t ProcStatusBytes(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  const size_t len = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, len) == 0) {
      kib = std::strtoull(line + len, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

// Whether this build runs under AddressSanitizer or ThreadSanitizer, whose allocator owns the
// resident memory: gcc says so with __SANITIZE_*__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SAMPLERD_TESTUTIL_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SAMPLERD_TESTUTIL_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifndef SAMPLERD_TESTUTIL_SANITIZER_ALLOCATOR
#define SAMPLERD_TESTUTIL_SANITIZER_ALLOCATOR 0
#endif

// Why resident memory does not measure the program's own allocations in this build (empty when
// it does): a sanitizer's allocator adds redzones and keeps freed blocks in quarantine
// (AddressSanitizer), or maps shadow memory beside every access (ThreadSanitizer). Tests that
// bound what code allocates skip with this reason under --config=asan / tsan / fuzz.
inline const char* ResidentMemoryNotTheProgramsBecause() {
  return SAMPLERD_TESTUTIL_SANITIZER_ALLOCATOR
             ? "a sanitizer's allocator (redzones, quarantine, shadow memory) owns the resident "
               "memory"
             : "";
}

struct PeakGrowth {
  bool supported = false;  // False where the kernel refuses to reset the high-water mark.
  int exit_code = -1;      // The child's: 0 when `fn` returned; fn may _exit(k) to report k.
  uint64_t bytes = 0;      // Peak resident memory over the resident memory before `fn`.
};

// Runs `fn` in a forked child (a fresh copy of this process, so that memory freed by earlier
// tests and kept by malloc cannot hide an allocation) and measures the growth of the child's
// peak resident memory over its resident memory before `fn`: VmHWM after, minus VmRSS before,
// with the high-water mark reset by /proc/self/clear_refs. `setup` runs in the child before the
// baseline is read: it should touch the inputs that `fn` reads, whose pages the child may not
// have mapped yet (they would count as growth). Call it while this process runs no other
// thread (fork copies only the caller's).
inline PeakGrowth PeakResidentGrowth(const std::function<void()>& setup,
                                     const std::function<void()>& fn) {
  PeakGrowth result;
  int fds[2];
  if (pipe(fds) != 0) return result;
  const pid_t pid = fork();
  if (pid < 0) return result;
  if (pid == 0) {
    close(fds[0]);
    setup();
    malloc_trim(0);
    const uint64_t before = ProcStatusBytes("VmRSS:");
    const int clear = open("/proc/self/clear_refs", O_WRONLY);
    uint64_t growth = ~uint64_t{0};  // Reset refused.
    if (clear >= 0 && write(clear, "5", 1) == 1) {
      close(clear);
      fn();
      const uint64_t peak = ProcStatusBytes("VmHWM:");
      growth = peak > before ? peak - before : 0;
    }
    (void)!write(fds[1], &growth, sizeof growth);
    _exit(0);
  }
  close(fds[1]);
  uint64_t growth = ~uint64_t{0};
  const bool got = read(fds[0], &growth, sizeof growth) == sizeof growth;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.supported = !got || growth != ~uint64_t{0};
  if (got && result.supported) result.bytes = growth;
  return result;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_PEAK_MEMORY_H_
