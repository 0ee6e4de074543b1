"""Mutual TLS for kvpool connections (docs/security.md, "TLS"; docs/python.md).

A pool whose masters and nodes run with ``--tls-cert``/``--tls-key``/``--tls-ca`` accepts only TLS 1.3
connections that present a certificate its CA signed. ``client_context`` builds the
``ssl.SSLContext`` for such a pool from the same three PEM files the Java client reads: this
process's certificate chain, its private key, and the CA bundle the servers' certificates must chain
to. As in Java, the server's certificate must name the address dialed (an IP SAN for an IP, a DNS
SAN for a name). ``from_environment`` reads ``KVPOOL_TLS_CERT``, ``KVPOOL_TLS_KEY`` and
``KVPOOL_TLS_CA`` (all three, or none for plain TCP). Every problem with a file is a ValueError naming
it, raised when the context is built.

The same-machine shared-memory path moves bytes without TLS: they never leave the host.
"""

from __future__ import annotations

import os
import ssl
from typing import Mapping

CERT_ENV = "KVPOOL_TLS_CERT"
KEY_ENV = "KVPOOL_TLS_KEY"
CA_ENV = "KVPOOL_TLS_CA"


def client_context(cert: str | os.PathLike[str], key: str | os.PathLike[str],
                   ca: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS 1.3 client context presenting ``cert``/``key`` and trusting servers that ``ca`` signed."""
    for path, what in ((cert, "certificate chain"), (key, "private key"), (ca, "CA bundle")):
        if not os.access(path, os.R_OK):
            raise ValueError(f"cannot read the TLS {what} file {os.fspath(path)}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        ctx.load_verify_locations(cafile=os.fspath(ca))
    except (ssl.SSLError, ValueError) as e:
        raise ValueError(f"the TLS CA bundle file {os.fspath(ca)} holds no usable PEM certificate: {e}") from None
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    except ssl.SSLError as e:
        why = "does not match the certificate" if "KEY_VALUES_MISMATCH" in str(e) else "cannot be used with the certificate"
        raise ValueError(f"the TLS private key in {os.fspath(key)} {why} in {os.fspath(cert)} ({e})") from None
    return ctx


def from_environment(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The context ``KVPOOL_TLS_CERT``, ``KVPOOL_TLS_KEY`` and ``KVPOOL_TLS_CA`` name; None when none is set."""
    env = os.environ if env is None else env
    files = {name: (env.get(name) or "").strip() for name in (CERT_ENV, KEY_ENV, CA_ENV)}
    if not any(files.values()):
        return None
    missing = [name for name, v in files.items() if not v]
    if missing:
        raise ValueError("TLS needs a certificate chain, its private key and a CA bundle: "
                         + " and ".join(missing) + (" is" if len(missing) == 1 else " are") + " missing")
    return client_context(files[CERT_ENV], files[KEY_ENV], files[CA_ENV])


def explain(e: ssl.SSLError, address: str) -> str:
    """A message for a failed TLS exchange with ``address``, with the likely cause where it is known."""
    text = str(e)
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text or "PACKET_LENGTH_TOO_LONG" in text:
        hint = " (it answered in plain TCP: a kvpool server without TLS)"
    elif "CERTIFICATE_REQUIRED" in text.upper():
        hint = " (the server requires a client certificate its CA signed)"
    elif "CERTIFICATE_VERIFY_FAILED" in text:
        hint = " (the server's certificate is not signed by a CA in the CA bundle, or does not name this address)"
    elif "UNKNOWN_CA" in text.upper() or "BAD_CERTIFICATE" in text.upper():
        hint = " (the server does not trust this client's certificate: another CA signed it)"
    else:
        hint = ""
    return f"TLS with {address} failed: {text}{hint}"
