"""Mooncake's client configuration file and environment variables (``mooncake.mooncake_config``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .args import DEFAULT_CLIENT_HTTP_PORT, _master_address, _parse_bool

_CONFIG_SIZE_SUFFIXES = [("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40), ("k", 1 << 10),
                         ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1)]
DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824

#: The fields a config file must give (its JSON keys are the field names).
_REQUIRED_FIELDS = ("local_hostname", "metadata_server", "master_server_address")
#: The optional fields: (environment variable, default); a config file names them by field name.
_OPTIONAL_FIELDS: dict[str, tuple[str, Any]] = {
    "global_segment_size": ("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE),
    "local_buffer_size": ("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE),
    "protocol": ("MOONCAKE_PROTOCOL", "tcp"),
    "device_name": ("MOONCAKE_DEVICE", ""),
    "enable_ssd_offload": ("MOONCAKE_OFFLOAD_ENABLED", False),
    "ssd_offload_path": ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
    "tenant_id": ("MOONCAKE_TENANT_ID", "default"),
    "enable_client_http_server": ("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", False),
    "client_http_port": ("MOONCAKE_CLIENT_HTTP_PORT", DEFAULT_CLIENT_HTTP_PORT),
}


def _config_size(value: Any) -> int:
    """A size as Mooncake's ``mooncake_config.py`` parses one (int, or "4gb", "512 MB", "1.5g"...)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        s = value.strip().lower()
        if not s:
            raise ValueError("invalid size: empty string")
        for suffix, mult in _CONFIG_SIZE_SUFFIXES:
            if s.endswith(suffix):
                num = s[: -len(suffix)].strip()
                if not num:
                    raise ValueError(f"invalid size: missing number before {suffix!r}")
                return int(float(num) * mult)
        return int(float(s))
    return int(value)


def _config_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None or not str(value).strip():
        return False
    b = _parse_bool(value)
    if b is None:
        raise ValueError(f"invalid boolean value: {value!r}")
    return b


#: How each field given as text or JSON becomes its typed value (in field order, so the first bad one is reported).
_CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "global_segment_size": _config_size, "local_buffer_size": _config_size,
    "enable_ssd_offload": _config_bool, "enable_client_http_server": _config_bool, "client_http_port": int,
}


@dataclass
class MooncakeConfig:
    """Mooncake's client configuration as ``mooncake.mooncake_config.MooncakeConfig`` reads it: a JSON
    file named by ``MOONCAKE_CONFIG_PATH``, else ``MOONCAKE_*`` environment variables.

    ``master_server_address`` is the kvpool master (``host:port``). :meth:`setup_args` gives the
    positional arguments of ``MooncakeDistributedStore.setup``.
    """

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = DEFAULT_CLIENT_HTTP_PORT
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"invalid protocol {self.protocol!r}: a non-empty string such as 'tcp'")
        self.protocol = self.protocol.strip().lower()
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"invalid {name}: {getattr(self, name)}; sizes are non-negative")
        for name in _REQUIRED_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"config field {name!r} must be a non-empty string, got {v!r}")

    @staticmethod
    def _from_raw(raw: dict[str, Any], extra: Optional[dict[str, Any]] = None) -> "MooncakeConfig":
        """A config from every field's value as written (sizes, flags and the port still as text or JSON)."""
        typed = {name: _CONVERSIONS[name](v) if name in _CONVERSIONS else v for name, v in raw.items()}
        return MooncakeConfig(**typed, extra=extra if extra is not None else {})

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """Reads the JSON config file (``local_hostname``, ``metadata_server`` and
        ``master_server_address`` required; sizes as ints or strings like "4gb")."""
        with open(file_path, encoding="utf-8") as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"{file_path}: expected a JSON object")
        for name in _REQUIRED_FIELDS:
            if name not in config:
                raise ValueError(f"missing required config field: {name}")
        raw = {name: config[name] for name in _REQUIRED_FIELDS}
        raw.update({name: config.get(name, default) for name, (_, default) in _OPTIONAL_FIELDS.items()})
        raw["ssd_offload_path"] = str(raw["ssd_offload_path"] or "")
        raw["tenant_id"] = str(raw["tenant_id"] or "default")
        known = set(_REQUIRED_FIELDS) | set(_OPTIONAL_FIELDS)
        return MooncakeConfig._from_raw(raw, extra={k: v for k, v in config.items() if k not in known})

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """The file at ``MOONCAKE_CONFIG_PATH`` if set; else ``MOONCAKE_MASTER`` (required),
        ``MOONCAKE_LOCAL_HOSTNAME`` ("localhost"), ``MOONCAKE_TE_META_DATA_SERVER`` ("P2PHANDSHAKE"),
        ``MOONCAKE_GLOBAL_SEGMENT_SIZE``, ``MOONCAKE_LOCAL_BUFFER_SIZE``, ``MOONCAKE_PROTOCOL`` ("tcp"),
        ``MOONCAKE_DEVICE``, ``MOONCAKE_OFFLOAD_ENABLED``, ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``,
        ``MOONCAKE_TENANT_ID``, ``MOONCAKE_ENABLE_CLIENT_HTTP_SERVER``, ``MOONCAKE_CLIENT_HTTP_PORT``."""
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        master = os.environ.get("MOONCAKE_MASTER")
        if not master:
            raise ValueError("neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set")
        raw = {"local_hostname": os.environ.get("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
               "metadata_server": os.environ.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
               "master_server_address": master}
        raw.update({name: os.environ.get(var, default) for name, (var, default) in _OPTIONAL_FIELDS.items()})
        return MooncakeConfig._from_raw(raw)

    @property
    def kvpool_master(self) -> str:
        """The kvpool master address (``host:port``) that ``master_server_address`` names."""
        return _master_address(self.master_server_address)

    def setup_args(self) -> tuple[Any, ...]:
        """The seven positional arguments of ``MooncakeDistributedStore.setup``."""
        return (self.local_hostname, self.metadata_server, self.global_segment_size, self.local_buffer_size,
                self.protocol, self.device_name or "", self.master_server_address)

    def setup_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``setup`` that differ from their defaults."""
        kw: dict[str, Any] = {}
        if self.enable_ssd_offload:
            kw["enable_ssd_offload"] = True
        if self.ssd_offload_path:
            kw["ssd_offload_path"] = self.ssd_offload_path
        if self.tenant_id != "default":
            kw["tenant_id"] = self.tenant_id
        if self.enable_client_http_server:
            kw["enable_client_http_server"] = True
            kw["client_http_port"] = self.client_http_port
        return kw


def load_config() -> MooncakeConfig:
    """``MooncakeConfig.load_from_env()``."""
    return MooncakeConfig.load_from_env()
