"""Writing an output file atomically: the one way adaptcheck replaces a file it produces.

results.json, the HTML report, a comparison, JUnit XML and the fleet matrix are all read by
other tools (CI, browsers, the next run's ``--baseline``) while they may be rewritten. Each is
written to a temporary file in the same folder and moved over the target, so a reader (or a
crash) never sees half a file and an older file stays intact until the new one is complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from adaptcheck.base.errors import OutputError


def write_text_atomic(path: Path, text: str, check: Callable[[Path], object] | None = None,
                      what: str = "output") -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` through a temporary file beside it.

    Parent folders are created. ``check`` reads the temporary file first and raises to refuse
    it, so an invalid file never replaces a good one. A path that cannot be written (a folder,
    a path under a file, no permission, a full disk) is an :class:`OutputError` naming
    ``what`` and the path — every output path comes from the user (``-o``, ``--html``,
    ``--junit``, ``--out``), so it is a one-line error (exit 2), never an internal error.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _unwritable(what, path, exc) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        # mkstemp creates 0600; these files are meant to be shared like any other output.
        os.chmod(tmp, 0o644)
        if check is not None:
            check(tmp)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _unwritable(what, path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _unwritable(what: str, path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {what} to {path}: {exc.strerror or exc}",
                       hint="choose a path in a folder you can write")
