// CheckResume and PositionsServedAgain on the test vectors that the Python client's tests run too
// (client/testdata/resume_cases.json, served_again_cases.json, read through protobuf's JSON parser
// into a Struct): the two clients decide every case alike. A failure names its case (SCOPED_TRACE
// of the case's name).
#include "client/cpp/resume_check.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;

// Bazel runs the test in its runfiles tree, where the file sits at its workspace path.
constexpr char kCases[] = "client/testdata/resume_cases.json";
constexpr char kServedAgainCases[] = "client/testdata/served_again_cases.json";

// Under ThreadSanitizer the system's libprotobuf (Debian's, not instrumented) hands this test
// google::protobuf::Struct maps that its instrumented inline Map code cannot read: reading or
// iterating any parsed Struct dies with SIGSEGV inside protobuf's map.h (an 8-line program that
// parses {"name": "x"} and reads fields().at("name") does the same; docs/HARDENING.md). No
// samplerd proto has a map field, so only this test's JSON reading is affected: it runs in
// every other build, ASan included.
#if defined(__SANITIZE_THREAD__)
#define SAMPLERD_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SAMPLERD_TSAN_BUILD 1
#endif
#endif
#ifndef SAMPLERD_TSAN_BUILD
#define SAMPLERD_TSAN_BUILD 0
#endif
constexpr char kUnreadableUnderTsan[] =
    "ThreadSanitizer build: the system libprotobuf's Struct maps are unreadable";

Struct ReadCases(const char* path = kCases) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  Struct cases;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &cases);
  EXPECT_TRUE(in.good() && parsed.ok()) << path << ": " << parsed.ToString();
  return cases;
}

// `field` of the case's `part` ("saved" / "server") if it has one, else of the default.
const Value& Field(const Struct& all, const Struct& c, const std::string& part,
                   const std::string& field) {
  const auto own = c.fields().find(part);
  if (own != c.fields().end() && own->second.struct_value().fields().contains(field)) {
    return own->second.struct_value().fields().at(field);
  }
  return all.fields().at(part + "_default").struct_value().fields().at(field);
}

ReaderPosition SavedOf(const Struct& all, const Struct& c) {
  ReaderPosition p;
  p.job = Field(all, c, "saved", "job").string_value();
  p.rank = static_cast<uint32_t>(Field(all, c, "saved", "rank").number_value());
  p.world_size = p.rank + 1;  // Not read by CheckResume (ReaderPosition::CheckOwner's).
  p.epoch = static_cast<uint64_t>(Field(all, c, "saved", "epoch").number_value());
  p.deal = static_cast<uint32_t>(Field(all, c, "saved", "deal").number_value());
  p.position = static_cast<uint64_t>(Field(all, c, "saved", "position").number_value());
  const Value& length = Field(all, c, "saved", "length");
  if (length.kind_case() == Value::kNumberValue) {
    p.shard_length = static_cast<uint64_t>(length.number_value());
  }
  return p;
}

ServerProgress ServerOf(const Struct& all, const Struct& c) {
  ServerProgress s;
  s.current_epoch = static_cast<uint64_t>(Field(all, c, "server", "current_epoch").number_value());
  s.current_deal = static_cast<uint32_t>(Field(all, c, "server", "current_deal").number_value());
  for (const Value& e : Field(all, c, "server", "rewindable_epochs").list_value().values()) {
    s.rewindable_epochs.push_back(static_cast<uint64_t>(e.number_value()));
  }
  s.indices_streamed =
      static_cast<uint64_t>(Field(all, c, "server", "indices_streamed").number_value());
  return s;
}

std::vector<std::string> Strings(const Struct& expect, const std::string& key) {
  std::vector<std::string> out;
  const auto it = expect.fields().find(key);
  if (it == expect.fields().end()) return out;
  for (const Value& v : it->second.list_value().values()) out.push_back(v.string_value());
  return out;
}

void RunCase(const Struct& all, const Struct& c) {
  const absl::StatusOr<ResumeAt> decided = CheckResume(SavedOf(all, c), ServerOf(all, c));
  const Value& expect = c.fields().at("expect");
  if (expect.kind_case() == Value::kStringValue) {
    ASSERT_TRUE(decided.ok()) << decided.status();
    EXPECT_EQ(*decided, expect.string_value() == "next_epoch" ? ResumeAt::kNextEpoch
                                                              : ResumeAt::kPosition);
    EXPECT_TRUE(expect.string_value() == "next_epoch" || expect.string_value() == "position")
        << expect.string_value();
    return;
  }
  const Struct& refusal = expect.struct_value();
  ASSERT_FALSE(decided.ok()) << "resumes; expected " << refusal.fields().at("code").string_value();
  EXPECT_EQ(absl::StatusCodeToString(decided.status().code()),
            refusal.fields().at("code").string_value());
  const std::string message(decided.status().message());
  for (const std::string& key : {"says", "says_cpp"}) {
    for (const std::string& part : Strings(refusal, key)) {
      EXPECT_THAT(message, ::testing::HasSubstr(part));
    }
  }
  for (const std::string& part : Strings(refusal, "says_not")) {
    EXPECT_THAT(message, ::testing::Not(::testing::HasSubstr(part)));
  }
}

TEST(ResumeCheckTest, EveryCaseOfTheSharedVectors) {
  if (SAMPLERD_TSAN_BUILD) GTEST_SKIP() << kUnreadableUnderTsan;
  const Struct all = ReadCases();
  const auto& cases = all.fields().at("cases").list_value().values();
  ASSERT_GE(cases.size(), 20u);  // The file, not an empty stand-in.
  for (const Value& c : cases) {
    SCOPED_TRACE(c.struct_value().fields().at("name").string_value());
    RunCase(all, c.struct_value());
  }
}

TEST(ResumeCheckTest, EveryServedAgainCaseOfTheSharedVectors) {
  if (SAMPLERD_TSAN_BUILD) GTEST_SKIP() << kUnreadableUnderTsan;
  const Struct all = ReadCases(kServedAgainCases);
  const auto& cases = all.fields().at("cases").list_value().values();
  ASSERT_GE(cases.size(), 8u);  // The file, not an empty stand-in.
  bool counted = false;
  for (const Value& value : cases) {
    const Struct& c = value.struct_value();
    SCOPED_TRACE(c.fields().at("name").string_value());
    ServerProgress server;
    server.current_epoch =
        static_cast<uint64_t>(Field(all, c, "server", "current_epoch").number_value());
    server.current_deal =
        static_cast<uint32_t>(Field(all, c, "server", "current_deal").number_value());
    server.losses_accepted =
        static_cast<uint64_t>(Field(all, c, "server", "losses_accepted").number_value());
    const auto epoch = static_cast<uint64_t>(Field(all, c, "start", "epoch").number_value());
    const auto deal = static_cast<uint32_t>(Field(all, c, "start", "deal").number_value());
    const auto expected = static_cast<uint64_t>(c.fields().at("served_again").number_value());
    EXPECT_EQ(PositionsServedAgain(epoch, deal, server), expected);
    counted = counted || expected > 0;
  }
  EXPECT_TRUE(counted);  // A file that lost its counted cases would test only the zeros.
}

}  // namespace
}  // namespace samplerd
