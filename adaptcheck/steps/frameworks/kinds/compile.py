"""``framework.compile``: the compiled / graph-captured engine gives the eager engine's answers,
one prompt at a time and in batches that a captured graph would pad, and something really was
compiled (docs/features.md, "Graph capture / compile").

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared feature body is :mod:`adaptcheck.steps.frameworks.feature`.
The proof reads the compiled engine back: vLLM's resolved compilation mode, the modules its
torch.compile wrapper compiled, and its CUDA-graph mode and captured batch sizes (vLLM sets
none on the CPU, where the inductor path is the only one). A served engine is read from its
log (the engine's config line, compile and capture lines), and is ``None`` where the log says nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, JsonValue, model_validator

from adaptcheck.base.schemas.framework_evidence import FeatureProof
from adaptcheck.frameworks.base import Framework, Generation, GenRequest
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.lifecycle import Active
from adaptcheck.steps.frameworks.probes import not_applicable

MAX_LOG_SCAN_BYTES = 4 << 20
"""How much of a server log is read (the engine's config and compile lines come at start-up)."""
ENGINE_MODE = re.compile(r"'mode': <CompilationMode\.(\w+)")
GRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
CAPTURE_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]*)\]")
COMPILED_LINE = re.compile(r"saved AOT compiled function|Directly load AOT compilation|Starting torch\.compile|"
                           r"torch\.compile (?:takes|and initial)|Compiling a graph for|Capturing CUDA graphs|"
                           r"Graph capturing finished")
"""vLLM's log lines that only a compile or a graph capture writes."""


class CompileParams(FeatureParams):
    """``framework.compile``: compile / graph capture on vs off, alone and in padded batches
    (``together`` is not used: the prompts go both ways)."""

    prompts: int = Field(default=5, ge=1, description="Prompts compared one at a time; the batches take the first ones.")
    batch_sizes: list[int] = Field(default_factory=lambda: [3, 5], min_length=1, description="Batch sizes the "
                                   "prompts are also submitted in: sizes between CUDA-graph capture sizes (vLLM "
                                   "captures 1, 2, 4, 8 …), so a captured engine pads them.")

    @model_validator(mode="after")
    def _batches_fit(self) -> CompileParams:
        if any(b < 2 or b > self.prompts for b in self.batch_sizes):
            raise ValueError(f"batch_sizes {self.batch_sizes}: each must be 2..prompts ({self.prompts})")
        return self


class CompileCheck(FrameworkCheck):
    """Compile on vs off: same greedy tokens and distributions alone and in padded batches, and
    the engine compiled (and, where the platform captures graphs, captured) something."""

    kind = "framework.compile"
    step = 4
    description = ("Graph capture / torch.compile on vs off give the same answers, alone and in padded "
                   "batches; the engine really compiled or captured.")
    params_model = CompileParams
    label = "compile on vs off"
    compares = "compile on vs off"
    typical_s = 60.0

    def run(self, ctx: CheckContext, params: CompileParams) -> Outcome:
        cls = framework_class(params.framework)
        if not cls.supports_compile_toggle:
            return not_applicable(params, f"{cls.display_name} has no graph-capture / compile switch")
        return feature_vs_plain(ctx, params, "compile", {"compile": True}, lambda active: _requests(params),
                                lambda active, deltas: _prove(active, params.batch_sizes),
                                names=("compile off", "compile on"), plain={"compile": False},
                                submit=lambda fw, reqs: _submit(fw, reqs, params.batch_sizes),
                                feature_name="graph_capture")


def _requests(p: CompileParams) -> list[GenRequest]:
    # Twice the short prompt: every prefill is longer than the padded step sizes, so only the
    # decode steps of a batch run at those sizes.
    texts = [f"{t} {t}" for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n) for t in texts]


def _submit(fw: Framework, reqs: list[GenRequest], sizes: list[int]) -> list[Generation]:
    """Every prompt alone (decode steps of one token), then the first ``n`` together for each
    batch size ``n`` (decode steps of ``n`` tokens): the answers in that order."""
    out = [fw.generate([r])[0] for r in reqs]
    for n in sizes:
        out.extend(fw.generate(reqs[:n]))
    return out


