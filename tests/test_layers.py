"""The package's import structure: no cycles, and imports that only point down.

Layers, top to bottom (README "Architecture"): the CLI → the session and the runner → the
steps (check kinds) → the library (perf, frameworks, backends, the OpenAI client,
collectives, compat, report, compare, fleet, cluster, repro, grading, the run folder) → the
base (schemas, data loading, errors, redaction, terminal safety, the plugin loader, process
plumbing), which imports nothing but itself. Every import is read from the source — module
level, inside functions and under ``TYPE_CHECKING`` alike — so an upward import fails this
test whichever way it is written.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "adaptcheck"

UPPER = ("adaptcheck.cli", "adaptcheck.__main__", "adaptcheck.session", "adaptcheck.steps")
"""What no library or base module may import."""

LIBRARY = ("adaptcheck.perf", "adaptcheck.frameworks", "adaptcheck.backends", "adaptcheck.compare",
           "adaptcheck.fleet", "adaptcheck.cluster", "adaptcheck.report", "adaptcheck.collectives",
           "adaptcheck.compat", "adaptcheck.repro", "adaptcheck.grade", "adaptcheck.runfolder",
           "adaptcheck.openai_client")
BASE = ("adaptcheck.base", "adaptcheck.models")
"""The base layer, a folder of its own (``adaptcheck.models`` is the schemas' old import path, kept
for plugins): what every other layer may import, and which imports only itself."""
LOWER = LIBRARY + BASE
"""Every library and base module: none of them may import from :data:`UPPER`."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(base: str, name: str) -> str:
    """``from base import name``: the submodule when there is one, else the module itself."""
    return f"{base}.{name}" if f"{base}.{name}" in MODULES else base


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(imported adaptcheck module, line) for every import statement in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "adaptcheck":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base.split(".")[0] != "adaptcheck":
                continue
            for alias in node.names:
                yield _resolve(base, alias.name), node.lineno


def graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in imports_of(m) if t in MODULES and t != m} for m in MODULES}


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def upward_imports() -> list[str]:
    return [f"{MODULES[m].relative_to(PKG.parent)}:{line} imports {target}"
            for m in MODULES if _under(m, LOWER)
            for target, line in imports_of(m) if _under(target, UPPER)]


def _shown(path: Path) -> str:
    """``path`` relative to the checkout (as is, for a module planted elsewhere by a test)."""
    return str(path.relative_to(PKG.parent)) if path.is_relative_to(PKG.parent) else str(path)


def base_imports_above() -> list[str]:
    """Imports from a base module of anything but the base (the package root's version aside)."""
    return [f"{_shown(MODULES[m])}:{line} imports {target}"
            for m in MODULES if _under(m, BASE)
            for target, line in imports_of(m) if target != "adaptcheck" and not _under(target, BASE)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges with a package's ``__init__`` re-exports left out: importing ``adaptcheck.x``
    for one name is not a dependency on every module the package re-exports."""
    return {m: {t for t in ts if not (MODULES[t].name == "__init__.py" and m.startswith(t + "."))}
            for m, ts in edges.items()}


def test_no_library_or_base_module_imports_the_cli_the_session_or_the_steps() -> None:
    assert upward_imports() == []


def test_the_base_imports_only_the_base() -> None:
    assert base_imports_above() == []


def test_every_module_has_a_layer() -> None:
    """A new top-level module or package is placed in a layer, or the two tests above skip it."""
    placed = UPPER + LOWER + ("adaptcheck.ladder",)  # ladder/: the runner, beside the session
    assert [m for m in MODULES if m != "adaptcheck" and not _under(m, placed)] == []


def test_there_are_no_import_cycles() -> None:
    assert cycles(_package_edges(graph())) == []


# --- the contract catches what it is meant to ---------------------------------------------------

def test_a_planted_upward_import_and_a_planted_cycle_are_caught(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    planted = tmp_path / "adaptcheck_perf_planted.py"
    planted.write_text("def f():\n    from adaptcheck.cli.app import main\n    return main\n")
    monkeypatch.setitem(MODULES, "adaptcheck.perf.planted", planted)
    assert any("imports adaptcheck.cli.app" in line for line in _planted_upward(planted))
    planted_base = tmp_path / "adaptcheck_procs_planted.py"
    planted_base.write_text("from adaptcheck.frameworks.server import descendants\n")
    monkeypatch.setitem(MODULES, "adaptcheck.base.procs.planted", planted_base)
    assert any("imports adaptcheck.frameworks.server" in line for line in base_imports_above())
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _planted_upward(planted: Path) -> list[str]:
    return [f"{planted}:{line} imports {t}" for t, line in imports_of("adaptcheck.perf.planted")
            if _under(t, UPPER)]
