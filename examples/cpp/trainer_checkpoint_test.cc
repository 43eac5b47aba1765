#include "examples/cpp/trainer_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::HasSubstr;

std::string TestPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

TrainerCheckpoint Sample() {
  TrainerCheckpoint c;
  c.position.job = "train";
  c.position.epoch = 2;
  c.position.rank = 1;
  c.position.world_size = 2;
  c.position.position = 150;
  c.position.shard_length = 1000;
  c.model = std::string("w=0x1.8p-1\n\0binary", 18);
  return c;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(TrainerCheckpointTest, RoundTripsAndReplacesThePreviousFile) {
  const std::string path = TestPath("round_trip");
  TrainerCheckpoint first = Sample();
  ASSERT_TRUE(SaveTrainerCheckpoint(path, first).ok());
  TrainerCheckpoint second = Sample();
  second.position.position = 300;
  second.model = "other";
  ASSERT_TRUE(SaveTrainerCheckpoint(path, second).ok());
  absl::StatusOr<TrainerCheckpoint> loaded = LoadTrainerCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->position, second.position);
  EXPECT_EQ(loaded->model, "other");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ASSERT_TRUE(SaveTrainerCheckpoint(path, first).ok());
  loaded = LoadTrainerCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model, first.model);  // Bytes, a NUL and newlines included.
}

TEST(TrainerCheckpointTest, NoFileIsNotFound) {
  absl::StatusOr<TrainerCheckpoint> loaded = LoadTrainerCheckpoint(TestPath("absent"));
  EXPECT_TRUE(absl::IsNotFound(loaded.status())) << loaded.status();
}

TEST(TrainerCheckpointTest, DamagedFilesAreDataLossNamingPathAndWhat) {
  const std::string path = TestPath("damaged");
  const std::string position = Sample().position.Serialize();
  const struct {
    std::string bytes;
    std::string what;
  } cases[] = {
      {"", "first line"},
      {"samplerd.TrainerCheckpoint version=2\n", "first line"},
      {"samplerd.TrainerCheckpoint version=1\n", "no position line"},
      {"samplerd.TrainerCheckpoint version=1\nsamplerd.ReaderPosition version=3 job=\n",
       "job"},
      {absl::StrCat("samplerd.TrainerCheckpoint version=1\n", position, "\n"), "model_bytes"},
      {absl::StrCat("samplerd.TrainerCheckpoint version=1\n", position, "\nmodel_bytes=x\n"),
       "model_bytes"},
      {absl::StrCat("samplerd.TrainerCheckpoint version=1\n", position, "\nmodel_bytes=5\nabc"),
       "model_bytes=5 but 3 bytes follow"},
  };
  for (const auto& c : cases) {
    WriteRaw(path, c.bytes);
    absl::StatusOr<TrainerCheckpoint> loaded = LoadTrainerCheckpoint(path);
    EXPECT_TRUE(absl::IsDataLoss(loaded.status())) << c.bytes << ": " << loaded.status();
    EXPECT_THAT(loaded.status().message(), HasSubstr(path)) << c.bytes;
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.what)) << c.bytes;
  }
}

TEST(TrainerCheckpointTest, AnUnwritableDirectoryNamesThePathAndLeavesNothing) {
  const std::string path = TestPath("no_such_dir/checkpoint");
  absl::Status saved = SaveTrainerCheckpoint(path, Sample());
  EXPECT_FALSE(saved.ok());
  EXPECT_THAT(saved.message(), HasSubstr(path));
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
