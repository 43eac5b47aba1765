// Fuzz target: the parser of --auth_tokens_file (token_table.h) on arbitrary text. Checks,
// beyond "no crash, no sanitizer report": an error names the source and a line and never quotes
// the file (a token must not reach a log); a table that parses finds none of the grant keywords
// as a token.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "fuzz/fuzz_util.h"
#include "server/auth/token_table.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  samplerd::fuzz::WriteSeedsIfAsked([] {
    samplerd::fuzz::WriteSeed("admin_and_jobs",
                              "# token                              grant\n"
                              "3f9c1a7e0b5d4c2a8e6f1d9b7a5c3e1f     admin\n"
                              "a1b2c3d4e5f60718293a4b5c6d7e8f90     jobs=train,eval\n");
    samplerd::fuzz::WriteSeed("blank_and_comments", "\n# only comments\n\n   \n");
    samplerd::fuzz::WriteSeed("swapped_columns", "admin 3f9c1a7e0b5d4c2a8e6f1d9b7a5c3e1f\n");
    samplerd::fuzz::WriteSeed("duplicate_token",
                              "0123456789abcdef0123 admin\n0123456789abcdef0123 jobs=a\n");
    samplerd::fuzz::WriteSeed("crlf_tabs", "0123456789abcdefXYZ\tjobs=a.b,c-d_e\r\n");
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT: a fuzz target's entry point.
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens.txt");
  if (!table.ok()) {
    const std::string message(table.status().message());
    SAMPLERD_FUZZ_CHECK(absl::StartsWith(message, "tokens.txt"), message);
    // The message quotes no field of the file: no field of 16 or more letters and digits (what
    // a token usually is; a token is at least 16 characters) appears in it. Fields with other
    // characters are left out: the fuzzer copies the message's own text into the file.
    for (absl::string_view rest = text; !rest.empty();) {
      size_t start = rest.find_first_not_of(" \t\r\n");
      if (start == absl::string_view::npos) break;
      rest.remove_prefix(start);
      size_t end = rest.find_first_of(" \t\r\n");
      absl::string_view field = rest.substr(0, end);
      rest.remove_prefix(end == absl::string_view::npos ? rest.size() : end);
      if (field.size() >= 16 &&
          std::all_of(field.begin(), field.end(), [](char c) { return absl::ascii_isalnum(c); })) {
        SAMPLERD_FUZZ_CHECK(!absl::StrContains(message, field), message);
      }
    }
    return 0;
  }
  SAMPLERD_FUZZ_CHECK(table->Find("admin") == nullptr, "'admin' found as a token");
  return 0;
}
