"""Where adaptcheck's shipped data lives.

In a wheel, ``ladders/`` and ``matrices/`` are carried as ``adaptcheck/_data/…``; in a
source checkout (editable install) they are read from the repository root. One function
answers both so nothing else cares how adaptcheck was installed.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parents[1]  # adaptcheck/ (this module is adaptcheck/base/paths.py)


def data_dir(name: str) -> Path:
    """Folder of shipped data: 'ladders' or 'matrices'."""
    packaged = _PKG / "_data" / name
    if packaged.is_dir():
        return packaged
    source = _PKG.parent / name
    if source.is_dir():
        return source
    raise FileNotFoundError(f"adaptcheck data folder {name!r} is missing from this installation")


def default_reports_dir() -> Path:
    """``reports/`` in the current directory: where a user expects to find their run."""
    return Path.cwd() / "reports"


def cache_dir(*parts: str) -> Path:
    """adaptcheck's cache (synthetic models, compiler caches), created on demand.

    ``$ADAPTCHECK_CACHE_DIR`` when set (CI and tests point it at a scratch folder), else
    ``$XDG_CACHE_HOME/adaptcheck``, else ``~/.cache/adaptcheck``.
    """
    import os

    root_env = os.environ.get("ADAPTCHECK_CACHE_DIR")
    if root_env:
        root = Path(root_env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "adaptcheck"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
