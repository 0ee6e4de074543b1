"""CRC32C backends agree with each other and with the check value; the package installs offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from kvpool import crc


def test_check_value_and_backends_agree() -> None:
    backends = {"python": crc.crc32c_pure}
    for name, make in (("isal", crc._isal), ("crc32c", crc._module)):
        impl = make()
        if impl is not None:
            backends[name] = impl
    assert "isal" in backends, "libisal2 is missing: scripts/python-deps.sh installs it"
    samples = [b"", b"123456789", bytes(range(256)) * 17, os.urandom(100_003)]
    for s in samples:
        want = crc.crc32c_pure(s)
        for name, f in backends.items():
            for form in (s, bytearray(s), memoryview(s), memoryview(bytearray(b"xx" + s))[2:]):
                assert f(form) == want, (name, len(s), type(form))
    assert crc.crc32c_pure(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_forcing_an_unknown_backend_is_an_error() -> None:
    with pytest.raises(ValueError, match="KVPOOL_CRC32C must be"):
        crc._choose("zlib")


def test_pip_installs_offline_with_no_dependencies(tmp_path: Path) -> None:
    """`pip install ./python` with no package index: the in-tree build backend needs nothing."""
    pip = None
    for py in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if py and subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            pip = py
            break
    if pip is None:
        pytest.skip("no pip on this machine")
    target = tmp_path / "site"
    out = subprocess.run([pip, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(target),
                          str(REPO / "python")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "kvpool" / "py.typed").exists()
    check = subprocess.run([pip, "-c", "import kvpool, kvpool.client, kvpool.protocol; print(kvpool.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert check.returncode == 0, check.stderr
    assert str(target) in check.stdout
