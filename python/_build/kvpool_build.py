"""A PEP 517 build backend for the kvpool package, standard library only.

kvpool must install where there is no package index (``pip install ./python`` offline), and pip's
isolated build would otherwise fetch setuptools. The package is pure Python with no dependencies, so
a wheel is a zip of ``kvpool/`` plus the metadata files the wheel format asks for (PEP 427, core
metadata 2.1). Only what pip calls is implemented: wheels (regular and editable) and an sdist.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "kvpool"
VERSION = "0.1.0"
TAG = "py3-none-any"
DIST_INFO = f"{NAME}-{VERSION}.dist-info"

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Python client for the kvpool KV-cache pool, a Mooncake-Store-compatible store, and a vLLM v1 connector
Requires-Python: >=3.11
Provides-Extra: tensors
Requires-Dist: numpy; extra == "tensors"
Requires-Dist: torch; extra == "tensors"
Provides-Extra: fast-crc
Requires-Dist: crc32c; extra == "fast-crc"
"""

WHEEL = f"""Wheel-Version: 1.0
Generator: kvpool_build
Root-Is-Purelib: true
Tag: {TAG}
"""


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    return []


def get_requires_for_build_sdist(config_settings=None):  # type: ignore[no-untyped-def]
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def _files() -> list[Path]:
    return sorted(p for p in (ROOT / NAME).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(directory: str, entries: dict[str, bytes]) -> str:
    entries = dict(entries)
    entries[f"{DIST_INFO}/METADATA"] = METADATA.encode()
    entries[f"{DIST_INFO}/WHEEL"] = WHEEL.encode()
    record = [_record_line(n, d) for n, d in entries.items()] + [f"{DIST_INFO}/RECORD,,"]
    entries[f"{DIST_INFO}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in entries.items():
            z.writestr(n, d)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    return _wheel(wheel_directory, {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in _files()})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    # a .pth file that puts the checkout's python/ directory on sys.path
    return _wheel(wheel_directory, {f"__editable__.{NAME}.pth": (str(ROOT) + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):  # type: ignore[no-untyped-def]
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for p in [ROOT / "pyproject.toml", *(ROOT / "_build").glob("*.py"), *_files()]:
            t.add(p, arcname=f"{base}/{p.relative_to(ROOT).as_posix()}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