def _padding_note(sizes: list[int], batches: list[int]) -> str:
    if not sizes:
        return (f"no CUDA graphs captured on this platform (vLLM captures none on the CPU): batches of "
                f"{', '.join(map(str, batches))} ran through the compiled graph at their own size")
    padded = [b for b in batches if b not in sizes and b < max(sizes)]
    if not padded:
        return f"none of the batch sizes {batches} needs padding here (captured {sizes})"
    return "batches of " + ", ".join(f"{b} (padded to {min(s for s in sizes if s > b)})" for b in padded)


def _prove(active: Active, batches: list[int]) -> Proof:
    facts = facts_of(active)
    if not facts or "compilation_mode" not in facts:
        return _prove_from_log(active, batches)
    mode, graphs = facts.get("compilation_mode"), facts.get("cudagraph_mode")
    listed = facts.get("cudagraph_capture_sizes")
    sizes = [int(s) for s in listed if isinstance(s, int)] if isinstance(listed, list) else []
    compiled = facts.get("compiled_modules")
    bad: list[str] = []
    if mode in (None, "NONE", 0):
        bad.append(f"compile was asked for but the engine resolved compilation mode {mode!r}: it runs eager")
    if compiled == []:
        bad.append("no module was compiled by torch.compile")
    if graphs not in (None, "NONE") and not sizes:
        bad.append(f"CUDA graphs are on ({graphs}) but no batch size was captured")
    how = (f"compilation mode {mode}; compiled {compiled if compiled is not None else 'not read back'}; "
           f"CUDA graphs {graphs}, captured sizes {sizes}")
    ok = not bad
    how = "; ".join(bad) + f" ({how})" if bad else f"{how}; {_padding_note(sizes, batches)}"
    record = FeatureProof(feature="graph_capture", active=ok, how=how, engine=facts)
    return Proof(rows=[engine_row("compile", ok, how)], record=record,
                 metrics={"compilation_mode": str(mode), "compiled_modules": len(compiled) if isinstance(compiled, list)
                          else None, "captured_sizes": len(sizes)})


def _prove_from_log(active: Active, batches: list[int]) -> Proof:
    """A served engine: what its log says it resolved and did, or ``None`` where it says nothing."""
    facts: dict[str, JsonValue] = {}
    text = server_log(active)
    ok: bool | None
    if text is None:
        ok, how = None, "not read back: the framework exposes neither its engine config nor a log"
    else:
        mode = ENGINE_MODE.search(text)
        graphs = GRAPH_MODE.search(text)
        sizes_m = CAPTURE_SIZES.search(text)
        sizes = [int(s) for s in sizes_m.group(1).split(",") if s.strip()] if sizes_m else []
        lines = sorted({m.group(0) for m in COMPILED_LINE.finditer(text)})
        facts = {"compilation_mode": mode.group(1) if mode else None, "cudagraph_mode": graphs.group(1) if graphs else None,
                 "cudagraph_capture_sizes": list(sizes), "compile_log_lines": list(lines)}
        if mode is not None and mode.group(1) == "NONE":
            ok, how = False, "compile was asked for but the server's engine logged compilation mode NONE: it runs eager"
        elif lines:
            ok, how = True, (f"the server log shows compilation mode {facts['compilation_mode']} and "
                             f"{'; '.join(lines)}; CUDA graphs {facts['cudagraph_mode']}, captured sizes {sizes}; "
                             f"{_padding_note(sizes, batches)}")
        else:
            ok, how = None, ("not read back: the server log names no compile or graph capture (engine mode "
                             f"{facts['compilation_mode']})")
    record = FeatureProof(feature="graph_capture", active=ok, how=how, engine=facts)
    return Proof(rows=[engine_row("compile", ok, how)], record=record,
                 metrics={"compilation_mode": str(facts.get("compilation_mode"))})


def server_log(active: Active) -> str | None:
    """The start of a launched server's log (None for an in-process framework or an unreadable log)."""
    path = active.framework.describe().get("server_log")
    if not isinstance(path, str):
        return None
    try:
        with open(Path(path), "rb") as fh:
            return fh.read(MAX_LOG_SCAN_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
