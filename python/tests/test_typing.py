"""The package's type hints are checked, not just written: mypy over python/kvpool must pass."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_mypy_passes_on_the_package() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "python" / "pyproject.toml"),
                          str(REPO / "python" / "kvpool")], capture_output=True, text=True, cwd=REPO / "python",
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
