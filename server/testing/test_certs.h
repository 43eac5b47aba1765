// Certificates for TLS tests, made by openssl at test time (tests/make_test_certs.sh; a target
// using this needs it in `data`, which :test_certs_testutil brings).
#ifndef SAMPLERD_SERVER_TESTING_TEST_CERTS_H_
#define SAMPLERD_SERVER_TESTING_TEST_CERTS_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace testutil {

// Runs tests/make_test_certs.sh into `dir` (which must exist); file names as the script lists
// them. A failure of the script fails the test (call it in ASSERT_NO_FATAL_FAILURE).
inline void MakeTestCerts(const std::string& dir) {
  // Bazel runs a test in its runfiles tree, where the script sits at its workspace path.
  const std::string command = absl::StrCat("bash tests/make_test_certs.sh '", dir, "'");
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed (is openssl installed?)";
}

// "<dir>/<name>.pem" and "<dir>/<name>.key".
inline std::string CertPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name, ".pem");
}
inline std::string KeyPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name, ".key");
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_TEST_CERTS_H_
