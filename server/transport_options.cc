#include "server/transport_options.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "grpc/compression.h"
#include "grpc/grpc.h"

namespace samplerd {
namespace {

// `d` in whole milliseconds for a channel argument (INT_MAX: gRPC's "infinite").
int Milliseconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return INT_MAX;
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT_MAX));
}

absl::Status CheckPositive(const char* field, absl::Duration value) {
  if (value > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", absl::FormatDuration(value), ": must be > 0"));
}

}  // namespace

absl::Status ValidateTransportOptions(const TransportOptions& options) {
  for (const auto& [field, value] :
       {std::pair{"keepalive_time", options.keepalive_time},
        std::pair{"keepalive_timeout", options.keepalive_timeout},
        std::pair{"min_client_ping_interval", options.min_client_ping_interval},
        std::pair{"max_connection_idle", options.max_connection_idle},
        std::pair{"handshake_timeout", options.handshake_timeout}}) {
    if (absl::Status s = CheckPositive(field, value); !s.ok()) return s;
  }
  const absl::Duration client_keepalive = absl::Milliseconds(v1::CLIENT_KEEPALIVE_TIME_MS);
  if (options.min_client_ping_interval > client_keepalive) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_client_ping_interval = ", absl::FormatDuration(options.min_client_ping_interval),
        ": must not exceed the clients' keepalive time (", absl::FormatDuration(client_keepalive),
        "), or every client's keepalive pings would be refused as ping abuse"));
  }
  return absl::OkStatus();
}

void ApplyTransportOptions(const TransportOptions& options, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              Milliseconds(options.keepalive_timeout));
  // On a server this also accepts the clients' pings while no call is in flight (they ping
  // idle connections too): without it such a ping is a strike.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The server's own pings go on while a stream waits without data (a rank waiting for the
  // next epoch's plan): gRPC's default stops after two pings without data.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              Milliseconds(options.min_client_ping_interval));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              Milliseconds(options.max_connection_idle));
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              Milliseconds(options.handshake_timeout));
  builder->SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE,
                                                options.accept_compressed_requests);
  builder->SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP,
                                                options.accept_compressed_requests);
}

}  // namespace samplerd
