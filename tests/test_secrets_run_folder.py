"""No secret in any file of a run folder, nor on the terminal (issue 12).

One real ``adaptcheck run`` (a subprocess, as a user runs it) with secrets planted where they
leaked before: environment variables named with the words PAT, PW and CREDS, a proxy URL
without a scheme (``user:pw@host``), and an ``--endpoint`` URL with credentials. A careless
check (the test plugin's ``dummy.echo_env``) also prints secrets to worker.log and writes
them to files of its own under perf/, which no writer scrubs: only the final sweep of the run
folder can catch them. Then every byte of every file under the run folder, the JUnit file,
stdout and stderr are searched for the planted strings.

The endpoint is a small local HTTP server that records the Authorization header it gets and
answers 401: the checks put the endpoint URL into their messages, and the server proves the
worker still used the real URL (credentials included) although run.json keeps it redacted —
on the first run and on a resume that is given ``--endpoint`` again.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from adaptcheck.base.integrity import Integrity, verify_file
from adaptcheck.base.redact import REDACTED
from tests.conftest import ladder_text, run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

HUB_PAT = "hubPAT-planted-91823"
TORCH_PW = "torchPW-planted-55123"
DB_CREDS = "dbCREDS-planted-77412"
PROXY_USER = "proxyuser7731"
PROXY_PW = "pr0xyPW-66120"
ENDPOINT_USER = "epuser5519"
ENDPOINT_PW = "s3cr3tTOKEN-40417"
PLANTED = (HUB_PAT, TORCH_PW, DB_CREDS, PROXY_USER, PROXY_PW, ENDPOINT_USER, ENDPOINT_PW)

PROXY = f"{PROXY_USER}:{PROXY_PW}@proxy.example:3128"  # no scheme, as proxy variables are often written
ENV = {
    "HF_HUB_PAT": HUB_PAT, "TORCH_PW": TORCH_PW, "VLLM_DB_CREDS": DB_CREDS,
    "HTTPS_PROXY": PROXY,
    # Captured into results.json's environment (HF_ prefix) under a name that is not secret:
    # only the shape user:pw@host can hide it.
    "HF_HUB_PROXY": PROXY,
    # No API key: the worker must authenticate with the URL's own credentials.
    "ADAPTCHECK_API_KEY": "", "OPENAI_API_KEY": "",
}


class _Recorder(BaseHTTPRequestHandler):
    """Answers 401 to everything and remembers each request's Authorization header."""

    seen: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        body = b'{"error": {"message": "unauthorized"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def endpoint_server() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def _ladder(tmp_path: Path) -> Path:
    checks: list[dict[str, object]] = [
        {"id": "matrix.capture", "step": 1, "kind": "matrix.capture"},
        {"id": "leak.torch_pw", "step": 1, "kind": "dummy.echo_env",
         "params": {"name": "TORCH_PW", "also_print": True, "also_write": "perf/serving/leak.jsonl"}},
        {"id": "leak.proxy", "step": 1, "kind": "dummy.echo_env",
         "params": {"name": "HTTPS_PROXY", "also_print": True, "also_write": "perf/soak/leak.jsonl"}},
        {"id": "framework.endpoint.load", "step": 4, "kind": "framework.load", "tags": ["load"],
         "params": {"framework": "endpoint"}},
    ]
    path = tmp_path / "ladder.yaml"
    path.write_text(ladder_text(checks, timeout_s=90))
    return path


