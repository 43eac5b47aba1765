#include "server/metrics/http_exporter.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace samplerd {
namespace metrics {
namespace {

// host:port, with an IPv6 literal in brackets.
std::string JoinHostPort(const std::string& host, int port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return bare_ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// CivetWeb's own messages (a failed bind, a broken connection) go to the server's log.
int LogCivetWebMessage(const mg_connection*, const char* message) {
  LOG(WARNING) << "metrics http: " << message;
  return 1;  // Handled: CivetWeb prints nothing itself.
}

// The token of an `Authorization: Bearer <token>` header (RFC 6750: the scheme is
// case-insensitive), or "" without one.
absl::string_view BearerToken(const char* header) {
  constexpr absl::string_view kScheme = "bearer ";
  const absl::string_view value = header == nullptr ? "" : header;
  if (!absl::StartsWithIgnoreCase(value, kScheme)) return "";
  return absl::StripAsciiWhitespace(value.substr(kScheme.size()));
}

// 401 with the scheme to use (the token presented, if any, is not repeated).
void SendUnauthorized(mg_connection* connection) {
  constexpr absl::string_view kBody =
      "401 Unauthorized: /metrics needs \"Authorization: Bearer <token>\" with the token of "
      "samplerd's --metrics_token_file (Prometheus: authorization.credentials_file)\n";
  mg_printf(connection,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"samplerd metrics\"\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            kBody.size());
  mg_write(connection, kBody.data(), kBody.size());
}

}  // namespace

HttpExporter::HttpExporter(std::string host, std::vector<const Registry*> registries,
                           Authorize authorize)
    : host_(std::move(host)),
      registries_(std::move(registries)),
      authorize_(std::move(authorize)) {}

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(
    const std::string& host, int port, std::vector<const Registry*> registries,
    Authorize authorize) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port = ", port, ": must be 0..65535 (or -1: no metrics)"));
  }
  if (host.empty()) return absl::InvalidArgumentError("metrics_host = \"\": must not be empty");
  // Debian's libcivetweb is built without IPv6: say so rather than CivetWeb's "Failed to setup
  // server ports" (e.g. --host=:: leaves --metrics_host to be set to an IPv4 address).
  if (host.find(':') != std::string::npos && mg_check_feature(MG_FEATURES_IPV6) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_host = \"", host,
        "\": this samplerd's CivetWeb has no IPv6 support; give --metrics_host an IPv4 address "
        "(e.g. 0.0.0.0 or 127.0.0.1)"));
  }
  static std::once_flag library_initialized;
  std::call_once(library_initialized, [] { mg_init_library(0); });

  std::unique_ptr<HttpExporter> exporter(
      new HttpExporter(host, std::move(registries), std::move(authorize)));
  const std::string address = JoinHostPort(host, port);
  // One scrape at a time is the normal load; the other workers are for clients that are slow
  // (or hostile) to send their request: CivetWeb's request_timeout_ms bounds the whole wait
  // for the headers. Connections are closed after each request (no keep-alive threads).
  const std::string threads = absl::StrCat(kWorkerThreads);
  const std::string timeout_ms = absl::StrCat(absl::ToInt64Milliseconds(kRequestTimeout));
  const char* options[] = {
      "listening_ports",  address.c_str(),     "num_threads", threads.c_str(), "request_timeout_ms",
      timeout_ms.c_str(), "enable_keep_alive", "no",          nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &LogCivetWebMessage;
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = exporter.get();
  init.configuration_options = options;
  char error_text[256] = "";
  mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  exporter->context_ = mg_start2(&init, &error);
  if (exporter->context_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, " (--metrics_host, --metrics_port): ",
                     error_text[0] != '\0' ? error_text : "CivetWeb could not start"));
  }
  mg_server_port ports[1];
  if (mg_get_server_ports(exporter->context_, 1, ports) != 1 || ports[0].port <= 0) {
    return absl::InternalError(absl::StrCat("metrics: no port bound on ", address));
  }
  exporter->port_ = ports[0].port;
  mg_set_request_handler(exporter->context_, "/metrics$", &HttpExporter::HandleMetrics,
                         exporter.get());
  return exporter;
}

HttpExporter::~HttpExporter() {
  if (context_ != nullptr) mg_stop(context_);  // Joins the workers: no handler runs after.
}

std::string HttpExporter::url() const {
  return absl::StrCat("http://", JoinHostPort(host_, port_), "/metrics");
}

int HttpExporter::HandleMetrics(mg_connection* connection, void* data) {
  const auto* exporter = static_cast<const HttpExporter*>(data);
  const mg_request_info* request = mg_get_request_info(connection);
  if (exporter->authorize_ != nullptr) {
    const absl::string_view token = BearerToken(mg_get_header(connection, "Authorization"));
    if (token.empty() || !exporter->authorize_(token)) {
      SendUnauthorized(connection);
      return 401;
    }
  }
  const bool head = std::strcmp(request->request_method, "HEAD") == 0;
  if (!head && std::strcmp(request->request_method, "GET") != 0) {
    mg_send_http_error(connection, 405, "%s is not allowed on /metrics; use GET\n",
                       request->request_method);
    return 405;
  }
  std::string body;
  for (const Registry* registry : exporter->registries_) body += registry->Render();
  mg_send_http_ok(connection, kTextContentType, static_cast<long long>(body.size()));
  if (!head) mg_write(connection, body.data(), body.size());
  return 200;
}

}  // namespace metrics
}  // namespace samplerd
