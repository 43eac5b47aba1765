// Options of an in-process server for tests: a free port (read back with Server::port()) on
// loopback, plaintext. Tests of TLS set the tls_* fields and clear `plaintext` themselves.
#ifndef SAMPLERD_SERVER_TESTING_TEST_SERVER_OPTIONS_H_
#define SAMPLERD_SERVER_TESTING_TEST_SERVER_OPTIONS_H_

#include "server/server.h"

namespace samplerd {
namespace testutil {

inline Options LoopbackTestOptions() {
  Options options;
  options.port = 0;
  options.plaintext = true;  // Loopback only (Options::host's default 127.0.0.1).
  return options;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_TEST_SERVER_OPTIONS_H_
