"""Where reproducers live in a run folder, and writing them.

One file per check id: ``<run folder>/repro/<check id>.py``. A check id comes from a
ladder (user data), so characters outside ``[A-Za-z0-9._-]`` become ``_`` and the name can
never leave the ``repro`` folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from adaptcheck.base.atomic import write_text_atomic

REPRO_DIR = "repro"
"""Folder of the run folder holding the scripts."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def repro_relpath(check_id: str) -> str:
    """``repro/<check id>.py`` relative to the run folder (what results.json records)."""
    name = _UNSAFE.sub("_", check_id).lstrip(".") or "check"
    return f"{REPRO_DIR}/{name}.py"


def repro_path(run_dir: Path, check_id: str) -> Path:
    """The script's path for ``check_id`` in ``run_dir``."""
    return Path(run_dir) / repro_relpath(check_id)


def write_script(run_dir: Path, check_id: str, text: str) -> Path:
    """Write ``text`` as the check's reproducer (atomically, executable) and return its path."""
    path = repro_path(run_dir, check_id)
    # Refuse a script that does not even compile: a reproducer must run as written.
    write_text_atomic(path, text, check=lambda p: compile(p.read_text(encoding="utf-8"), str(p), "exec"),
                      what="reproducer")
    os.chmod(path, 0o755)
    return path