def _leaks(run_dir: Path, *texts: str, extra_files: tuple[Path, ...] = ()) -> list[str]:
    """Every place a planted secret appears: 'path: secret' or 'output: secret'."""
    found: list[str] = []
    files = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()] + list(extra_files)
    for path in files:
        data = path.read_bytes()  # binary-safe: any byte sequence is searched as it is
        found += [f"{path}: {s}" for s in PLANTED if s.encode() in data]
    for i, text in enumerate(texts):
        found += [f"output {i}: {s}" for s in PLANTED if s in text]
    return found


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.slow
def test_no_planted_secret_in_the_run_folder_or_the_terminal(tmp_path: Path,
                                                             endpoint_server: tuple[int, list[str]]) -> None:
    port, seen = endpoint_server
    endpoint = f"http://{ENDPOINT_USER}:{ENDPOINT_PW}@127.0.0.1:{port}/v1"
    shown_endpoint = f"http://{REDACTED}@127.0.0.1:{port}/v1"
    run_dir, junit = tmp_path / "run", tmp_path / "junit.xml"
    done = run_cli(["run", "--ladder", str(_ladder(tmp_path)), "--device", "cpu", "--out", str(run_dir),
                    "--endpoint", endpoint, "--junit", str(junit), "--format", "json"], env=ENV, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

    # The run still produced its files, the worker's own ones included.
    for name in ("run.json", "ladder.yaml", "checks.jsonl", "worker.log", "results.json", "report.html",
                 "perf/serving/leak.jsonl", "perf/soak/leak.jsonl"):
        assert (run_dir / name).is_file(), name
    assert junit.is_file()

    assert _leaks(run_dir, done.stdout, done.stderr, extra_files=(junit,)) == []

    # The worker authenticated with the real URL, which run.json does not hold.
    assert seen and set(seen) == {_basic(ENDPOINT_USER, ENDPOINT_PW)}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["endpoint"] == shown_endpoint
    assert f"--endpoint {shown_endpoint}" in " ".join(meta["command"])

    # results.json: secret-named variables redacted, the proxy's credentials hidden by shape,
    # the endpoint URL did flow through a check's message, and the file is still intact.
    results = json.loads((run_dir / "results.json").read_text())
    env_vars = results["environment"]["env_vars"]
    assert env_vars["HF_HUB_PAT"] == env_vars["TORCH_PW"] == env_vars["VLLM_DB_CREDS"] == REDACTED
    assert env_vars["HF_HUB_PROXY"] == f"{REDACTED}@proxy.example:3128"
    by_id = {c["id"]: c for c in results["checks"]}
    assert shown_endpoint in by_id["framework.endpoint.load"]["message"]
    assert "401" in by_id["framework.endpoint.load"]["message"]
    assert verify_file(run_dir / "results.json").status is Integrity.INTACT
    assert json.loads(done.stdout)["run_id"] == results["run_id"]

    # The files nobody scrubs as they are written were swept at the end (the check did write there).
    assert f"worker sees TORCH_PW={REDACTED}" in (run_dir / "worker.log").read_text()
    assert f"worker sees HTTPS_PROXY={REDACTED}@proxy.example:3128" in (run_dir / "worker.log").read_text()
    assert REDACTED in (run_dir / "perf/serving/leak.jsonl").read_text()

    # --- resume: the endpoint's credentials must be given again --------------------------
    # As if the run had been killed during the endpoint check: its record and the remembered
    # load failure (framework/*.failed) are gone, so the resumed worker connects again.
    journal = run_dir / "checks.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(ln for ln in lines if json.loads(ln).get("spec_id") != "framework.endpoint.load"))
    for failed in (run_dir / "framework").glob("*.failed"):
        failed.unlink()
    seen.clear()

    missing = run_cli(["run", "--resume", str(run_dir)], env=ENV, timeout=120)
    assert missing.returncode == 2, missing.stderr
    assert "had credentials" in missing.stderr and "--endpoint" in missing.stderr
    other = f"http://{ENDPOINT_USER}:{ENDPOINT_PW}@127.0.0.1:{port + 1}/v1"
    wrong = run_cli(["run", "--resume", str(run_dir), "--endpoint", other], env=ENV, timeout=120)
    assert wrong.returncode == 2, wrong.stderr
    assert "not this run's endpoint" in wrong.stderr
    assert seen == []  # refused before any check ran

    resumed = run_cli(["run", "--resume", str(run_dir), "--endpoint", endpoint], env=ENV, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert seen, resumed.stderr[-3000:]
    assert seen and set(seen) == {_basic(ENDPOINT_USER, ENDPOINT_PW)}
    assert _leaks(run_dir, missing.stderr, wrong.stderr, resumed.stdout, resumed.stderr) == []
    assert json.loads((run_dir / "run.json").read_text())["endpoint"] == shown_endpoint
    results = json.loads((run_dir / "results.json").read_text())
    assert shown_endpoint in {c["id"]: c for c in results["checks"]}["framework.endpoint.load"]["message"]
