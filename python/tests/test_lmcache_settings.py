"""kvpool.lmcache's engine-free half: settings read from LMCache's extra_config, the pool key of an
LMCache key, the layout choice, and that importing the package needs no LMCache (its backend classes
need it and say so). LMCache's own classes run in python/peer_tests/lmcache."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import kvpool.lmcache as kl
from kvpool.lmcache import Settings, SettingsError, choose_layout, plugin_type, pool_key
from kvpool.protocol import MAX_KEY_BYTES


def test_defaults_without_settings() -> None:
    s = Settings.from_extra_config(None)
    assert (s.plugin_name, s.master, s.layout, s.key_prefix, s.replicas, s.reset, s.timeout) == \
        ("kvpool", None, None, "lmcache/", 0, "all", 10.0)


def test_settings_under_the_plugin_instance_name() -> None:
    ec = {"remote_storage_plugin.kvpool.primary.master": " 10.0.0.5:50051 ",
          "remote_storage_plugin.kvpool.primary.layout": "META",
          "remote_storage_plugin.kvpool.primary.key_prefix": "m1/",
          "remote_storage_plugin.kvpool.primary.replicas": "2",
          "remote_storage_plugin.kvpool.primary.reset": "prefix",
          "remote_storage_plugin.kvpool.primary.timeout": 3,
          "remote_storage_plugin.kvpool.master": "ignored:1"}
    s = Settings.from_extra_config(ec, "kvpool.primary")
    assert (s.master, s.layout, s.key_prefix, s.replicas, s.reset, s.timeout) == \
        ("10.0.0.5:50051", "meta", "m1/", 2, "prefix", 3.0)
    assert s.config_key("master") == "remote_storage_plugin.kvpool.primary.master"


@pytest.mark.parametrize("key,value,named", [
    ("layout", "zero-copy", "layout"), ("replicas", "9", "replicas"), ("replicas", "two", "replicas"),
    ("reset", "everything", "reset"), ("timeout", "0", "timeout"), ("master", "", "master"),
    ("key_prefix", "x" * 300, "key_prefix"),
])
def test_bad_setting_names_its_key(key: str, value: str, named: str) -> None:
    with pytest.raises(SettingsError, match=rf"remote_storage_plugin\.kvpool\.{named}"):
        Settings.from_extra_config({f"remote_storage_plugin.kvpool.{key}": value})


def test_prefix_reset_needs_a_prefix() -> None:
    with pytest.raises(SettingsError, match="needs a prefix"):
        Settings.from_extra_config({"remote_storage_plugin.kvpool.reset": "prefix",
                                    "remote_storage_plugin.kvpool.key_prefix": ""})


def test_plugin_of_another_type_is_refused() -> None:
    assert plugin_type("kvpool.a.b") == "kvpool"
    with pytest.raises(SettingsError, match="not of type 'kvpool'"):
        Settings.from_extra_config({}, "redis")


def test_pool_key() -> None:
    k = "Qwen/Qwen3-8B@2@1@00ab12@bfloat16@cache_salt%v7"
    assert pool_key("lmcache/", k) == "lmcache/" + k
    long_key = "m" * MAX_KEY_BYTES + "@1@0@ff@bfloat16"
    hashed = pool_key("lmcache/", long_key)
    assert hashed.startswith("lmcache/sha256:") and len(hashed.encode()) <= MAX_KEY_BYTES
    assert hashed == pool_key("lmcache/", long_key) != pool_key("lmcache/", long_key + "x")


def test_layout_choice() -> None:
    unset, raw, meta = Settings(), Settings(layout="raw"), Settings(layout="meta")
    assert choose_layout(unset, "naive", False) == "raw"
    assert choose_layout(unset, None, False) == "raw"
    assert choose_layout(unset, "cachegen", False) == "meta"
    assert choose_layout(unset, "naive", True) == "meta"
    assert choose_layout(meta, "naive", False) == "meta"
    with pytest.raises(SettingsError, match="use layout 'meta'"):
        choose_layout(raw, "cachegen", False)
    with pytest.raises(SettingsError, match="use_layerwise"):
        choose_layout(raw, "naive", True)


def test_package_imports_no_lmcache() -> None:
    assert "lmcache" not in sys.modules
    if importlib.util.find_spec("lmcache") is None:  # this suite's interpreter has no engines
        with pytest.raises(ImportError, match="LMCache"):
            kl.KvPoolConnectorAdapter  # noqa: B018
    with pytest.raises(AttributeError):
        kl.NoSuchThing  # noqa: B018
