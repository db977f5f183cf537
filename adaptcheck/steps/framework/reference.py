"""The CPU reference run: the same weights, transformers on the CPU, float64 where it fits.

float64 makes the reference's own rounding negligible next to any device dtype, so a
divergence is the device's. A model too big for float64 in this host's memory falls back
to float32 (stated in the evidence); one too big even for that is a ``skip`` with the
reason — never a silent pass.

Results are cached in the run folder keyed by weights, prompts and settings: every
framework of a run is compared against the same reference, computed once even though the
checks run in separate worker processes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from adaptcheck.frameworks.base import (
    FrameworkError,
    Generation,
    GenRequest,
    LoadOptions,
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


def reference_generations(model: ResolvedModel, requests: list[GenRequest], cache_dir: Path) -> tuple[list[Generation], str]:
    """Greedy CPU reference for ``requests`` (one at a time: no batching effects), and its dtype."""
    from adaptcheck.frameworks.transformers_fw import TransformersFramework

    params = parameter_count(model)
    dtype = reference_dtype(params, _available_bytes())
    if dtype is None:
        raise ReferenceUnavailable(
            f"the model has {params / 1e9:.1f} B parameters: a float32 CPU reference needs more than "
            f"{MEMORY_FRACTION:.0%} of this host's available memory")
    path = cache_dir / f"reference-{_key(model, requests, dtype)}.json"
    if path.exists():
        try:
            return [load_generation(g) for g in json.loads(path.read_text())], dtype
        except (ValueError, TypeError):
            pass  # a torn or foreign file: recompute
    fw = TransformersFramework()
    fw.load(LoadOptions(model_path=model.path, dtype=dtype), "cpu")
    try:
        gens = [fw.generate([req])[0] for req in requests]
    finally:
        fw.shutdown()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(g) for g in gens]))
    tmp.replace(path)
    return gens, dtype


def load_generation(d: dict[str, object]) -> Generation:
    """A generation from its JSON form (JSON turned the top-logprob token ids into strings)."""
    g = Generation(**d)  # type: ignore[arg-type]
    if g.top_logprobs is not None:
        g.top_logprobs = [{int(k): float(v) for k, v in row.items()} for row in g.top_logprobs]
    return g
