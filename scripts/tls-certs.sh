#!/usr/bin/env bash
# Makes the certificates for a kvpool pool in mutual TLS (docs/operations.md, "TLS"), with openssl:
#
#   scripts/tls-certs.sh DIR [ADDRESS...]
#
# In DIR (created, mode 0700):
#   ca.pem, ca.key                the pool's certificate authority (every role trusts ca.pem)
#   server.pem, server.key        for masters and nodes: serverAuth and clientAuth (a node also dials the
#                                 master and other nodes), subjectAltName = every ADDRESS given
#                                 (default 127.0.0.1 and localhost); an IP gets an IP SAN, a name a DNS SAN
#   client.pem, client.key        for clients and engines: clientAuth only, no address
#   other-ca.pem, other-ca.key    a second, unrelated CA, and other-client.pem/.key signed by it:
#                                 for tests that check a certificate of another CA is refused
#
# Keys are EC P-256 in unencrypted PKCS#8 ("BEGIN PRIVATE KEY", what kvpool reads), mode 0600.
# Certificates are valid for DAYS days (default 825). Existing files in DIR are overwritten.
#
# Exit status: 0 ok, 1 failure, 2 usage.
set -euo pipefail

PROG=$(basename "$0")

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "$PROG: openssl is not installed (apt-get install openssl)" >&2; exit 1; }

DIR=$1
shift
ADDRESSES=("$@")
if [[ ${#ADDRESSES[@]} -eq 0 ]]; then
    ADDRESSES=(127.0.0.1 localhost)
fi
DAYS=${DAYS:-825}

mkdir -p "$DIR"
chmod 700 "$DIR"
umask 077

san=""
for a in "${ADDRESSES[@]}"; do
    if [[ $a =~ ^[0-9.]+$ || $a == *:* ]]; then
        san+="${san:+,}IP:$a"
    else
        san+="${san:+,}DNS:$a"
    fi
done

key() {  # key FILE: a new EC P-256 key in PKCS#8
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

ca() {  # ca NAME SUBJECT
    key "$DIR/$1.key"
    openssl req -x509 -new -key "$DIR/$1.key" -sha256 -days "$DAYS" -subj "$2" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$DIR/$1.pem"
}

leaf() {  # leaf NAME CA SUBJECT EXTENSIONS
    local ext="$DIR/$1.ext"
    printf '%s\n' "$4" > "$ext"
    key "$DIR/$1.key"
    openssl req -new -key "$DIR/$1.key" -subj "$3" -out "$DIR/$1.csr"
    openssl x509 -req -in "$DIR/$1.csr" -CA "$DIR/$2.pem" -CAkey "$DIR/$2.key" -CAcreateserial \
        -days "$DAYS" -sha256 -extfile "$ext" -out "$DIR/$1.pem" 2>/dev/null
    rm -f "$ext" "$DIR/$1.csr"
}

ca ca "/CN=kvpool test CA"
leaf server ca "/CN=kvpool server" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san"
leaf client ca "/CN=kvpool client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

ca other-ca "/CN=another CA"
leaf other-client other-ca "/CN=kvpool client of another CA" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
rm -f "$DIR"/*.srl
# certificates are public; keys stay 0600
chmod 644 "$DIR"/*.pem
echo "$DIR: ca.pem, server.pem/.key (SAN $san), client.pem/.key, other-ca.pem, other-client.pem/.key"
