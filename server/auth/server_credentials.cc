#include "server/auth/server_credentials.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/security/server_credentials.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"
#include "server/log_fields.h"
#include "server/persistence/file_util.h"

namespace samplerd {
namespace {

absl::Status Bad(absl::string_view flag, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " = \"", path, "\": ", why));
}

// The contents of the file named by `flag`.
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Bad(flag, path, text.status().message());
  return text;
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using UniqueBio = std::unique_ptr<BIO, BioDeleter>;
using UniqueX509 = std::unique_ptr<X509, X509Deleter>;
using UniqueKey = std::unique_ptr<EVP_PKEY, KeyDeleter>;

UniqueBio MemoryBio(const std::string& pem) {
  return UniqueBio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// A password callback that has none: an encrypted key fails instead of prompting on the terminal.
int NoPassword(char*, int, int, void*) { return -1; }

// The first certificate of a PEM file (OpenSSL reads the ones after it the same way; one is
// enough to tell a certificate file from something else), or an error naming the flag.
absl::StatusOr<UniqueX509> FirstCertificate(absl::string_view flag, const std::string& path,
                                            const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  UniqueX509 cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassword, nullptr));
  ERR_clear_error();  // OpenSSL's error queue is per thread: leave it empty for gRPC.
  if (cert == nullptr) {
    return Bad(flag, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  }
  return cert;
}

absl::Time ToTime(const ASN1_TIME* asn1) {
  std::tm tm = {};
  if (ASN1_TIME_to_tm(asn1, &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

CertificateValidity ValidityOf(const X509& cert) {
  return {ToTime(X509_get0_notBefore(&cert)), ToTime(X509_get0_notAfter(&cert))};
}

// Warns when `validity` does not include now: clients will refuse the handshake.
void WarnUnlessValidNow(const std::string& path, const CertificateValidity& validity) {
  const absl::Time now = absl::Now();
  if (now >= validity.not_before && now <= validity.not_after) return;
  auto date = [](absl::Time t) {
    return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
  };
  LOG(WARNING) << "event=tls_certificate_not_valid tls_cert=" << LogValue(path)
               << " problem=" << (now > validity.not_after ? "expired" : "not_yet_valid")
               << " not_before=" << date(validity.not_before)
               << " not_after=" << date(validity.not_after) << " now=" << date(now) << " effect="
               << LogValue(
                      "clients that check dates refuse the handshake; renew "
                      "the certificate and restart");
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TransportSecurity& security, CertificateValidity* leaf_validity) {
  const bool any_tls =
      !security.tls_cert.empty() || !security.tls_key.empty() || !security.tls_client_ca.empty();
  if (security.plaintext) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "plaintext = true together with tls_cert, tls_key or tls_client_ca: choose TLS or "
          "plaintext, not both");
    }
    return grpc::InsecureServerCredentials();
  }
  if (security.tls_cert.empty() && security.tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        security.tls_client_ca.empty() ? "" : "tls_client_ca needs a server certificate too: ",
        "no transport security chosen: pass --tls_cert and --tls_key (TLS; with "
        "--tls_client_ca, mutual TLS), or --plaintext to serve without encryption"));
  }
  if (security.tls_key.empty()) {
    return Bad("tls_cert", security.tls_cert, "given without tls_key (its private key)");
  }
  if (security.tls_cert.empty()) {
    return Bad("tls_key", security.tls_key, "given without tls_cert (its certificate)");
  }

  absl::StatusOr<std::string> cert_pem = ReadFlagFile("tls_cert", security.tls_cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFlagFile("tls_key", security.tls_key);
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<UniqueX509> leaf = FirstCertificate("tls_cert", security.tls_cert, *cert_pem);
  if (!leaf.ok()) return leaf.status();
  UniqueBio key_bio = MemoryBio(*key_pem);
  UniqueKey key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassword, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return Bad("tls_key", security.tls_key,
               "holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)");
  }
  if (X509_check_private_key(leaf->get(), key.get()) != 1) {
    ERR_clear_error();
    return Bad("tls_key", security.tls_key,
               absl::StrCat("is not the private key of tls_cert = \"", security.tls_cert, "\""));
  }

  const CertificateValidity validity = ValidityOf(**leaf);
  WarnUnlessValidNow(security.tls_cert, validity);
  if (leaf_validity != nullptr) *leaf_validity = validity;

  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*std::move(key_pem), *std::move(cert_pem)});
  if (!security.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadFlagFile("tls_client_ca", security.tls_client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    if (absl::StatusOr<UniqueX509> ca =
            FirstCertificate("tls_client_ca", security.tls_client_ca, *ca_pem);
        !ca.ok()) {
      return ca.status();
    }
    options.pem_root_certs = *std::move(ca_pem);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace samplerd
