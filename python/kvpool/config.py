"""Where the client finds its master when none is given.

In order: the ``KVPOOL_MASTER`` environment variable (``host:port``), then the JSON client config
named by ``KVPOOL_CONFIG_PATH`` (what ``kvpool launch`` writes: ``{"master": "host:port",
"offload": {...}}``; ``offload.master`` is read too).
"""

from __future__ import annotations

import json
import os


def master_from_environment() -> str:
    """The master address from the environment; ValueError saying what to set when there is none."""
    env = os.environ.get("KVPOOL_MASTER")
    if env:
        return env
    path = os.environ.get("KVPOOL_CONFIG_PATH")
    if not path:
        raise ValueError("no master given: pass master='host:port', or set KVPOOL_MASTER, or KVPOOL_CONFIG_PATH "
                         "to the client config kvpool launch writes")
    return master_from_file(path)


def master_from_file(path: str) -> str:
    """The master address in a client config file (JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read the kvpool client config {path}: {e}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (the Python client reads the JSON config kvpool launch writes, not YAML)" \
            if path.endswith((".yaml", ".yml")) else ""
        raise ValueError(f"{path} is not valid JSON{hint}: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object with a \"master\" field")
    master = doc.get("master") or (doc.get("offload") or {}).get("master")
    if not isinstance(master, str) or not master:
        raise ValueError(f"{path}: no \"master\" (host:port) in the client config")
    return master
