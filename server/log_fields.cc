#include "server/log_fields.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace samplerd {

std::string LogValue(absl::string_view value) {
  const bool bare = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == ':' || c == '/' || c == '+' ||
           c == '-';
  });
  if (bare) return std::string(value);
  return absl::StrCat("\"", absl::CEscape(value), "\"");
}

}  // namespace samplerd
