"""Check kinds that misbehave on purpose, to prove the runner's isolation."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from adaptcheck.ladder.check import Check, CheckContext, NoParams, Outcome


class PassCheck(Check):
    kind = "dummy.pass"
    step = 0
    description = "Always passes; leaves a marker file so tests can see it ran."

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        marker = ctx.run_dir / "ran.txt"
        with open(marker, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return Outcome.passed("fine", metrics={"pid": os.getpid(), "seed": ctx.seed})


class FailCheck(Check):
    kind = "dummy.fail"
    step = 0

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        return Outcome.failed("failed on purpose")


class RaiseCheck(Check):
    kind = "dummy.raise"
    step = 0

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        raise ValueError("raised on purpose")


class SkipParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    why: str = "skipped on purpose"


class SkipCheck(Check):
    kind = "dummy.skip"
    step = 0
    description = "Always skips with the reason given (escaping tests put markup in it)."
    params_model = SkipParams

    def run(self, ctx: CheckContext, params: SkipParams) -> Outcome:
        return Outcome.skipped(params.why)


class CrashParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    how: str = "segfault"


class CrashCheck(Check):
    kind = "dummy.crash"
    step = 0
    params_model = CrashParams

    def run(self, ctx: CheckContext, params: CrashParams) -> Outcome:
        print("about to crash", flush=True)
        if params.how == "segfault":
            ctypes.string_at(0)  # dereferences NULL: a real SIGSEGV
        elif params.how == "abort":
            os.abort()
        elif params.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif params.how == "exit":
            os._exit(7)
        return Outcome.passed("did not crash")


class HangCheck(Check):
    kind = "dummy.hang"
    step = 0

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        # Ignores SIGTERM like a process stuck in a driver call would.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)


class SleepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 1.0
    marker: str = ""


class SleepCheck(Check):
    kind = "dummy.sleep"
    step = 0
    params_model = SleepParams

    def run(self, ctx: CheckContext, params: SleepParams) -> Outcome:
        if params.marker:
            marker = Path(ctx.run_dir, params.marker)
            if marker.exists():  # second attempt (after --resume): finish at once
                return Outcome.passed("resumed")
            marker.write_text(str(os.getpid()))
        time.sleep(params.seconds)
        return Outcome.passed(f"slept {params.seconds}s")


class EchoEnvParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    also_print: bool = False
    """Also print the value to stdout (the worker's stdout is worker.log)."""
    also_write: str = ""
    """Also write it to this file of the run folder (as perf/serving/*.jsonl are written)."""


class EchoEnvCheck(Check):
    """Leaks an environment variable's value into its message, as a careless check might
    (and, when asked, into worker.log and a file of its own, which no writer scrubs)."""

    kind = "dummy.echo_env"
    step = 0
    params_model = EchoEnvParams

    def run(self, ctx: CheckContext, params: EchoEnvParams) -> Outcome:
        value = os.environ.get(params.name, "")
        if params.also_print:
            print(f"worker sees {params.name}={value}", flush=True)
        if params.also_write:
            path = Path(ctx.run_dir, params.also_write)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f'{{"{params.name}": "{value}"}}\n')
        return Outcome.failed(f"connect failed with key {value}", details={"key": value})


class ProgressParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = 4
    interval_s: float = 0.6
    timed_s: float = 0.0


class ProgressCheck(Check):
    """Reports progress while it works, like a soak: proves progress lines reach the runner
    and that the runner still waits for (and keeps) the final result."""

    kind = "dummy.progress"
    step = 0
    params_model = ProgressParams

    def run(self, ctx: CheckContext, params: ProgressParams) -> Outcome:
        for i in range(1, params.steps + 1):
            time.sleep(params.interval_s)
            ctx.progress(i, params.steps, "steps", note=f"step {i}")
        if params.timed_s:
            with ctx.timed_progress(params.timed_s, note="timed"):
                time.sleep(params.timed_s)
        return Outcome.passed(f"made {params.steps} steps", metrics={"steps": params.steps})
