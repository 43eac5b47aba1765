// The transport security of samplerd's port: TLS, mutual TLS, or plaintext when asked for
// (the --tls_cert / --tls_key / --tls_client_ca / --plaintext flags; docs/SECURITY.md).
//
// Every file is read and checked here, before the port opens, because gRPC itself takes any
// bytes and fails only at the first handshake, far from the flag that was wrong: a missing or
// unreadable file, a file with no PEM certificate or key, a key that is not the certificate's,
// are INVALID_ARGUMENT naming the flag and the path.
#ifndef SAMPLERD_SERVER_AUTH_SERVER_CREDENTIALS_H_
#define SAMPLERD_SERVER_AUTH_SERVER_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"

namespace samplerd {

// The flags, as server::Options holds them.
struct TransportSecurity {
  // Serve without TLS. Must be asked for; excludes every TLS field.
  bool plaintext = false;
  // PEM file: the server's certificate chain, leaf first.
  std::string tls_cert;
  // PEM file: the private key of tls_cert's leaf (unencrypted).
  std::string tls_key;
  // PEM file of CA certificates: when set, every client must present a certificate signed by
  // one of them (mutual TLS); the handshake of a client without one fails.
  std::string tls_client_ca;
};

// When a certificate may be used (X.509 notBefore and notAfter).
struct CertificateValidity {
  absl::Time not_before;
  absl::Time not_after;
};

// Credentials for grpc::ServerBuilder::AddListeningPort. INVALID_ARGUMENT, naming the flags,
// when neither TLS (tls_cert and tls_key) nor plaintext is chosen, when both are, or when one
// of tls_cert/tls_key comes without the other; INVALID_ARGUMENT naming the flag and the path
// for a file that cannot be read or does not hold what it should (see the file comment).
// A server certificate (tls_cert's leaf) that has expired or is not valid yet is no error (the
// clients decide; a restart with a renewed file fixes it) but logs a WARNING
// `event=tls_certificate_not_valid` naming the file and both dates. With TLS, `leaf_validity`
// (if not null) receives the leaf's dates, for the expiry metric.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TransportSecurity& security, CertificateValidity* leaf_validity = nullptr);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_AUTH_SERVER_CREDENTIALS_H_
