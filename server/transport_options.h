// TransportOptions: how samplerd's gRPC server treats its connections -- keepalive pings,
// the clients' pings it accepts, idle connections, slow handshakes, and which compressed
// requests it decodes (docs/OPERATIONS.md, "Connections across real networks").
//
// Why: training ranks hold connections for days across NATs, load balancers and switches that
// may forget a flow without a reset. The clients ping (client/cpp/sampler_client.h,
// client/python/samplerd/client.py) and must not be told "too_many_pings" for it; the server
// pings too, so that a rank that vanished frees its calls; a connection that carries no call is
// closed after max_connection_idle (it costs a file descriptor and needs no token to open).
//
// Requests may not be compressed: samplerd's clients never compress, and gRPC 1.51 inflates a
// compressed message whole before it checks its size against --max_message_bytes (a 1 MB gzip
// request became 1 GiB of memory and seconds of CPU, with no token). With only `identity`
// enabled, a compressed request is refused (UNIMPLEMENTED) before its message is decoded.
//
// A plain struct with a validating and an applying function; thread-compatible.
#ifndef SAMPLERD_SERVER_TRANSPORT_OPTIONS_H_
#define SAMPLERD_SERVER_TRANSPORT_OPTIONS_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

struct TransportOptions {
  // The server pings a connection after keepalive_time without activity and closes it when the
  // ping is not acknowledged within keepalive_timeout (its calls end, their resources are
  // freed). Both > 0.
  absl::Duration keepalive_time = absl::Seconds(20);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // The shortest interval between a client's pings the server accepts (with or without calls
  // in flight): pings more frequent than this are strikes, and two strikes close the connection
  // with GOAWAY "too_many_pings". Must not exceed the clients' keepalive time
  // (v1::CLIENT_KEEPALIVE_TIME_MS, 10 s). > 0.
  absl::Duration min_client_ping_interval = absl::Milliseconds(v1::SERVER_MIN_PING_INTERVAL_MS);
  // A connection with no call in flight for this long is closed (GOAWAY; a client reconnects on
  // its next call). > 0; absl::InfiniteDuration() keeps idle connections open.
  absl::Duration max_connection_idle = absl::Minutes(2);
  // A connection that has not completed its TLS handshake and sent its HTTP/2 settings within
  // this time is closed. > 0.
  absl::Duration handshake_timeout = absl::Seconds(20);
  // Accept compressed requests (gzip, deflate). Off: no client of samplerd compresses, and
  // gRPC 1.51 would inflate a message whole before checking its size.
  bool accept_compressed_requests = false;
};

// INVALID_ARGUMENT naming the field and its value for an out-of-range option; also when
// min_client_ping_interval exceeds the clients' default keepalive time, which would make every
// default client's pings strikes.
absl::Status ValidateTransportOptions(const TransportOptions& options);

// Sets `options` (validated) on `builder`: gRPC's keepalive, ping-policy, idle and handshake
// channel arguments, and the compression algorithms the server decodes.
void ApplyTransportOptions(const TransportOptions& options, grpc::ServerBuilder* builder);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TRANSPORT_OPTIONS_H_
