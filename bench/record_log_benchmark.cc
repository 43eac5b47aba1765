// The cost of an acknowledged write-ahead log call: Append + Sync (one fdatasync) per iteration,
// as a ReportLosses call or an EndEpoch pays it, on a real file system. The log lives in
// $SAMPLERD_BENCH_DIR (default /tmp: not a tmpfs here; on a tmpfs fdatasync costs nothing).
//   bazel run -c opt //bench:record_log_benchmark
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "server/persistence/record_log.h"

namespace samplerd {
namespace {

std::string BenchLogPath() {
  const char* dir = std::getenv("SAMPLERD_BENCH_DIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/record_log_benchmark.", ::getpid(), ".log");
}

// Arg: payload bytes (an EndEpoch record is ~10 bytes; a loss batch of 65536 pairs ~790 KB).
void BM_AppendSync(benchmark::State& state) {
  const std::string path = BenchLogPath();
  std::filesystem::remove(path);
  auto writer = RecordLogWriter::Open(path);
  if (!writer.ok()) {
    state.SkipWithError(std::string(writer.status().message()).c_str());
    return;
  }
  const std::string payload(static_cast<size_t>(state.range(0)), 'x');
  for (auto _ : state) {
    if (!(*writer)->Append(payload).ok() || !(*writer)->Sync().ok()) {
      state.SkipWithError("append or sync failed");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  writer->reset();
  std::filesystem::remove(path);
}
BENCHMARK(BM_AppendSync)->Arg(16)->Arg(4096)->Arg(1 << 20)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace samplerd
