"""``adaptcheck.models``, the schemas' old import path, still works for plugins written against it."""

from __future__ import annotations

import subprocess
import sys


def test_old_and_new_paths_give_the_same_classes() -> None:
    # A fresh interpreter: the alias must work as a plugin's first import, not only after the
    # package has been imported by the new path.
    code = ("from adaptcheck.models.environment import DeviceInfo as Old\n"
            "from adaptcheck.models.results import RunResults as OldResults\n"
            "from adaptcheck.base.schemas.environment import DeviceInfo as New\n"
            "from adaptcheck.base.schemas.results import RunResults as NewResults\n"
            "assert Old is New and OldResults is NewResults\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
