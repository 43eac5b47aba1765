// compare_backends: checks that two running samplerd servers (e.g. --backend=cpu and
// --backend=cuda) serve the same shards, importance weights and weight summaries for the same
// jobs and losses (tools/gpu/backend_compare.h), or times the epoch boundary of one server
// (tools/gpu/epoch_boundary_timer.h).
//
//   compare_backends --a=HOST:PORT --b=HOST:PORT [--sizes=1000,1e5,1e7] [--epochs=3]
//   compare_backends --a=HOST:PORT --boundary_n=1e8,1e9 [--boundary_count=3]
//
// Prints one line per job ("OK ..."), then "EQUAL ..." or "DIFFERENCE job=... epoch=... rank=...
// position=...: a ... | b ..."; in timing mode one "BOUNDARY ..." line per N.
// Exit status: 0 equal (or timed), 1 a difference, 2 bad flags or a failed call.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cpp/sampler_client.h"
#include "tools/gpu/backend_compare.h"
#include "tools/gpu/epoch_boundary_timer.h"

ABSL_FLAG(std::string, a, "", "Server a, HOST:PORT (plaintext).");
ABSL_FLAG(std::string, b, "",
          "Server b, HOST:PORT: compared with a (not needed with --boundary_n).");
ABSL_FLAG(std::string, sizes, "1000,100000",
          "Dataset sizes N of the compared jobs, comma-separated (1e5 notation accepted); 39 "
          "jobs per N.");
ABSL_FLAG(int, epochs, 3, "Epochs each compared job trains (its next epoch is compared too).");
ABSL_FLAG(std::string, job_prefix, "cmp", "Prefix of the job names.");
ABSL_FLAG(std::vector<std::string>, job_filter, {},
          "Compare only the jobs whose name contains one of these comma-separated parts (e.g. "
          "-m1000000-,-loss-); default all.");
ABSL_FLAG(std::string, boundary_n, "",
          "Timing mode: N of the timed loss-policy jobs on server a, comma-separated (e.g. "
          "1e8,1e9). No comparison is made.");
ABSL_FLAG(uint64_t, boundary_m, 0, "Timing mode: M (0: N / 10).");
ABSL_FLAG(uint32_t, boundary_world_size, 2, "Timing mode: world size.");
ABSL_FLAG(int, boundary_count, 3, "Timing mode: epoch boundaries timed per N (median printed).");
ABSL_FLAG(uint64_t, boundary_losses_per_rank, uint64_t{1} << 20,
          "Timing mode: losses each rank reports per epoch (a prefix of its shard).");
ABSL_FLAG(int, timeout_s, 600,
          "Deadline of each call, seconds (planning 1e9 samples takes a while on a CPU).");
ABSL_FLAG(uint64_t, testonly_b_seed_xor, 0,
          "Test only: XOR every job's seed on b with this (the comparison must then fail).");
ABSL_FLAG(bool, testonly_b_loss_changed, false,
          "Test only: change the first loss reported to b for each job (a loss policy's "
          "weights must then differ from epoch 1 on).");

namespace samplerd {
namespace gpu_e2e {
namespace {

// "1000,1e5" -> {1000, 100000}; INVALID_ARGUMENT naming the flag and the item.
absl::StatusOr<std::vector<uint64_t>> ParseSizes(const char* flag, const std::string& text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint64_t n = 0;
    double d = 0;
    if (absl::SimpleAtoi(item, &n)) {
      sizes.push_back(n);
    } else if (absl::SimpleAtod(item, &d) && d >= 1 && d < 0x1p63 && std::floor(d) == d) {
      sizes.push_back(static_cast<uint64_t>(d));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not a positive integer"));
    }
  }
  if (sizes.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty"));
  return sizes;
}

absl::StatusOr<std::unique_ptr<SamplerClient>> Connect(const char* flag,
                                                       const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is required"));
  ClientOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  return SamplerClient::Create(address, options);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "compare_backends: %s\n", s.ToString().c_str());
  return 2;
}

int TimeBoundaries() {
  absl::StatusOr<std::vector<uint64_t>> sizes =
      ParseSizes("boundary_n", absl::GetFlag(FLAGS_boundary_n));
  if (!sizes.ok()) return Fail(sizes.status());
  absl::StatusOr<std::unique_ptr<SamplerClient>> a = Connect("a", absl::GetFlag(FLAGS_a));
  if (!a.ok()) return Fail(a.status());
  for (uint64_t n : *sizes) {
    BoundaryOptions options;
    options.num_samples = n;
    options.samples_per_epoch = absl::GetFlag(FLAGS_boundary_m);
    options.world_size = absl::GetFlag(FLAGS_boundary_world_size);
    options.boundaries = absl::GetFlag(FLAGS_boundary_count);
    options.losses_per_rank = absl::GetFlag(FLAGS_boundary_losses_per_rank);
    options.job = absl::StrCat(absl::GetFlag(FLAGS_job_prefix), "-boundary-n", n);
    absl::StatusOr<BoundaryTiming> timing = TimeEpochBoundaries(**a, options);
    if (!timing.ok()) return Fail(timing.status());
    std::printf("%s\n", FormatBoundaryTiming(options, *timing).c_str());
    std::fflush(stdout);
  }
  return 0;
}

int Compare() {
  absl::StatusOr<std::vector<uint64_t>> sizes = ParseSizes("sizes", absl::GetFlag(FLAGS_sizes));
  if (!sizes.ok()) return Fail(sizes.status());
  absl::StatusOr<std::unique_ptr<SamplerClient>> a = Connect("a", absl::GetFlag(FLAGS_a));
  if (!a.ok()) return Fail(a.status());
  absl::StatusOr<std::unique_ptr<SamplerClient>> b = Connect("b", absl::GetFlag(FLAGS_b));
  if (!b.ok()) return Fail(b.status());
  CompareOptions options;
  options.sizes = *sizes;
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.job_prefix = absl::GetFlag(FLAGS_job_prefix);
  options.job_filter = absl::GetFlag(FLAGS_job_filter);
  options.testonly_b_seed_xor = absl::GetFlag(FLAGS_testonly_b_seed_xor);
  options.testonly_b_loss_changed = absl::GetFlag(FLAGS_testonly_b_loss_changed);
  options.log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  absl::StatusOr<CompareSummary> summary = CompareBackends(**a, **b, options);
  if (!summary.ok()) return Fail(summary.status());
  if (!summary->difference.empty()) {
    std::printf("DIFFERENCE %s (a=%s b=%s)\n", summary->difference.c_str(),
                summary->backend_a.c_str(), summary->backend_b.c_str());
    return 1;
  }
  std::printf("EQUAL jobs=%d indices=%llu (a=%s b=%s)\n", summary->jobs_compared,
              static_cast<unsigned long long>(summary->indices_compared),
              summary->backend_a.c_str(), summary->backend_b.c_str());
  return 0;
}

}  // namespace
}  // namespace gpu_e2e
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "compares two samplerd servers bit for bit, or times one's epoch boundary.\n"
      "  compare_backends --a=HOST:PORT --b=HOST:PORT [--sizes=1000,1e5] [--epochs=3]\n"
      "  compare_backends --a=HOST:PORT --boundary_n=1e8,1e9 [--boundary_count=3]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "compare_backends: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  if (!absl::GetFlag(FLAGS_boundary_n).empty()) return samplerd::gpu_e2e::TimeBoundaries();
  return samplerd::gpu_e2e::Compare();
}
