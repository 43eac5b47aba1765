// The exporter over real HTTP on a free port, fetched with CivetWeb's client.
#include "server/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace metrics {
namespace {

using ::testing::HasSubstr;

struct Response {
  int status = 0;
  std::string content_type;
  std::string body;
};

// One HTTP request to 127.0.0.1:port; status 0 if the connection failed or no response came
// within `timeout_ms`.
Response Fetch(int port, const std::string& method, const std::string& path,
               const std::string& extra_headers = "", int timeout_ms = 10000) {
  char error[256] = "";
  mg_connection* connection =
      mg_connect_client("127.0.0.1", port, /*use_ssl=*/0, error, sizeof(error));
  Response response;
  if (connection == nullptr) {
    ADD_FAILURE() << "connect: " << error;
    return response;
  }
  mg_printf(connection, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n",
            method.c_str(), path.c_str(), extra_headers.c_str());
  if (mg_get_response(connection, error, sizeof(error), timeout_ms) < 0) {
    ADD_FAILURE() << "response: " << error;
  } else {
    const mg_response_info* info = mg_get_response_info(connection);
    response.status = info->status_code;
    for (int i = 0; i < info->num_headers; ++i) {
      if (std::string(info->http_headers[i].name) == "Content-Type") {
        response.content_type = info->http_headers[i].value;
      }
    }
    char buffer[4096];
    for (int n; (n = mg_read(connection, buffer, sizeof(buffer))) > 0;)
      response.body.append(buffer, n);
  }
  mg_close_connection(connection);
  return response;
}

TEST(HttpExporterTest, ServesEveryRegistryOnAFreePort) {
  Registry a, b;
  auto counter = a.AddCounter("test_a_total", "A.")->WithLabels({});
  b.AddGauge("test_b", "B.")->WithLabels({})->Set(7);
  auto exporter = HttpExporter::Start("127.0.0.1", 0, {&a, &b});
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const int port = (*exporter)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*exporter)->url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");

  counter->Increment(3);
  Response r = Fetch(port, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, kTextContentType);
  EXPECT_EQ(r.body, a.Render() + b.Render());
  EXPECT_THAT(r.body, HasSubstr("test_a_total 3\n"));
  EXPECT_THAT(r.body, HasSubstr("test_b 7\n"));
  // Rendered at each request.
  counter->Increment();
  EXPECT_THAT(Fetch(port, "GET", "/metrics").body, HasSubstr("test_a_total 4\n"));

  EXPECT_EQ(Fetch(port, "HEAD", "/metrics").body, "");
  EXPECT_EQ(Fetch(port, "POST", "/metrics").status, 405);
  EXPECT_EQ(Fetch(port, "GET", "/").status, 404);
  EXPECT_EQ(Fetch(port, "GET", "/metrics/x").status, 404);
}

TEST(HttpExporterTest, BadAddressesAreRefusedNamingTheFlag) {
  Registry registry;
  auto bad_port = HttpExporter::Start("127.0.0.1", 70000, {&registry});
  EXPECT_EQ(bad_port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_port.status().message()), HasSubstr("metrics_port = 70000"));
  auto empty_host = HttpExporter::Start("", 0, {&registry});
  EXPECT_EQ(empty_host.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty_host.status().message()), HasSubstr("metrics_host"));

  if (mg_check_feature(MG_FEATURES_IPV6) == 0) {
    auto ipv6 = HttpExporter::Start("::1", 0, {&registry});
    EXPECT_EQ(ipv6.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ipv6.status().message()), HasSubstr("metrics_host = \"::1\""));
  }

  // A port already taken.
  auto first = HttpExporter::Start("127.0.0.1", 0, {&registry});
  ASSERT_TRUE(first.ok());
  auto second = HttpExporter::Start("127.0.0.1", (*first)->port(), {&registry});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("127.0.0.1:" + std::to_string((*first)->port())));
}

TEST(HttpExporterTest, WithAnAuthorizeFunctionOnlyAcceptedBearerTokensGetTheMetrics) {
  Registry registry;
  registry.AddGauge("test_secret", "S.")->WithLabels({})->Set(1);
  auto exporter = HttpExporter::Start("127.0.0.1", 0, {&registry},
                                      [](absl::string_view token) { return token == "right"; });
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const int port = (*exporter)->port();
  for (const char* headers : {"", "Authorization: Bearer wrong\r\n",
                              "Authorization: Basic right\r\n", "Authorization: Bearer \r\n"}) {
    Response r = Fetch(port, "GET", "/metrics", headers);
    EXPECT_EQ(r.status, 401) << headers;
    EXPECT_THAT(r.body, ::testing::Not(HasSubstr("test_secret"))) << headers;
    EXPECT_THAT(r.body, HasSubstr("--metrics_token_file")) << headers;
  }
  EXPECT_THAT(Fetch(port, "GET", "/metrics", "Authorization: bearer right\r\n").body,
              HasSubstr("test_secret 1\n"));
}

// A socket to 127.0.0.1:port that has sent the start of a request, or -1.
int OpenSlowRequest(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  constexpr char kStart[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  (void)!::send(fd, kStart, sizeof(kStart) - 1, MSG_NOSIGNAL);
  return fd;
}

// Ten clients trickle their headers, a byte every 50 ms, reconnecting when dropped (as an
// attacker would); a scrape still gets its answer at once, every time.
TEST(HttpExporterTest, TenSlowClientsDoNotBlindTheEndpoint) {
  Registry registry;
  registry.AddGauge("test_up", "U.")->WithLabels({})->Set(1);
  auto exporter = HttpExporter::Start("127.0.0.1", 0, {&registry});
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const int port = (*exporter)->port();
  constexpr int kSlowClients = 10;
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    std::vector<int> sockets(kSlowClients, -1);
    while (!stop.load()) {
      for (int& fd : sockets) {
        if (fd < 0) fd = OpenSlowRequest(port);
        if (fd >= 0 && ::send(fd, "x", 1, MSG_NOSIGNAL) != 1) {
          ::close(fd);
          fd = -1;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (int fd : sockets) {
      if (fd >= 0) ::close(fd);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // All ten hold a connection.
  int answered = 0;
  constexpr int kScrapes = 11;
  for (int i = 0; i < kScrapes; ++i) {
    Response r = Fetch(port, "GET", "/metrics", "", /*timeout_ms=*/4000);
    if (r.status == 200 && r.body.find("test_up 1") != std::string::npos) ++answered;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  trickler.join();
  EXPECT_EQ(answered, kScrapes);
}

TEST(HttpExporterTest, StopsServingWhenDestroyed) {
  Registry registry;
  int port = 0;
  {
    auto exporter = HttpExporter::Start("127.0.0.1", 0, {&registry});
    ASSERT_TRUE(exporter.ok());
    port = (*exporter)->port();
  }
  char error[256] = "";
  mg_connection* connection = mg_connect_client("127.0.0.1", port, 0, error, sizeof(error));
  EXPECT_EQ(connection, nullptr);
  if (connection != nullptr) mg_close_connection(connection);
}

}  // namespace
}  // namespace metrics
}  // namespace samplerd
