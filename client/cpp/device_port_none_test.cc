// The CPU-only device port: every device path says, with FAILED_PRECONDITION, that this library
// has none and which one has (a trainer calling NextToDevice or ReportFromDevice on it learns the
// fix at once).
#include <memory>

#include "client/cpp/device_port.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace device_port {
namespace {

void ExpectNamesTheFix(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("CPU-only"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("//client/cpp:trainer "), absl::string_view::npos) << s;
}

TEST(DevicePortNoneTest, EveryDevicePathSaysThereIsNone) {
  ExpectNamesTheFix(Available());
  ExpectNamesTheFix(NewUploader(3).status());
  ExpectNamesTheFix(NewLossStaging(4, 1024).status());
}

}  // namespace
}  // namespace device_port
}  // namespace samplerd
