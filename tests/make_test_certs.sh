#!/usr/bin/env bash
# Makes the certificates of the TLS tests with openssl, fresh at every run (nothing secret or
# expiring is checked in). Usage: tests/make_test_certs.sh OUT_DIR
#
# OUT_DIR/ then holds, each as NAME.pem (certificate) and NAME.key (unencrypted private key):
#   ca            the test CA (the clients' root and the server's --tls_client_ca)
#   server        a server certificate from `ca` for localhost, 127.0.0.1 and ::1
#   client        a client certificate from `ca`
#   other_ca      a second CA that nobody trusts
#   other_server  a server certificate from `other_ca` (same names as `server`)
#   other_client  a client certificate from `other_ca`
#   expired_server  a server certificate from `ca` valid 2020-01-01 to 2020-02-01 only
#   future_server   a server certificate from `ca` valid from 2099-01-01 only
# EC P-256 keys: quick to make (the whole set takes well under a second).
set -euo pipefail
out="${1:?usage: make_test_certs.sh OUT_DIR}"
mkdir -p "$out"
cd "$out"
export OPENSSL_CONF=/dev/null  # The machine's openssl.cnf must not change what is made.

ca() {  # ca NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3 \
    -subj "/CN=$2" -keyout "$1.key" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
}

leaf() {  # leaf NAME ISSUER CN EXTENSIONS
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$3" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days 3 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

dated() {  # dated NAME ISSUER CN EXTENSIONS NOT_BEFORE NOT_AFTER (YYYYMMDDHHMMSSZ)
  # `openssl ca` is the tool of OpenSSL 3.0 that sets both dates; it wants a small database.
  local db
  db="$(mktemp -d)"
  touch "$db/index"
  printf '[ca]\ndefault_ca=d\n[d]\ndatabase=%s/index\nnew_certs_dir=%s\nrand_serial=yes\ndefault_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n[x]\n%s\n' \
    "$db" "$db" "$4" >"$db/ca.cnf"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$3" \
    -keyout "$1.key" -out "$db/csr" 2>/dev/null
  openssl ca -batch -config "$db/ca.cnf" -extensions x -cert "$2.pem" -keyfile "$2.key" \
    -in "$db/csr" -out "$1.pem" -startdate "$5" -enddate "$6" -notext 2>/dev/null
  rm -rf "$db"
}

server_ext=$'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE'
client_ext=$'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE'

ca ca "samplerd test CA"
ca other_ca "untrusted test CA"
leaf server ca localhost "$server_ext"
leaf client ca "samplerd test client" "$client_ext"
leaf other_server other_ca localhost "$server_ext"
leaf other_client other_ca "untrusted test client" "$client_ext"
dated expired_server ca localhost "$server_ext" 20200101000000Z 20200201000000Z
dated future_server ca localhost "$server_ext" 20990101000000Z 20991231000000Z
chmod 600 ./*.key
