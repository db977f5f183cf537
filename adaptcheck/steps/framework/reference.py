"""The CPU reference run and the healthy control: the same weights, transformers on the CPU.

*Reference*: float64 where it fits. float64 makes the reference's own rounding negligible
next to any device dtype, so a divergence is the device's. A model too big for float64 in
this host's memory falls back to float32 (stated in the evidence); one too big even for
that is a ``skip`` with the reason — never a silent pass. The reference answers each
prompt greedily, and then scores its own sequences (prompt + continuation) teacher-forced:
the per-position distributions every framework is compared against.

*Control*: the same sequences scored by transformers on the CPU at the served dtype —
torch's CPU kernels, taken as correct. How far the control is from the reference is what
a correct set of kernels at that dtype costs on this model and these sequences; the
device is held to a multiple of it (see ``matrices/tolerances.yaml`` ``model_numerics``).

Results are cached in the run folder keyed by weights, prompts and settings: every
framework of a run is compared against the same reference and control, computed once even
though the checks run in separate worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptcheck.frameworks.base import (
    FrameworkError,
    Generation,
    GenRequest,
    LoadOptions,
    Scored,
    ScoreRequest,
)
from adaptcheck.frameworks.modelsrc import ResolvedModel

BYTES_PER_PARAM = {"fp64": 8, "fp32": 4}
MEMORY_FRACTION = 0.5
"""Share of available host memory the reference model may take (activations, the device
framework and the OS need the rest)."""


_STORED_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "float8_e4m3fn": 1, "int8": 1}


def parameter_count(model: ResolvedModel) -> int:
    """Parameters, from the synthetic metadata or from the weights' size and stored dtype."""
    if model.synthetic and model.synthetic.get("num_params"):
        return int(model.synthetic["num_params"])
    return int(model.weights_bytes / _STORED_BYTES.get(str(model.torch_dtype), 2))


def reference_dtype(num_params: int, available_bytes: float | None) -> str | None:
    """float64 when it fits, float32 otherwise, None when neither fits."""
    if available_bytes is None:
        return "fp64"
    for dtype in ("fp64", "fp32"):
        if num_params * BYTES_PER_PARAM[dtype] <= MEMORY_FRACTION * available_bytes:
            return dtype
    return None


def _available_bytes() -> float | None:
    """Host memory available now: the CPU backend's own reading (the reference runs there)."""
    from adaptcheck.backends.cpu import CpuBackend

    return CpuBackend().memory_stats().get("free")


