// Fuzz target: the snapshot reader (snapshot.h) on arbitrary file contents. Checks, beyond "no
// crash, no sanitizer report": a snapshot that reads has arrays of the lengths its header says,
// and writing it again gives a file that reads back to the same header and the same bits.
//
// Input: [u8 checksum flags][the file] (fuzz_checksums.h: with kFixSnapshot, the trailing
// checksum is recomputed before the file is read, so that mutations reach the parser behind it).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "server/persistence/fuzz_checksums.h"
#include "server/persistence/snapshot.h"

namespace samplerd {
namespace {

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void WriteSeeds() {
  const std::string path = fuzz::ScratchDir() + "/seed.bin";
  auto make = [&](const std::string& name, uint64_t epoch, bool planned, size_t n, bool stats) {
    state::SnapshotHeader header;
    header.set_job("j");
    header.set_epoch(epoch);
    header.set_planned(planned);
    header.set_spec("spec");
    std::vector<float> base(n), weights(n);
    std::vector<SampleLossStats> loss_stats(stats ? n : 0);
    for (size_t i = 0; i < n; ++i) {
      base[i] = 1.0f + static_cast<float>(i);
      weights[i] = 0.5f * static_cast<float>(i);
    }
    SAMPLERD_FUZZ_CHECK(WriteSnapshot(path, header, base, weights, loss_stats).ok(), name);
    fuzz::WriteSeed(name, std::string(1, fuzz::kFixSnapshot) + fuzz::ReadFile(path));
  };
  make("empty_arrays", 0, false, 0, false);
  make("planned_epoch_2", 2, true, 8, true);
  make("weights_only", 5, true, 3, false);
}

}  // namespace
}  // namespace samplerd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  samplerd::fuzz::WriteSeedsIfAsked(&samplerd::WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT: a fuzz target's entry point.
  const std::string path = fuzz::ScratchDir() + "/snapshot-0.bin";
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::FixChecksums(data[0] & fuzz::kFixSnapshot, bytes);
  fuzz::WriteFile(path, bytes);
  absl::StatusOr<Snapshot> read = ReadSnapshot(path);
  if (!read.ok()) return 0;
  const state::SnapshotHeader& h = read->header;
  SAMPLERD_FUZZ_CHECK(read->base.size() == h.base_count(), absl::StrCat(h.base_count()));
  SAMPLERD_FUZZ_CHECK(read->weights.size() == h.weights_count(), absl::StrCat(h.weights_count()));
  SAMPLERD_FUZZ_CHECK(read->loss_stats.size() == h.loss_stats_count(),
                      absl::StrCat(h.loss_stats_count()));
  SAMPLERD_FUZZ_CHECK(read->irreducible.size() == h.irreducible_count(),
                      absl::StrCat(h.irreducible_count()));

  const std::string again = fuzz::ScratchDir() + "/snapshot-1.bin";
  SAMPLERD_FUZZ_CHECK(
      WriteSnapshot(again, h, read->base, read->weights, read->loss_stats, read->irreducible).ok(),
      "rewrite");
  absl::StatusOr<Snapshot> reread = ReadSnapshot(again);
  SAMPLERD_FUZZ_CHECK(reread.ok(), reread.status().ToString());
  SAMPLERD_FUZZ_CHECK(reread->header.SerializeAsString() == h.SerializeAsString(), "header");
  SAMPLERD_FUZZ_CHECK(SameBits(reread->base, read->base), "base");
  SAMPLERD_FUZZ_CHECK(SameBits(reread->weights, read->weights), "weights");
  SAMPLERD_FUZZ_CHECK(SameBits(reread->loss_stats, read->loss_stats), "loss_stats");
  SAMPLERD_FUZZ_CHECK(SameBits(reread->irreducible, read->irreducible), "irreducible");
  return 0;
}
