// ShardReader in separate processes against the real samplerd binary: three rank processes read
// their shards while samplerd is SIGKILLed and restarted on the same port and --data_dir; one rank
// also checkpoints its position, exits, and a new process resumes from the saved text. Every
// shard must come out complete, in order and equal to SamplerClient::ReadShard's, and together
// they must be the plan. The ranks retry for ~1.55 s (5 retries; the default retries for 300 s):
// shorter than gRPC's 5 s backup poller, so that a client that did not drive its reconnection
// while backing off sees the restarted server too late and fails here.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "gtest/gtest.h"
#include "tests/samplerd_process.h"

namespace samplerd {
namespace {

constexpr char kSamplerd[] = "server/samplerd";
constexpr char kTool[] = "tests/shard_reader_tool";

pid_t Spawn(std::vector<std::string> args) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(kTool, argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<uint64_t> ReadIndices(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint64_t> indices(bytes.size() / sizeof(uint64_t));
  std::memcpy(indices.data(), bytes.data(), indices.size() * sizeof(uint64_t));
  return indices;
}

TEST(ShardReaderProcessTest, RankProcessesRideThroughASamplerdCrashAndResumeFromCheckpoints) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/shard_reader_process_test");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/data");
  const std::vector<std::string> flags = {"--data_dir=" + dir + "/data"};
  auto samplerd = std::make_unique<testutil::SamplerdProcess>(kSamplerd, 0, flags);
  ASSERT_FALSE(samplerd->address().empty()) << "no 'samplerd listening on' line";
  const int port = samplerd->port();
  ASSERT_GT(port, 0);

  const uint64_t n = 60'000;
  const uint32_t world = 3;
  auto client = *SamplerClient::Create(samplerd->address());
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_world_size(world);
  spec.set_seed(9);
  ASSERT_TRUE(client->CreateJob("p", spec).ok());
  std::vector<std::vector<uint64_t>> expected(world);
  for (uint32_t r = 0; r < world; ++r) {
    auto shard = client->ReadShard("p", 0, r, world);
    ASSERT_TRUE(shard.ok()) << shard.status();
    expected[r] = *std::move(shard);
  }

  // 20000 indices per rank in batches of 200, 3 ms a step: ~0.3 s per rank, with a queue of
  // 2000 refilled again and again.
  auto args = [&](uint32_t r) {
    return std::vector<std::string>{kTool,
                                    "--address=" + samplerd->address(),
                                    "--max_retries=5",
                                    "--job=p",
                                    absl::StrCat("--rank=", r),
                                    absl::StrCat("--world_size=", world),
                                    "--batch=200",
                                    "--pace_us=3000",
                                    absl::StrCat("--out=", dir, "/rank", r)};
  };
  std::vector<pid_t> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    std::vector<std::string> a = args(r);
    if (r == 0) {  // Checkpoints and dies after a third of its shard.
      a.push_back("--stop_after=7000");
      a.push_back("--position_file=" + dir + "/rank0.position");
    }
    ranks.push_back(Spawn(a));
  }
  absl::SleepFor(absl::Milliseconds(120));
  // A crash in the middle of every rank's shard.
  for (uint32_t r = 1; r < world; ++r) {
    ASSERT_EQ(waitpid(ranks[r], nullptr, WNOHANG), 0) << "rank " << r << " was done too soon";
  }
  const int killed = samplerd->Signal(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL);
  absl::SleepFor(absl::Milliseconds(200));
  samplerd = std::make_unique<testutil::SamplerdProcess>(kSamplerd, port, flags);
  ASSERT_EQ(samplerd->port(), port) << "samplerd did not come back on port " << port;

  EXPECT_EQ(Wait(ranks[0]), 0) << "rank 0 (until its checkpoint)";
  std::ifstream position(dir + "/rank0.position");
  const std::string saved((std::istreambuf_iterator<char>(position)),
                          std::istreambuf_iterator<char>());
  EXPECT_NE(saved.find(" position=7000"), std::string::npos) << saved;
  std::vector<std::string> resumed = args(0);
  resumed.push_back("--resume_from=" + dir + "/rank0.position");
  EXPECT_EQ(Wait(Spawn(resumed)), 0) << "rank 0 (resumed)";
  for (uint32_t r = 1; r < world; ++r) EXPECT_EQ(Wait(ranks[r]), 0) << "rank " << r;

  std::set<uint64_t> plan;
  for (uint32_t r = 0; r < world; ++r) {
    const std::vector<uint64_t> read = ReadIndices(absl::StrCat(dir, "/rank", r));
    EXPECT_EQ(read, expected[r]) << "rank " << r;
    plan.insert(read.begin(), read.end());
  }
  EXPECT_EQ(plan.size(), n);
  samplerd.reset();  // Before removing the directory it may still write into.
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace samplerd
