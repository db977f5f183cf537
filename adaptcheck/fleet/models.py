"""Schema of the fleet compatibility matrix (``adaptcheck matrix merge -o matrix.json``).

One row per machine/software *combination* — backend, devices, architecture and the
versions of the stack that decide whether inference works — never per host: every node of
the same combination lands in the same row, listing its hosts and runs. Grades are always
recomputed from each file's checks and rules, never taken from the file's stored grade.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.compat.known_good import KnownGoodEntry

FLEET_SCHEMA_VERSION = "1.0"
KNOWN_GOOD_MIN_LEVEL = "L4"
"""A combination can be exported as known-good only when its latest run reached this level."""


class StackKey(BaseModel):
    """What makes two runs the same combination (hostnames deliberately left out)."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(description="adaptcheck backend name, e.g. 'cpu', 'cuda'.")
    devices: list[str] = Field(description="Distinct device names, sorted (the SMI/torch product names).")
    device_count: int = Field(ge=0, description="Devices of the backend visible to the run.")
    arch: str = Field(description="Machine architecture (uname -m).")
    versions: dict[str, str] = Field(
        description="Key versions by known-good constraint key: python, torch, extension.<dist>, package.<dist> "
                    "(vLLM distributions, vLLM plugin distributions, transformers, sglang), driver, runtime.<name>. "
                    "Only what is installed; an absent part has no key.")
    plugins: list[str] = Field(
        description="vLLM plugin entry points not shipped by vLLM itself: 'group:name (dist version)', "
                    "suffixed ' [blocked by VLLM_PLUGINS]' when the allow-list excludes it.")


class RunRef(BaseModel):
    """One merged run."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="Run id from results.json (each counted once).")
    path: str = Field(description="The results file it was read from.")
    host: str = Field(description="Host name the run captured.")
    started_at: datetime = Field(description="Start of the run (UTC).")
    grade: str = Field(description="Grade recomputed from the file's checks and grade rules.")
    stored_grade: str = Field(description="Grade the file claims; differs from 'grade' only if the file was edited.")
    ladder: str = Field(description="Ladder id and version, 'id version'.")
    adaptcheck_version: str = Field(description="adaptcheck version that wrote the file.")
    integrity: str = Field(description="Digest check of the file: intact | edited | no_digest | unreadable.")
    verified: bool = Field(default=True, description="False when the file was merged although edited after its run "
                           "or undigested (--allow-unverified): nothing vouches for its grade.")


class Combination(BaseModel):
    """One row of the matrix."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable short id of the combination (hash of its key).")
    key: StackKey = Field(description="The combination.")
    best_grade: str = Field(description="Highest recomputed grade of any of its runs.")
    best_run_id: str = Field(description="Run that reached the best grade (the latest such run).")
    latest_grade: str = Field(description="Recomputed grade of the most recent run (by start time).")
    latest_run_id: str = Field(description="The most recent run.")
    latest_blockers: list[str] = Field(description="Blockers of the next level in the most recent run.")
    runs: list[RunRef] = Field(description="Every run of this combination, oldest first.")
    hosts: list[str] = Field(description="Distinct hosts that ran it, sorted.")
    ladders: list[str] = Field(description="Distinct ladders ('id version') its runs used, sorted.")
    first_started: datetime = Field(description="Start of the oldest run.")
    last_started: datetime = Field(description="Start of the most recent run.")
    known_good: bool = Field(description=f"True when the most recent run reached {KNOWN_GOOD_MIN_LEVEL} or above: "
                                         "it may be exported as a known-good entry.")
    known_good_reason: str = Field(description="Why it does or does not qualify, in one line.")
    verified: bool = Field(default=True, description="False when any of its runs was merged unverified "
                           "(--allow-unverified); each such run says why.")


class SkippedInput(BaseModel):
    """An input that was not merged, and why."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="The path as given.")
    reason: str = Field(description="Why it was skipped, one line.")
    unverified: bool = Field(default=False, description="True when skipped because it was edited after its run or "
                             "carries no digest: --allow-unverified would merge it (marked).")


class FleetMatrix(BaseModel):
    """The whole merged matrix."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = Field(default=FLEET_SCHEMA_VERSION, description="Version of this schema.")
    adaptcheck_version: str = Field(description="adaptcheck version that merged it.")
    generated_at: datetime = Field(description="When the merge ran (UTC).")
    inputs: int = Field(ge=0, description="Number of inputs given.")
    merged_runs: int = Field(ge=0, description="Distinct runs merged into rows.")
    rows: list[Combination] = Field(description="One row per combination, sorted by backend, devices, arch.")
    skipped: list[SkippedInput] = Field(description="Inputs not merged (unreadable, not a results file, "
                                                    "edited after the run or undigested without "
                                                    "--allow-unverified, incomplete run, no captured stack, "
                                                    "duplicate run id).")


class Refusal(BaseModel):
    """A combination that was not exported as known-good."""

    model_config = ConfigDict(extra="forbid")

    row: str = Field(description="Combination id.")
    summary: str = Field(description="The combination in words.")
    reason: str = Field(description="Why it was refused.")


class KnownGoodExport(BaseModel):
    """What ``export-known-good`` did."""

    model_config = ConfigDict(extra="forbid")

    output: str | None = Field(description="File written; None when nothing qualified (nothing written).")
    entries: list[KnownGoodEntry] = Field(description="Entries written (or updated) in that file.")
    kept: int = Field(ge=0, description="Entries already in the file that were kept unchanged.")
    refused: list[Refusal] = Field(description="Combinations below the bar, with the reason.")
    skipped: list[SkippedInput] = Field(description="Inputs that could not be merged.")
