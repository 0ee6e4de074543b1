"""Authentication (version 8, section 4.31): AUTH_BEGIN / AUTH_PROVE, a mutual HMAC-SHA256
challenge-response at connect."""

from __future__ import annotations

import hashlib as _hashlib
import hmac as _hmac

from ..codec import BodyReader, BodyWriter


# ------------------------------------------------------------------------- authentication (version 8)
# Section 4.31: AUTH_BEGIN / AUTH_PROVE, a mutual HMAC-SHA256 challenge-response at connect.

AUTH_NONCE_BYTES = 32
AUTH_MODE_OPEN = 0
AUTH_MODE_SECURED = 1
ACCESS_DATA = 1
ACCESS_ADMIN = 2
_SERVER_LABEL = b"kvpool auth v8 server\x00"
_CLIENT_LABEL = b"kvpool auth v8 client\x00"


def server_proof(cluster_key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The server's proof that it knows the cluster secret."""
    return _hmac.new(cluster_key, _SERVER_LABEL + client_nonce + server_nonce, _hashlib.sha256).digest()


def client_proof(key: bytes, level: int, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The client's proof that it knows the secret of ``level`` (1 cluster, 2 admin)."""
    return _hmac.new(key, _CLIENT_LABEL + bytes([level]) + server_nonce + client_nonce, _hashlib.sha256).digest()


def encode_auth_begin(client_nonce: bytes) -> bytes:
    return BodyWriter().bstr(client_nonce).bytes()


def decode_auth_begin_reply(body: bytes) -> tuple[int, bytes, bytes]:
    """(mode, server nonce, server proof)."""
    r = BodyReader(body, "AUTH_BEGIN reply")
    mode = r.u8("mode")
    nonce = r.bstr("server nonce")
    proof = r.bstr("server proof")
    r.done()
    return mode, nonce, proof


def encode_auth_prove(level: int, proof: bytes) -> bytes:
    return BodyWriter().u8(level).bstr(proof).bytes()


def decode_auth_prove_reply(body: bytes) -> int:
    r = BodyReader(body, "AUTH_PROVE reply")
    level = r.u8("granted level")
    r.done()
    return level
