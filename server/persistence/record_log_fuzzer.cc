// Fuzz target: the write-ahead log reader (record_log.h) on arbitrary file contents, the bytes a
// crash, a torn write or a damaged disk can leave. Checks, beyond "no crash, no sanitizer
// report": a log that reads is made of its head and whole records (valid_bytes); reading it as
// wholly synced either fails or gives the same records; RecordLogWriter::Open accepts it, cuts a
// torn tail, and the log then reads back the same records followed by one appended.
//
// Input: [u8 checksum flags][the file] (fuzz_checksums.h: the flags say which checksums are
// recomputed before the file is read, so that mutations reach past them).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "server/persistence/fuzz_checksums.h"
#include "server/persistence/record_log.h"

namespace samplerd {
namespace {

void WriteSeeds() {
  const std::string path = fuzz::ScratchDir() + "/seed.log";
  auto make = [&](const std::string& name, absl::string_view header,
                  const std::vector<std::string>& synced, const std::vector<std::string>& unsynced,
                  size_t cut) {
    std::filesystem::remove(path);
    auto writer = RecordLogWriter::Open(path, header);
    SAMPLERD_FUZZ_CHECK(writer.ok(), writer.status().ToString());
    for (const std::string& r : synced) SAMPLERD_FUZZ_CHECK((*writer)->Append(r).ok(), name);
    if (!synced.empty()) SAMPLERD_FUZZ_CHECK((*writer)->Sync().ok(), name);
    for (const std::string& r : unsynced) SAMPLERD_FUZZ_CHECK((*writer)->Append(r).ok(), name);
    writer->reset();
    std::string bytes = fuzz::ReadFile(path);
    bytes.resize(bytes.size() - std::min(cut, bytes.size()));
    fuzz::WriteSeed(name, std::string(1, fuzz::kFixHeadBlocks | fuzz::kFixRecords) + bytes);
  };
  make("head_only", "epoch=0", {}, {}, 0);
  make("synced_records", "epoch=3", {"a", std::string(100, 'b'), ""}, {}, 0);
  make("torn_tail", "", {"first", "second"}, {std::string(40, 'x')}, 7);
  make("unsynced_records", "h", {}, {"r1", "r2", "r3"}, 0);
}

}  // namespace
}  // namespace samplerd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  samplerd::fuzz::WriteSeedsIfAsked(&samplerd::WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT: a fuzz target's entry point.
  const std::string path = fuzz::ScratchDir() + "/wal-0.log";
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::FixChecksums(data[0] & (fuzz::kFixHeadBlocks | fuzz::kFixRecords), bytes);
  size = bytes.size();
  fuzz::WriteFile(path, bytes);

  (void)ReadRecordLogHead(path);
  absl::StatusOr<RecordLogContents> contents = ReadRecordLog(path);
  // The same bytes, all claimed synced: a torn tail is then corruption.
  absl::StatusOr<RecordLogContents> strict = ReadRecordLog(path, size);
  if (!contents.ok()) return 0;

  uint64_t framed = kRecordLogHeadBytes;
  for (const std::string& r : contents->records) framed += 12 + r.size();
  SAMPLERD_FUZZ_CHECK(contents->valid_bytes == framed,
                      absl::StrCat(contents->valid_bytes, " vs ", framed));
  SAMPLERD_FUZZ_CHECK(contents->valid_bytes <= size, absl::StrCat(contents->valid_bytes));
  SAMPLERD_FUZZ_CHECK(contents->torn_tail == (contents->valid_bytes < size), "torn_tail");
  if (strict.ok()) {
    SAMPLERD_FUZZ_CHECK(strict->records == contents->records, "strict read differs");
    SAMPLERD_FUZZ_CHECK(!strict->torn_tail, "strict read has a torn tail");
  }

  {
    absl::StatusOr<std::unique_ptr<RecordLogWriter>> writer = RecordLogWriter::Open(path);
    SAMPLERD_FUZZ_CHECK(writer.ok(), writer.status().ToString());
    SAMPLERD_FUZZ_CHECK((*writer)->header() == contents->head.header, "header");
    SAMPLERD_FUZZ_CHECK((*writer)->Append("appended").ok(), "append");
    SAMPLERD_FUZZ_CHECK((*writer)->Sync().ok(), "sync");
  }
  absl::StatusOr<RecordLogContents> after = ReadRecordLog(path);
  SAMPLERD_FUZZ_CHECK(after.ok(), after.status().ToString());
  std::vector<std::string> expected = contents->records;
  expected.push_back("appended");
  SAMPLERD_FUZZ_CHECK(after->records == expected, "records after Open + Append");
  SAMPLERD_FUZZ_CHECK(!after->torn_tail, "torn tail after Open");
  return 0;
}
