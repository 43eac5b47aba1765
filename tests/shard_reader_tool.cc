// A trainer rank's reading loop as a process of its own, for shard_reader_process_test: reads its
// shard of one epoch with a ShardReader, appending the indices (uint64, native order) to --out.
// With --stop_after it saves its position to --position_file after that many indices and exits
// (a trainer's checkpoint, then its death); with --resume_from it continues from such a file.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "client/cpp/shard_reader.h"
#include "tests/rank_flags.h"

ABSL_FLAG(uint64_t, epoch, 0, "epoch to read (ignored with --resume_from)");
ABSL_FLAG(uint64_t, batch, 256, "Next(n)");
ABSL_FLAG(uint64_t, queue_capacity, 2000, "ShardReader queue capacity");
ABSL_FLAG(uint32_t, chunk_size, 500, "indices per chunk");
ABSL_FLAG(int64_t, pace_us, 0, "sleep after each batch (a training step)");
ABSL_FLAG(uint64_t, stop_after, 0, "save the position after this many indices and exit (0: never)");
ABSL_FLAG(std::string, position_file, "", "where --stop_after saves the position");
ABSL_FLAG(std::string, resume_from, "", "a position file to resume from");
ABSL_FLAG(std::string, out, "", "file the indices are appended to");

namespace samplerd {
namespace {

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "shard_reader_tool rank %u: %s: %s\n", absl::GetFlag(FLAGS_rank), what,
               s.ToString().c_str());
  return 1;
}

int Main() {
  auto client = testutil::RankClient();
  if (!client.ok()) return Fail(client.status(), "client");
  ShardReaderOptions options;
  options.job = absl::GetFlag(FLAGS_job);
  options.rank = absl::GetFlag(FLAGS_rank);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
  options.max_chunk_size = absl::GetFlag(FLAGS_chunk_size);
  auto reader = ShardReader::Create(std::shared_ptr<SamplerClient>(*std::move(client)), options);
  if (!reader.ok()) return Fail(reader.status(), "ShardReader::Create");
  if (const std::string from = absl::GetFlag(FLAGS_resume_from); !from.empty()) {
    std::ifstream in(from);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<ReaderPosition> position = ReaderPosition::Parse(text);
    if (!position.ok()) return Fail(position.status(), "ReaderPosition::Parse");
    if (absl::Status s = (*reader)->Resume(*position); !s.ok()) return Fail(s, "Resume");
  } else if (absl::Status s = (*reader)->StartEpoch(absl::GetFlag(FLAGS_epoch)); !s.ok()) {
    return Fail(s, "StartEpoch");
  }
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary | std::ios::app);
  const uint64_t stop_after = absl::GetFlag(FLAGS_stop_after);
  uint64_t read = 0;
  for (;;) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next(absl::GetFlag(FLAGS_batch));
    if (!batch.ok()) return Fail(batch.status(), "Next");
    if (batch->end_of_shard()) return 0;
    out.write(reinterpret_cast<const char*>(batch->indices.data()),
              batch->indices.size() * sizeof(uint64_t));
    out.flush();
    read += batch->indices.size();
    absl::SleepFor(absl::Microseconds(absl::GetFlag(FLAGS_pace_us)));
    if (stop_after > 0 && read >= stop_after) {
      std::ofstream(absl::GetFlag(FLAGS_position_file)) << (*reader)->position()->Serialize();
      return 0;
    }
  }
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return samplerd::Main();
}
