"""The Python client's layers (docs/architecture.md, "The clients' layers"): no import cycle anywhere in
``python/kvpool``, and nothing below the facade imports it.

Imports are read from the source, every one of them: module level, inside functions, and under
``TYPE_CHECKING`` (a cycle through type hints is still a cycle a reader has to hold in their head).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvpool"

#: The modules below the facade ``kvpool.client``: the operations, what they keep between calls, the channels.
BELOW_THE_FACADE = ("reads", "two_phase", "leased_puts", "ranged", "parts", "read_lease", "write_leases",
                    "locations", "channels", "segment_directory", "master_channel", "_net", "shm", "lanes")


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = ["kvpool", *f.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (a name imported from a package counts as its submodule when
    there is one of that name, else as the package)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(package[:len(package) - node.level + 1]) if node.level else "")
            base = ".".join(x for x in (base, node.module or "") if x)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, f, modules) for m, f in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_nothing_below_the_facade_imports_it_or_the_package() -> None:
    graph = _graph()
    for m in BELOW_THE_FACADE:
        assert f"kvpool.{m}" in graph, f"kvpool.{m} is gone: update BELOW_THE_FACADE"
        up = graph[f"kvpool.{m}"] & {"kvpool.client", "kvpool"}
        assert not up, f"kvpool.{m} imports {sorted(up)}"


def test_the_cycle_check_sees_a_cycle_through_type_hints() -> None:
    # the check itself must be able to fail: two modules importing each other, one only for type checking
    graph = {"kvpool.a": {"kvpool.b"}, "kvpool.b": {"kvpool.a"}, "kvpool.c": {"kvpool.a"}}
    assert _cycles(graph) == [["kvpool.a", "kvpool.b"]]
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .client import Client\n"
    tmp = PACKAGE.parent / "tests" / "_layers_probe.py"
    try:
        tmp.write_text(src)
        assert _imports("kvpool.reads", tmp, _modules()) == {"kvpool.client"}
    finally:
        tmp.unlink()
