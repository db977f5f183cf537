"""Backend discovery and device selection.

Built-in backends and third-party plugins arrive through the same entry-point group,
``adaptcheck.backends``. A plugin that fails to import is listed with its error rather than
breaking discovery. Selection asks capabilities (``is_accelerator``, ``supersedes``), never
vendor names.
"""

from __future__ import annotations

from pathlib import Path

from adaptcheck.backends.base import Backend, BackendInfo, ProbeResult
from adaptcheck.base import plugins
from adaptcheck.base.errors import DeviceError, UnknownNameError, did_you_mean

ENTRY_POINT_GROUP = "adaptcheck.backends"


def discover() -> dict[str, BackendInfo]:
    """Every backend registered in the entry-point group, by name (import errors kept)."""
    found: dict[str, BackendInfo] = {}
    for name, plugin in plugins.load_all(ENTRY_POINT_GROUP).items():
        info = BackendInfo(name=name, source=plugin.source)
        if plugin.error:
            info.load_error = plugin.error
        elif not (isinstance(plugin.obj, type) and issubclass(plugin.obj, Backend)):
            info.load_error = f"TypeError: {plugin.value} is not a Backend subclass"
        else:
            info.cls = plugin.obj
        found[name] = info
    return found


def get_backend(name: str) -> Backend:
    """Instantiate a backend by name, or raise UnknownNameError listing the valid names."""
    found = discover()
    info = found.get(name)
    if info is None:
        raise UnknownNameError(f"unknown device {name!r}", hint=did_you_mean(name, list(found)))
    if info.cls is None:
        raise DeviceError(f"backend {name!r} failed to load: {info.load_error}")
    return info.cls()


def probe_all() -> list[tuple[BackendInfo, ProbeResult]]:
    """Probe every discovered backend; load failures become unavailable probes."""
    rows: list[tuple[BackendInfo, ProbeResult]] = []
    for info in discover().values():
        if info.cls is None:
            rows.append((info, ProbeResult.no(f"plugin failed to load: {info.load_error}")))
        else:
            rows.append((info, info.cls().probe()))
    return rows


def select_backend(requested: str | None = None) -> tuple[Backend, ProbeResult]:
    """The backend to test.

    With ``requested``, that backend (DeviceError with the probe's reason if unavailable).
    Without, the one available accelerator backend (after dropping those another available
    backend supersedes), else CPU; several → DeviceError listing them.
    """
    if requested:
        backend = get_backend(requested)
        probe = backend.probe()
        if not probe.available:
            raise DeviceError(f"device {requested!r} is not available: {probe.reason}",
                              hint="run 'adaptcheck backends' to see what is available")
        return backend, probe
    available = [(info, probe) for info, probe in probe_all() if probe.available and info.cls is not None]
    accel = [(i, p) for i, p in available if i.cls is not None and i.cls.is_accelerator]
    superseded = {s for i, _ in accel if i.cls is not None for s in i.cls.supersedes}
    accel = [(i, p) for i, p in accel if i.name not in superseded]
    if len(accel) > 1:
        names = ", ".join(i.name for i, _ in accel)
        raise DeviceError(f"several accelerator backends are available ({names})",
                          hint="choose one with --device NAME")
    if accel:
        info, probe = accel[0]
        assert info.cls is not None
        return info.cls(), probe
    cpu = [(i, p) for i, p in available if i.cls is not None and not i.cls.is_accelerator]
    if not cpu:
        raise DeviceError("no backend is available, not even the CPU one",
                          hint="check that adaptcheck is installed (entry points missing)")
    info, probe = cpu[0]
    assert info.cls is not None
    return info.cls(), probe


def backend_data_files(attr: str) -> list[tuple[str, Path]]:
    """(backend name, file) for every discovered backend that declares ``attr``
    (``peaks_file``, ``rules_file``): how a plugin's own data reaches the shared lookups."""
    out: list[tuple[str, Path]] = []
    for name, info in discover().items():
        relative = getattr(info.cls, attr, None) if info.cls is not None else None
        if relative and info.cls is not None:
            out.append((name, info.cls.data_path(relative)))
    return out
