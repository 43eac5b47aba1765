// HttpExporter: serves metrics registries to Prometheus over HTTP (GET /metrics), with CivetWeb
// (Debian's libcivetweb, the embedded server prometheus-cpp uses too).
//
// The response is the text of every registry given, rendered at each request and concatenated
// (their families must have distinct names). Other paths answer 404, other methods than GET and
// HEAD 405. With an `authorize` function, a request must carry `Authorization: Bearer <token>`
// with a token it accepts (401 otherwise, the token never logged): the metrics name every job.
//
// Slow clients: kWorkerThreads workers serve requests, and a request whose headers have not all
// arrived within kRequestTimeout is dropped, so clients trickling their headers cannot take every
// worker (a scrape still succeeds while kWorkerThreads - 2 of them hold connections).
//
// Thread-safe: CivetWeb's worker threads render concurrently (Registry::Render is thread-safe).
// The registries must outlive the exporter; the destructor stops serving and joins the workers.
#ifndef SAMPLERD_SERVER_METRICS_HTTP_EXPORTER_H_
#define SAMPLERD_SERVER_METRICS_HTTP_EXPORTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/metrics/registry.h"

struct mg_context;
struct mg_connection;

namespace samplerd {
namespace metrics {

class HttpExporter {
 public:
  static constexpr int kWorkerThreads = 32;
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(5);

  // Whether a bearer token may read the metrics. Called concurrently; must be thread-safe.
  using Authorize = std::function<bool(absl::string_view token)>;

  // Listens on host:port (an IPv4 literal or a name CivetWeb resolves; IPv6 only if CivetWeb
  // was built with it, which Debian's is not; port 0 picks a free one). INVALID_ARGUMENT for a
  // port out of 0..65535, an empty host or an IPv6 host without IPv6 support, UNAVAILABLE when
  // the address cannot be bound (CivetWeb's reason in the message). `authorize`: see the file
  // comment; null serves everyone.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      const std::string& host, int port, std::vector<const Registry*> registries,
      Authorize authorize = nullptr);
  ~HttpExporter();

  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // The bound port (the chosen one for port 0).
  int port() const { return port_; }
  // http://host:port/metrics (an IPv6 host in brackets).
  std::string url() const;

 private:
  HttpExporter(std::string host, std::vector<const Registry*> registries, Authorize authorize);
  static int HandleMetrics(mg_connection* connection, void* exporter);

  const std::string host_;
  const std::vector<const Registry*> registries_;
  const Authorize authorize_;  // Null: no token needed.
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace metrics
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METRICS_HTTP_EXPORTER_H_
