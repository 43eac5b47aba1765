// One data-parallel rank in its own process, for tests/loss_reporter_test.cc: reads its shard of
// the epoch and reports a loss for each of positions [from, to) with a LossReporter, in calls of
// 512 pairs. With --flush it flushes and closes, then prints the reporter's counts
// ("accepted=A duplicates=D"); without, it exits at once after its last Report, as a trainer
// that crashes would, leaving whatever the reporter had not yet sent unsent. With --pause_at it
// flushes after the positions before that one, prints "flushed position=P" and waits for a line
// on stdin before it goes on (trainer_process_test kills samplerd meanwhile). Errors are printed
// to stdout as "error <call>: <status>" (the process tests match them).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/cpp/loss_reporter.h"
#include "tests/rank_flags.h"

ABSL_FLAG(uint64_t, epoch, 0, "epoch");
ABSL_FLAG(uint64_t, from, 0, "first shard position reported");
ABSL_FLAG(uint64_t, to, 0, "end of the positions reported (exclusive; 0: the shard's end)");
ABSL_FLAG(bool, flush, true, "flush and print the counts; else exit right after reporting");
ABSL_FLAG(uint64_t, pause_at, 0,
          "flush before this position, print it and wait for a line on stdin (0: never)");

namespace {

int Fail(const char* what, const absl::Status& s) {
  std::printf("error %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto client = samplerd::testutil::RankClient();
  if (!client.ok()) return Fail("client", client.status());
  const std::string job = absl::GetFlag(FLAGS_job);
  const uint32_t rank = absl::GetFlag(FLAGS_rank);
  const uint64_t epoch = absl::GetFlag(FLAGS_epoch);
  auto shard = (*client)->ReadShard(job, epoch, rank, absl::GetFlag(FLAGS_world_size));
  if (!shard.ok()) return Fail("ReadShard", shard.status());
  auto reporter =
      samplerd::LossReporter::Create(client->get(), job, rank, absl::GetFlag(FLAGS_world_size));
  if (!reporter.ok()) return Fail("LossReporter::Create", reporter.status());
  const uint64_t to = absl::GetFlag(FLAGS_to) == 0 ? shard->size() : absl::GetFlag(FLAGS_to);
  const uint64_t pause_at = absl::GetFlag(FLAGS_pause_at);
  std::vector<float> losses;
  for (uint64_t lo = absl::GetFlag(FLAGS_from), hi = 0; lo < to; lo = hi) {
    if (pause_at > 0 && lo == pause_at) {
      if (absl::Status s = (*reporter)->Flush(); !s.ok()) return Fail("Flush", s);
      std::printf("flushed position=%lu\n", static_cast<unsigned long>(lo));
      std::fflush(stdout);
      char line[64];
      if (std::fgets(line, sizeof line, stdin) == nullptr) {
        return Fail("stdin", absl::AbortedError("closed before the go-ahead"));
      }
    }
    hi = std::min<uint64_t>(to, lo + 512);
    if (lo < pause_at && pause_at < hi) hi = pause_at;  // Calls meet pause_at exactly.
    losses.clear();
    for (uint64_t p = lo; p < hi; ++p) losses.push_back(((*shard)[p] % 100) * 0.01f);
    absl::Status s =
        (*reporter)->Report(epoch, lo, absl::MakeConstSpan(shard->data() + lo, hi - lo), losses);
    if (!s.ok()) return Fail("Report", s);
  }
  if (!absl::GetFlag(FLAGS_flush)) {
    std::fflush(stdout);
    _exit(0);  // A crash: no destructor sends what is left.
  }
  if (absl::Status s = (*reporter)->Close(); !s.ok()) return Fail("Close", s);
  const samplerd::LossCounts counts = (*reporter)->counts();
  std::printf("accepted=%lu duplicates=%lu\n", static_cast<unsigned long>(counts.accepted),
              static_cast<unsigned long>(counts.duplicates));
  return 0;
}
