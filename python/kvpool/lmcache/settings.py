"""The engine-free half of :mod:`kvpool.lmcache`: the plugin's settings, read from LMCache's
``extra_config`` the way LMCache's own remote plugins read theirs, and the mapping from LMCache's key
strings to pool keys. Nothing here imports LMCache or torch, so ``python/tests`` can test it.

Settings live under ``remote_storage_plugin.<plugin name>.`` in ``extra_config`` (the prefix LMCache's
fs, redis and hf3fs plugins use), for example with the plugin named ``kvpool``::

    remote_storage_plugin.kvpool.master: "10.0.0.5:50051"   # else KVPOOL_MASTER / KVPOOL_CONFIG_PATH
    remote_storage_plugin.kvpool.layout: raw                 # raw | meta (see LAYOUTS)
    remote_storage_plugin.kvpool.key_prefix: "lmcache/"
    remote_storage_plugin.kvpool.replicas: 1                 # 0: the master's default
    remote_storage_plugin.kvpool.reset: all                  # all | prefix (see RESETS)
    remote_storage_plugin.kvpool.timeout: 10                 # seconds per pool call
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..protocol import MAX_KEY_BYTES

#: The plugin type LMCache routes to this backend: ``remote_storage_plugins: ["kvpool"]`` (or
#: ``kvpool.<instance>``) makes LMCache ask for ``plugin://kvpool...``.
PLUGIN_TYPE = "kvpool"

#: ``raw``: the value is the chunk's KV bytes only, written from and read into LMCache's memory
#: objects without a copy; shapes, dtypes and format come from the engine's own metadata, the token
#: count of a partial chunk from the value's length. ``meta``: LMCache's ``RemoteMetadata`` header
#: (the one its Mooncake connector writes with ``save_chunk_meta``) before the KV bytes, so any shape
#: and format (cachegen/kivi serde, layerwise chunks) travels; one copy each way.
LAYOUTS = ("raw", "meta")

#: ``all``: a reset empties the whole pool and fences puts in flight (``remove_all(force=True)``, the
#: RL hard reset). ``prefix``: a reset removes only the keys under ``key_prefix`` (other users of the
#: pool keep theirs; puts already in flight are not fenced).
RESETS = ("all", "prefix")

DEFAULT_KEY_PREFIX = "lmcache/"
DEFAULT_TIMEOUT = 10.0

#: Pool keys longer than this are shortened to the prefix and a SHA-256 of the full LMCache key.
_HASHED_MARK = "sha256:"


class SettingsError(ValueError):
    """A plugin setting with a bad value; the message names the ``extra_config`` key."""


@dataclass(frozen=True)
class Settings:
    """What the plugin was configured with (``from_extra_config``)."""

    plugin_name: str = PLUGIN_TYPE
    master: Optional[str] = None
    layout: Optional[str] = None  # None: decided by the connector from LMCache's config (raw when it can)
    key_prefix: str = DEFAULT_KEY_PREFIX
    replicas: int = 0
    reset: str = "all"
    timeout: float = DEFAULT_TIMEOUT

    def config_key(self, name: str) -> str:
        """The ``extra_config`` key of setting ``name`` for this plugin instance."""
        return f"remote_storage_plugin.{self.plugin_name}.{name}"

    @classmethod
    def from_extra_config(cls, extra_config: Optional[Mapping[str, Any]], plugin_name: Optional[str] = None,
                          ) -> "Settings":
        """Reads ``remote_storage_plugin.<plugin_name>.*`` (plugin name ``kvpool`` when None)."""
        name = plugin_name or PLUGIN_TYPE
        if plugin_type(name) != PLUGIN_TYPE:
            raise SettingsError(f"plugin name {name!r} is not of type {PLUGIN_TYPE!r}: name it {PLUGIN_TYPE!r} or "
                                f"'{PLUGIN_TYPE}.<instance>' in remote_storage_plugins")
        ec: Mapping[str, Any] = extra_config or {}
        base = cls(plugin_name=name)

        def get(field: str) -> Any:
            return ec.get(base.config_key(field))

        master = get("master")
        if master is not None and not (isinstance(master, str) and master.strip()):
            raise SettingsError(f"{base.config_key('master')} must be 'host:port' or 'etcd://...', got {master!r}")
        layout = get("layout")
        if layout is not None:
            layout = str(layout).strip().lower()
            if layout not in LAYOUTS:
                raise SettingsError(f"{base.config_key('layout')} must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        prefix = get("key_prefix")
        if prefix is None:
            prefix = DEFAULT_KEY_PREFIX
        if not isinstance(prefix, str) or len(prefix.encode("utf-8")) > MAX_KEY_BYTES // 2:
            raise SettingsError(f"{base.config_key('key_prefix')} must be a string of at most {MAX_KEY_BYTES // 2} "
                                f"bytes, got {prefix!r}")
        replicas = _int(get("replicas"), 0, base.config_key("replicas"), 0, 8)
        reset = str(get("reset") or "all").strip().lower()
        if reset not in RESETS:
            raise SettingsError(f"{base.config_key('reset')} must be one of {', '.join(RESETS)}, got {reset!r}")
        if reset == "prefix" and not prefix:
            raise SettingsError(f"{base.config_key('reset')} is 'prefix' but {base.config_key('key_prefix')} is "
                                f"empty: a prefix reset needs a prefix")
        timeout = _float(get("timeout"), DEFAULT_TIMEOUT, base.config_key("timeout"))
        return cls(plugin_name=name, master=master.strip() if master else None, layout=layout, key_prefix=prefix,
                   replicas=replicas, reset=reset, timeout=timeout)


#: LMCache's serde names whose objects keep the engine's fixed chunk shapes (the ``raw`` layout's premise).
_SHAPE_KEEPING_SERDES = (None, "naive")


def choose_layout(settings: Settings, remote_serde: Optional[str], use_layerwise: bool) -> str:
    """The object layout: the configured one, else ``raw`` unless LMCache's config (``remote_serde``,
    ``use_layerwise``) makes chunks whose shape the engine's metadata does not give: then ``meta``.
    SettingsError for ``raw`` configured where it cannot work."""
    needs_meta = []
    if remote_serde not in _SHAPE_KEEPING_SERDES:
        needs_meta.append(f"remote_serde={remote_serde!r}")
    if use_layerwise:
        needs_meta.append("use_layerwise=True")
    if settings.layout is None:
        return "meta" if needs_meta else "raw"
    if settings.layout == "raw" and needs_meta:
        raise SettingsError(f"{settings.config_key('layout')} is 'raw' but {', '.join(needs_meta)} makes chunks whose "
                            f"shape travels with them: use layout 'meta'")
    return settings.layout


def plugin_type(plugin_name: str) -> str:
    """``kvpool`` for ``kvpool`` and ``kvpool.primary`` (LMCache's ``{type}.{instance}`` names)."""
    return plugin_name.split(".", 1)[0]


def pool_key(prefix: str, lmcache_key: str) -> str:
    """The pool key of an LMCache key string (``CacheEngineKey.to_string()``): the prefix then the key,
    or, when that exceeds the pool's key limit, the prefix, ``sha256:`` and the key's SHA-256 in hex."""
    k = prefix + lmcache_key
    if len(k.encode("utf-8")) <= MAX_KEY_BYTES:
        return k
    return prefix + _HASHED_MARK + hashlib.sha256(lmcache_key.encode("utf-8")).hexdigest()


def _int(v: Any, default: int, key: str, lo: int, hi: int) -> int:
    if v is None:
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise SettingsError(f"{key} must be an integer, got {v!r}") from None
    if not lo <= n <= hi:
        raise SettingsError(f"{key} must be between {lo} and {hi}, got {n}")
    return n


def _float(v: Any, default: float, key: str) -> float:
    if v is None:
        return default
    try:
        x = float(str(v).strip())
    except ValueError:
        raise SettingsError(f"{key} must be a number of seconds, got {v!r}") from None
    if not x > 0:
        raise SettingsError(f"{key} must be positive, got {x}")
    return x
