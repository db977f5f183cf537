"""Stand-ins the backend tests put in place of vendor software that a CPU-only machine lacks.

* ``install_fake_tool`` writes an executable vendor tool (``nvidia-smi``, ``npu-smi``, ...) that
  prints a recording, or runs a small shell body, and exits with a chosen code.
* ``fake_bin`` is a fixture: an empty directory put first on ``PATH`` for those tools.
* ``install_fake_torch`` replaces ``torch`` in ``sys.modules`` with a module holding only what the
  CUDA-API probes read (``__version__``, ``version.cuda`` / ``version.hip``, ``cuda.*``).
* ``install_fake_module`` makes an importable (or deliberately broken) vendor extension such as
  ``torch_npu`` and leaves ``sys.modules`` as it found it once the test ends.

The fixture reaches the test modules through ``tests/backends/conftest.py``.
"""

from __future__ import annotations

import os
import stat
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

_EXECUTABLE = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def install_fake_tool(directory: Path, name: str, stdout: str = "", *, body: str | None = None,
                      exit_code: int = 0) -> Path:
    """An executable NAME in DIRECTORY that prints STDOUT (or runs the shell BODY), then exits
    with EXIT_CODE.

    STDOUT is written verbatim to ``DIRECTORY/NAME.out`` and ``cat``-ed, so recordings need no
    quoting. A BODY that ends in its own ``exit`` (or ``exec``) decides the exit status itself.
    Installing the same NAME again replaces the tool. Returns the tool's path.
    """
    if body is not None and stdout:
        raise ValueError("give either STDOUT or BODY, not both")
    if body is None:
        payload = directory / f"{name}.out"
        payload.write_text(stdout)
        body = f"cat '{payload}'"
    tool = directory / name
    tool.write_text(f"#!/bin/sh\n{body}\nexit {exit_code}\n")
    tool.chmod(tool.stat().st_mode | _EXECUTABLE)
    return tool


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory put first on PATH for fake vendor tools (``install_fake_tool``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


def install_fake_torch(monkeypatch: pytest.MonkeyPatch, version: str, *, cuda: str | None = None,
                       hip: str | None = None, available: bool = True, count: int = 2) -> types.ModuleType:
    """A stand-in ``torch`` module with just what the CUDA-API probes read, in ``sys.modules``
    for the rest of the test.

    VERSION is ``torch.__version__`` (its ``+tag`` tells builds apart); CUDA and HIP are
    ``torch.version.cuda`` / ``torch.version.hip``; ``torch.cuda.is_available()`` returns
    AVAILABLE and ``torch.cuda.device_count()`` returns COUNT. Returns the fake module.
    """
    fake = types.ModuleType("torch")
    fake.__version__ = version  # type: ignore[attr-defined]
    fake.version = SimpleNamespace(cuda=cuda, hip=hip)  # type: ignore[attr-defined]
    fake.cuda = SimpleNamespace(is_available=lambda: available, device_count=lambda: count)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def install_fake_module(directory: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Path:
    """An importable package NAME under DIRECTORY whose ``__init__.py`` is SOURCE (source that
    raises makes a broken vendor extension), with DIRECTORY first on ``sys.path``.

    NAME is taken out of ``sys.modules`` now, so the next import finds the fake, and again
    when the test ends, so a fake imported by the code under test does not leak into later
    tests. Returns the package directory.
    """
    package = directory / name
    package.mkdir()
    (package / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(directory))
    # setitem records "absent" (or the real module) for teardown to restore; delitem then
    # removes it for the duration of the test.
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.delitem(sys.modules, name)
    return package