def _key(model: ResolvedModel, requests: list[GenRequest], dtype: str) -> str:
    blob = json.dumps({"weights": model.weights_sha256, "dtype": dtype,
                       "requests": [asdict(r) for r in requests]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class ReferenceUnavailable(FrameworkError):
    """No CPU reference can be computed here (model too large for host memory)."""


def _cached(path: Path) -> object | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None  # a torn or foreign file: recompute


def _store(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def _ref_dtype(model: ResolvedModel) -> str:
    params = parameter_count(model)
    dtype = reference_dtype(params, _available_bytes())
    if dtype is None:
        raise ReferenceUnavailable(
            f"the model has {params / 1e9:.1f} B parameters: a float32 CPU reference needs more than "
            f"{MEMORY_FRACTION:.0%} of this host's available memory")
    return dtype


@dataclass
class TeacherData:
    """The reference's greedy answers, the sequences they make, and its scores of them."""

    dtype: str
    """The reference's dtype ('fp64', or 'fp32' when float64 does not fit)."""
    attention: str | None
    """The attention implementation the reference ran."""
    generations: list[Generation]
    sequences: list[ScoreRequest]
    """prompt + continuation per request with a non-empty continuation (teacher forcing)."""
    scores: list[Scored]
    """The reference's own teacher-forced scores of ``sequences`` (top ``reference_top_k``)."""


def _sequences(gens: list[Generation], top_k: int) -> list[ScoreRequest]:
    return [ScoreRequest(token_ids=list(g.prompt_ids or []) + list(g.token_ids or []), start=len(g.prompt_ids or []),
                         top_k=top_k)
            for g in gens if g.token_ids and g.prompt_ids]


def cpu_transformers(model: ResolvedModel, dtype: str) -> Any:
    from adaptcheck.frameworks.transformers_fw import TransformersFramework

    fw = TransformersFramework()
    fw.load(LoadOptions(model_path=model.path, dtype=dtype), "cpu")
    return fw


def teacher_data(model: ResolvedModel, requests: list[GenRequest], cache_dir: Path, top_k: int) -> TeacherData:
    """Greedy float64 answers to ``requests`` (one at a time: no batching effects) and their
    teacher-forced scores; cached in ``cache_dir``."""
    dtype = _ref_dtype(model)
    path = cache_dir / f"teacher-{_key(model, requests, dtype)}-k{top_k}.json"
    data = _cached(path)
    if isinstance(data, dict):
        try:
            gens = [load_generation(g) for g in data["generations"]]
            return TeacherData(dtype=dtype, attention=data.get("attention"), generations=gens,
                               sequences=_sequences(gens, top_k), scores=[load_scored(x) for x in data["scores"]])
        except (KeyError, TypeError, ValueError):
            pass
    fw = cpu_transformers(model, dtype)
    try:
        gens = [fw.generate([req])[0] for req in requests]
        seqs = _sequences(gens, top_k)
        scores = [fw.score([s])[0] for s in seqs]
        attention = fw.attn_implementation()
    finally:
        fw.shutdown()
    _store(path, {"generations": [asdict(g) for g in gens], "scores": [asdict(x) for x in scores],
                  "attention": attention, "sequences": [asdict(x) for x in seqs], "dtype": dtype})
    return TeacherData(dtype=dtype, attention=attention, generations=gens, sequences=seqs, scores=scores)


@dataclass
class Control:
    """The teacher sequences scored on the CPU at the served dtype, alone and batched."""

    dtype: str
    attention: str | None
    alone: list[Scored]
    batched: list[Scored]


def control_scores(model: ResolvedModel, teacher: TeacherData, dtype: str, top_k: int, cache_dir: Path) -> Control:
    """The healthy control for ``dtype`` (cached in ``cache_dir`` by weights, sequences and K)."""
    blob = json.dumps({"weights": model.weights_sha256, "dtype": dtype, "k": top_k,
                       "seqs": [[s.token_ids, s.start] for s in teacher.sequences]})
    path = cache_dir / f"control-{hashlib.sha256(blob.encode()).hexdigest()[:20]}.json"
    data = _cached(path)
    if isinstance(data, dict):
        try:
            return Control(dtype=dtype, attention=data.get("attention"),
                           alone=[load_scored(x) for x in data["alone"]], batched=[load_scored(x) for x in data["batched"]])
        except (KeyError, TypeError, ValueError):
            pass
    seqs = [ScoreRequest(token_ids=s.token_ids, start=s.start, top_k=top_k) for s in teacher.sequences]
    fw = cpu_transformers(model, dtype)
    try:
        alone = [fw.score([s])[0] for s in seqs]
        batched = fw.score(seqs)
        attention = fw.attn_implementation()
    finally:
        fw.shutdown()
    _store(path, {"alone": [asdict(x) for x in alone], "batched": [asdict(x) for x in batched], "attention": attention})
    return Control(dtype=dtype, attention=attention, alone=alone, batched=batched)


def load_scored(d: dict[str, Any]) -> Scored:
    """A ``Scored`` from its JSON form (JSON turned the token ids into strings)."""
    return Scored(token_logprobs=[float(v) for v in d["token_logprobs"]],
                  top_logprobs=[{int(k): float(v) for k, v in row.items()} for row in d["top_logprobs"]],
                  extra=dict(d.get("extra") or {}))


def load_generation(d: dict[str, object]) -> Generation:
    """A generation from its JSON form (JSON turned the top-logprob token ids into strings)."""
    g = Generation(**d)  # type: ignore[arg-type]
    if g.top_logprobs is not None:
        g.top_logprobs = [{int(k): float(v) for k, v in row.items()} for row in g.top_logprobs]
    return g
