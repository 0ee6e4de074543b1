"""The pool's secrets and the authentication at the start of a connection (protocol version 8,
docs/protocol.md section 4.31; docs/security.md for who holds which secret).

``Secrets`` holds the cluster (data) secret every client proves when it connects and, optionally,
the admin secret that ``remove_all`` and ``remove_prefix`` need. They come from the environment by
default: ``KVPOOL_SECRET_FILE`` / ``KVPOOL_ADMIN_SECRET_FILE`` name files, or ``KVPOOL_SECRET`` /
``KVPOOL_ADMIN_SECRET`` hold the values; never from a command line. A secret has at least 16
characters (surrounding white space is dropped) and is never shown by ``repr``.

``authenticate`` runs the exchange on a fresh connection: AUTH_BEGIN with 32 random bytes, a check
of the server's proof (a server that cannot prove the cluster secret, or an open one, is refused),
then AUTH_PROVE for the admin level when the admin secret is held, else the cluster level.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Any, Mapping

from . import protocol as p
from .errors import AuthenticationError, KvPoolError

MIN_LENGTH = 16


def _check(what: str, value: str) -> bytes:
    v = value.strip()
    if len(v) < MIN_LENGTH:
        raise ValueError(f"the {what} has {len(v)} characters; it needs at least {MIN_LENGTH} "
                         "(for example: head -c 32 /dev/urandom | base64 > FILE)")
    return v.encode("utf-8")


def _read(path: str | os.PathLike[str], what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {path}: {e.strerror or e}") from None


class Secrets:
    """The cluster secret and, optionally, the admin secret this process proves (see the module)."""

    __slots__ = ("_data", "_admin")

    def __init__(self, data: bytes | None = None, admin: bytes | None = None) -> None:
        self._data = data
        self._admin = admin

    @classmethod
    def of(cls, data: str | None, admin: str | None = None) -> Secrets:
        """From the values; ValueError naming which one is too short, or an admin secret alone."""
        if data is None:
            if admin is not None:
                raise ValueError("an admin secret needs the cluster secret too")
            return NONE
        return cls(_check("cluster secret", data), None if admin is None else _check("admin secret", admin))

    @classmethod
    def from_files(cls, data: str | os.PathLike[str], admin: str | os.PathLike[str] | None = None) -> Secrets:
        return cls.of(_read(data, "cluster secret"), None if admin is None else _read(admin, "admin secret"))

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Secrets:
        """The secrets the environment names; NONE when it names none."""
        e = os.environ if env is None else env
        return cls.of(_one(e, "KVPOOL_SECRET", "cluster secret"), _one(e, "KVPOOL_ADMIN_SECRET", "admin secret"))

    @property
    def present(self) -> bool:
        return self._data is not None

    @property
    def has_admin(self) -> bool:
        return self._admin is not None

    @property
    def level(self) -> int:
        """The level these secrets prove: 2 (admin), 1 (cluster), 0 (none)."""
        return p.ACCESS_ADMIN if self._admin is not None else p.ACCESS_DATA if self._data is not None else 0

    def key(self, level: int) -> bytes:
        k = self._admin if level == p.ACCESS_ADMIN else self._data
        if k is None:
            raise ValueError(f"no secret for level {level}")
        return k

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Secrets) and (self._data, self._admin) == (other._data, other._admin)

    def __hash__(self) -> int:
        return hash((self._data, self._admin))

    def __repr__(self) -> str:
        held = "none" if self._data is None else "cluster" if self._admin is None else "cluster, admin"
        return f"Secrets({held})"


NONE = Secrets()


def _one(env: Mapping[str, str], name: str, what: str) -> str | None:
    file = env.get(name + "_FILE")
    value = env.get(name)
    if file is not None and file.strip() and value is not None:
        raise ValueError(f"both {name}_FILE and {name} are set; set one")
    if file is not None and file.strip():
        return _read(file, what)
    return value


def authenticate(conn: Any, secrets: Secrets, timeout: float) -> int:
    """Runs AUTH_BEGIN and AUTH_PROVE on ``conn`` (a fresh ``_net.Connection``); the level granted.

    AuthenticationError naming the peer when the server is open, cannot prove the cluster secret, or
    refuses this process's proof.
    """
    cn = os.urandom(p.AUTH_NONCE_BYTES)
    try:
        mode, sn, proof = p.decode_auth_begin_reply(conn.call(p.Opcode.AUTH_BEGIN, p.encode_auth_begin(cn), timeout)[0])
        if mode == p.AUTH_MODE_OPEN:
            raise AuthenticationError(f"{conn.address} holds no cluster secret (an open server); this process has "
                                      "one and talks only to servers that prove they know it")
        if mode != p.AUTH_MODE_SECURED or len(sn) != p.AUTH_NONCE_BYTES \
                or not hmac.compare_digest(proof, p.server_proof(secrets.key(p.ACCESS_DATA), cn, sn)):
            raise AuthenticationError(f"{conn.address} did not prove it knows the cluster secret: it holds another "
                                      "secret, or it is not a server of this pool")
        level = secrets.level
        body = p.encode_auth_prove(level, p.client_proof(secrets.key(level), level, sn, cn))
        return p.decode_auth_prove_reply(conn.call(p.Opcode.AUTH_PROVE, body, timeout)[0])
    except AuthenticationError:
        conn.close()
        raise
    except (KvPoolError, ValueError) as e:  # ValueError: a BAD_REQUEST answer, or no secret for the level
        conn.close()
        if isinstance(e, p.ProtocolError):
            raise
        raise AuthenticationError(f"{conn.address} refused this connection: {e}") from None
