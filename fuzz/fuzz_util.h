// Helpers of the fuzz targets (docs/HARDENING.md): a scratch directory for the parsers that read
// files, the check that turns a broken invariant into a crash libFuzzer records, and the seed
// writer each target uses to make its checked-in corpus.
//
// Not thread-safe (a fuzz target runs one input at a time).
#ifndef SAMPLERD_FUZZ_FUZZ_UTIL_H_
#define SAMPLERD_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/string_view.h"

// Aborts (a finding: libFuzzer saves the input) when `cond` is false: an invariant of the code
// under test does not hold for this input.
#define SAMPLERD_FUZZ_CHECK(cond, what)                                                         \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                  \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

namespace samplerd {
namespace fuzz {

// A directory of this process's own, created on first use: under /dev/shm when it exists (no
// disk I/O per input), else under $TMPDIR or /tmp. Removed at exit.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    namespace fs = std::filesystem;
    const char* tmp = std::getenv("TMPDIR");
    fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm")
                                                 : fs::path(tmp != nullptr ? tmp : "/tmp");
    auto* path = new std::string((base / ("samplerd-fuzz-" + std::to_string(::getpid()))).string());
    fs::remove_all(*path);
    fs::create_directories(*path);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return path;
  }();
  return *dir;
}

inline void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  SAMPLERD_FUZZ_CHECK(out.good(), path);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SAMPLERD_FUZZ_CHECK(in.good(), path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The seed corpus: with SAMPLERD_FUZZ_WRITE_SEEDS=<dir> in the environment, a target's
// LLVMFuzzerInitialize writes its seeds there (WriteSeed) and exits. How a checked-in corpus is
// made again: docs/HARDENING.md.
inline const char* SeedDirFromEnv() { return std::getenv("SAMPLERD_FUZZ_WRITE_SEEDS"); }
// For LLVMFuzzerInitialize: with SAMPLERD_FUZZ_WRITE_SEEDS set, runs `write_seeds` (which calls
// WriteSeed) and exits; else returns.
inline void WriteSeedsIfAsked(void (*write_seeds)()) {
  if (SeedDirFromEnv() == nullptr) return;
  write_seeds();
  std::exit(0);
}
inline void WriteSeed(const std::string& name, absl::string_view bytes) {
  const std::string dir = SeedDirFromEnv();
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/" + name, bytes);
}

}  // namespace fuzz
}  // namespace samplerd

#endif  // SAMPLERD_FUZZ_FUZZ_UTIL_H_
