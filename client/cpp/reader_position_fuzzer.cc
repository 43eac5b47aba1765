// Fuzz target: ReaderPosition::Parse (reader_position.h), the text a trainer's checkpoint holds.
// Checks, beyond "no crash, no sanitizer report": a position that parses keeps the documented
// invariants (non-empty job, rank < world_size, position <= shard_length) and survives
// Serialize -> Parse unchanged; CheckOwner on it does not crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "client/cpp/reader_position.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  samplerd::fuzz::WriteSeedsIfAsked([] {
    using samplerd::fuzz::WriteSeed;
    WriteSeed("v3",
              "samplerd.ReaderPosition version=3 job=train epoch=3 deal=0 rank=1 "
              "world_size=4 position=4096 shard_length=25000");
    WriteSeed("v3_no_length",
              "samplerd.ReaderPosition version=3 job=a.b-c_d epoch=0 deal=2 "
              "rank=0 world_size=1 position=0");
    WriteSeed("v2",
              "samplerd.ReaderPosition version=2 job=j epoch=18446744073709551615 deal=1 "
              "rank=3 world_size=4 position=7");
    WriteSeed("v1",
              "samplerd.ReaderPosition version=1 job=j epoch=1 rank=0 world_size=2 "
              "position=5");
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using samplerd::ReaderPosition;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ReaderPosition> parsed = ReaderPosition::Parse(text);
  if (!parsed.ok()) return 0;
  SAMPLERD_FUZZ_CHECK(!parsed->job.empty(), "empty job");
  SAMPLERD_FUZZ_CHECK(parsed->rank < parsed->world_size, parsed->Serialize());
  SAMPLERD_FUZZ_CHECK(!parsed->shard_length || parsed->position <= *parsed->shard_length,
                      parsed->Serialize());
  const std::string serialized = parsed->Serialize();
  absl::StatusOr<ReaderPosition> again = ReaderPosition::Parse(serialized);
  SAMPLERD_FUZZ_CHECK(again.ok(), serialized + ": " + again.status().ToString());
  SAMPLERD_FUZZ_CHECK(*again == *parsed, serialized);
  (void)parsed->CheckOwner(parsed->job, parsed->rank, parsed->world_size);
  (void)parsed->CheckOwner("other", 0, 1);
  return 0;
}
