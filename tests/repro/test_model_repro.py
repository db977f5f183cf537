"""Step-4 reproducers: the embedded tiny-llama, transformers bf16 on the CPU vs float64.

The script runs isolated (``python -I``, adaptcheck blocked). Its KL figure is compared with
the one step 4's own code computes (``TransformersFramework.score`` + ``divergence``) for the
same sequences, and its exit code follows the bound.
"""

from __future__ import annotations

import random
import re
import runpy
from pathlib import Path

import pytest

from adaptcheck.frameworks.base import LoadOptions, ScoreRequest
from adaptcheck.frameworks.synthetic import ensure_model
from adaptcheck.repro.model import (
    ModelReproSpec,
    render_model_script,
    write_model_repro,
)
from adaptcheck.steps.frameworks import divergence as dv
from tests.repro.standalone import run_standalone

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SEQUENCES = [{"token_ids": [1, 50, 61, 72, 83, 94, 105, 116, 127, 138, 149, 160], "start": 4},
             {"token_ids": [1, 7, 300, 12, 500, 18, 700, 24], "start": 3}]
KL = re.compile(r"KL\(ref\|\|device\) mean=(?P<mean>\S+) p99=(?P<p99>\S+) max=(?P<max>\S+) over (?P<n>\d+) positions")


@pytest.fixture(scope="module")
def model() -> Path:
    return ensure_model("tiny-llama")  # the session cache (tests/conftest.py): shared with other step-4 tests


def _spec(model: Path, bound: float) -> ModelReproSpec:
    return ModelReproSpec(framework="transformers", model_path=str(model), dtype="bf16", device="cpu",
                          attn_implementation="sdpa", sequences=SEQUENCES, top_k=20, bound_kl_mean=bound,
                          bound_kl_p99=bound * 10, observed_kl_mean=0.0, observed_kl_p99=0.0, reference_top_k=64)


def _step4_figures(model: Path) -> dict[str, float]:
    """What step 4's own code computes for these sequences (each scored alone, as it does)."""
    from adaptcheck.frameworks.transformers_fw import TransformersFramework

    sides = []
    for dtype, k in (("fp64", 64), ("bf16", 20)):
        fw = TransformersFramework()
        fw.load(LoadOptions(model_path=model, dtype=dtype), "cpu")
        try:
            sides.append([fw.score([ScoreRequest(s["token_ids"], s["start"], k)])[0] for s in SEQUENCES])
        finally:
            fw.shutdown()
    stats = dv.PositionStats([], [], [])
    for r, d in zip(*sides, strict=False):
        stats.extend(dv.compare_positions(r.top_logprobs, r.token_logprobs, d.top_logprobs, d.token_logprobs))
    return dv.summarize(stats)


def test_script_passes_sane_bounds_with_step4s_figure(tmp_path: Path, model: Path) -> None:
    script = write_model_repro(tmp_path, "framework.transformers.reference", _spec(model, bound=0.05))
    assert script == tmp_path / "repro" / "framework.transformers.reference.py"
    done = run_standalone(script)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    m = KL.search(done.stdout)
    assert m, done.stdout
    want = _step4_figures(model)
    assert int(m["n"]) == want["positions"] == sum(len(s["token_ids"]) - s["start"] for s in SEQUENCES)
    assert float(m["mean"]) == pytest.approx(want["kl_mean"], rel=1e-6)
    assert float(m["p99"]) == pytest.approx(want["kl_p99"], rel=1e-6)
    assert float(m["max"]) == pytest.approx(want["kl_max"], rel=1e-6)
    assert want["kl_mean"] > 0, "bf16 differs from float64: a zero figure would prove nothing"
    assert "PASS" in done.stdout


def test_script_fails_a_tiny_bound(tmp_path: Path, model: Path) -> None:
    script = write_model_repro(tmp_path, "framework.transformers.reference", _spec(model, bound=1e-12))
    done = run_standalone(script)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "FAIL: kl_mean, kl_p99 over the bound" in done.stdout


def test_scripts_estimator_is_step4s(tmp_path: Path) -> None:
    """The script's bucketed KL is divergence.position_kl on every kind of overlap."""
    path = tmp_path / "s.py"
    path.write_text(render_model_script("x", _spec(Path("/nowhere"), 0.1)))
    position_kl = runpy.run_path(str(path), run_name="not_main")["position_kl"]
    rng = random.Random(3)
    for _ in range(200):
        vocab = list(range(40))
        ref_ids = rng.sample(vocab, 12)
        dev_ids = rng.sample(ref_ids, 5) + rng.sample(vocab, 4)  # partly shared, partly not
        ref = {t: -rng.uniform(0.1, 8) for t in ref_ids}
        dev = {t: -rng.uniform(0.1, 8) for t in dev_ids}
        assert position_kl(ref, dev) == dv.position_kl(ref, dev)


@pytest.mark.parametrize(("field", "value", "message"), [("start", 0, "start must be"), ("top_k", 0, "top_k"),
                                                         ("dtype", "fp8", "dtype")])
def test_spec_that_no_script_could_run_is_refused(tmp_path: Path, field: str, value: object, message: str) -> None:
    spec = _spec(Path("/nowhere"), 0.1)
    if field == "start":
        spec.sequences = [{"token_ids": [1, 2, 3], "start": value}]
    else:
        setattr(spec, field, value)
    with pytest.raises(ValueError, match=message):
        write_model_repro(tmp_path, "x", spec)
    assert not (tmp_path / "repro" / "x.py").exists()
