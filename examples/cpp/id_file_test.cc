#include "examples/cpp/id_file.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// 128 bytes with NULs inside, like an ncclUniqueId.
std::string IdBytes() {
  std::string bytes(128, '\0');
  for (size_t i = 0; i < bytes.size(); i += 3) bytes[i] = static_cast<char>(i);
  return bytes;
}

TEST(IdFileTest, ReadReturnsWhatWasPublished) {
  const std::string path = TempPath("roundtrip.id");
  ASSERT_TRUE(RemoveIdFile(path).ok());
  ASSERT_TRUE(PublishIdFile(path, IdBytes()).ok());
  absl::StatusOr<std::string> read = ReadIdFile(path, 128, absl::Seconds(1));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, IdBytes());
  ASSERT_TRUE(RemoveIdFile(path).ok());
  ASSERT_TRUE(RemoveIdFile(path).ok());  // Already gone: fine.
}

TEST(IdFileTest, ReaderWaitsForALatePublisher) {
  const std::string path = TempPath("late.id");
  ASSERT_TRUE(RemoveIdFile(path).ok());
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(PublishIdFile(path, IdBytes()).ok());
  });
  absl::StatusOr<std::string> read = ReadIdFile(path, 128, absl::Seconds(10));
  publisher.join();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, IdBytes());
}

TEST(IdFileTest, RefusesToPublishOverAnExistingFile) {
  const std::string path = TempPath("stale.id");
  ASSERT_TRUE(RemoveIdFile(path).ok());
  ASSERT_TRUE(PublishIdFile(path, IdBytes()).ok());
  const absl::Status s = PublishIdFile(path, std::string(128, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(*ReadIdFile(path, 128, absl::Seconds(1)), IdBytes());  // Unchanged.
}

TEST(IdFileTest, ReadTimesOutNamingThePath) {
  const std::string path = TempPath("never.id");
  ASSERT_TRUE(RemoveIdFile(path).ok());
  const absl::Status s = ReadIdFile(path, 128, absl::Milliseconds(100)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(IdFileTest, ReadRefusesAFileOfTheWrongSize) {
  const std::string path = TempPath("short.id");
  ASSERT_TRUE(RemoveIdFile(path).ok());
  ASSERT_TRUE(PublishIdFile(path, "short").ok());
  const absl::Status s = ReadIdFile(path, 128, absl::Seconds(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("has 5 bytes, expected 128"));
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
