"""The CPU reference streamed a decoder layer at a time gives the in-memory numbers, within its
memory budget; a wrong streaming is caught by the same comparison; a budget too small for one
layer is a skip that says what to pass; where the device generates, the reference scores its
sequences and a healthy framework passes (docs/reference-at-scale.md).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.frameworks.base import GenRequest, Scored, ScoreRequest
from adaptcheck.frameworks.modelsrc import ResolvedModel, resolve_model
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.frameworks import reference_plan, streaming
from adaptcheck.steps.frameworks.kinds.reference import ReferenceCheck, ReferenceParams
from adaptcheck.steps.frameworks.lifecycle import release
from adaptcheck.steps.frameworks.reference import ReferenceUnavailable, cpu_transformers, reference_path, teacher_data
from adaptcheck.steps.frameworks.reference_plan import model_layout

TINY = "embedded:tiny-llama"
SMOLLM2 = "pretrained:smollm2-135m"
REL = 1e-9


@pytest.fixture(scope="module")
def tiny() -> ResolvedModel:
    return resolve_model(TINY, seed=0)


def _streamed_budget(model: ResolvedModel) -> int:
    """A budget under the float64 model's size that still holds a float64 layer and its load."""
    layout = model_layout(reference_path(model))
    budget = layout.total("fp64") - 1
    assert layout.resident("fp64") + layout.layer("fp64") + layout.transient("fp64") <= budget
    return budget


def _sequences(vocab: int, lengths: tuple[int, ...] = (24, 57, 90)) -> list[ScoreRequest]:
    return [ScoreRequest(token_ids=[(7919 * i + 31 * n) % (vocab - 10) + 5 for i in range(n)], start=3, top_k=20)
            for n in lengths]


def _scores(fw: Any, seqs: list[ScoreRequest]) -> list[Scored]:
    try:
        return [fw.score([s])[0] for s in seqs]  # alone, one forward each, as the reference scores
    finally:
        fw.shutdown()


def max_rel(a: list[Scored], b: list[Scored]) -> float:
    """Largest relative difference of the scored tokens' logprobs and the top-K rows (the same
    top-K tokens required: another token set is an infinite difference)."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        pairs = list(zip(x.token_logprobs, y.token_logprobs, strict=True))
        for rx, ry in zip(x.top_logprobs, y.top_logprobs, strict=True):
            if set(rx) != set(ry):
                return math.inf
            pairs.extend((rx[k], ry[k]) for k in rx)
        worst = max([worst, *(abs(p - q) / max(abs(p), 1e-300) for p, q in pairs)])
    return worst


def test_a_budget_under_the_model_streams_float64_and_matches_in_memory(tiny: ResolvedModel) -> None:
    budget = _streamed_budget(tiny)
    plan = reference_plan.reference_plan(tiny, budget)
    assert (plan.mode, plan.dtype) == ("streamed", "fp64") and plan.held_layers is not None
    assert plan.held_layers < (plan.layers or 0) and plan.need <= budget
    streamed = cpu_transformers(tiny, "fp64", budget)
    assert streamed.streamer is not None
    seqs = _sequences(int(streamed.model.config.vocab_size))
    prompt = GenRequest(prompt="The quick brown fox", max_tokens=12, logprobs=5)
    generated = streamed.generate([prompt])[0]
    stats = streamed.streamer.stats
    got = _scores(streamed, seqs)
    in_memory = cpu_transformers(tiny, "fp64", None)
    assert getattr(in_memory, "streamer", None) is None
    want_gen = in_memory.generate([prompt])[0]
    want = _scores(in_memory, seqs)
    assert max_rel(want, got) <= REL
    assert generated.token_ids == want_gen.token_ids and generated.top_logprobs == want_gen.top_logprobs
    # Really streamed (every layer loaded more than once), and never held more than the budget.
    assert stats.loads > stats.layers and 0 < stats.peak_bytes <= budget


def test_the_teacher_streamed_is_the_teacher_in_memory(tiny: ResolvedModel, tmp_path: Path) -> None:
    reqs = [GenRequest(prompt=p, max_tokens=10, logprobs=5) for p in ("Once upon a time", "The capital of", "1 2 3")]
    budget = _streamed_budget(tiny)
    streamed = teacher_data(tiny, reqs, tmp_path / "streamed", 20, budget)
    in_memory = teacher_data(tiny, reqs, tmp_path / "memory", 20, None)
    assert [g.token_ids for g in streamed.generations] == [g.token_ids for g in in_memory.generations]
    assert max_rel(in_memory.scores, streamed.scores) <= REL
    run = streamed.run
    assert run is not None and (run.mode, run.dtype, run.budget_bytes) == ("streamed", "fp64", budget)
    assert run.peak_bytes is not None and run.peak_bytes <= budget and (run.bytes_read or 0) > 0
    assert in_memory.run is not None and in_memory.run.mode == "in_memory"
    # The cache is shared: the numbers do not depend on how the reference ran.
    again = teacher_data(tiny, reqs, tmp_path / "streamed", 20, None)
    assert again.run is not None and again.run.cached and again.run.mode == "streamed"


def _wrong_layer(monkeypatch: pytest.MonkeyPatch, how: str, layers: int) -> None:
    """Plant a streaming defect: every layer's tensors read from the next layer's (``shifted``),
    or the first layer's weights in every layer (``stale``, a slot never refilled)."""
    original = streaming.CheckpointIndex.slice

    def wrong(self: streaming.CheckpointIndex, key: str) -> Any:
        def other(m: re.Match[str]) -> str:
            return f"layers.{(int(m[1]) + 1) % layers if how == 'shifted' else 0}."
        return original(self, re.sub(r"layers\.(\d+)\.", other, key))

    monkeypatch.setattr(streaming.CheckpointIndex, "slice", wrong)


@pytest.mark.parametrize("how", ["shifted", "stale"])
def test_a_wrong_streaming_is_caught_by_the_same_comparison(tiny: ResolvedModel, monkeypatch: pytest.MonkeyPatch,
                                                            how: str) -> None:
    budget = _streamed_budget(tiny)
    in_memory = cpu_transformers(tiny, "fp64", None)
    seqs = _sequences(int(in_memory.model.config.vocab_size))
    want = _scores(in_memory, seqs)
    _wrong_layer(monkeypatch, how, tiny.num_layers or 2)
    got = _scores(cpu_transformers(tiny, "fp64", budget), seqs)
    assert max_rel(want, got) > 1e-3


def test_a_budget_too_small_for_one_layer_says_what_it_needs(tiny: ResolvedModel, tmp_path: Path) -> None:
    layout = model_layout(reference_path(tiny))
    need = layout.resident("fp32") + layout.layer("fp32") + layout.transient("fp32")
    with pytest.raises(ReferenceUnavailable) as exc:
        teacher_data(tiny, [GenRequest(prompt="x", max_tokens=2)], tmp_path, 20, need - 1)
    text = str(exc.value)
    assert f"--reference-memory {math.ceil(need / 2**20)}M" in text and reference_plan.gib(need) in text
    assert "\n" not in text
    # A float64 layer that does not fit, a float32 one that does: streamed in float32.
    plan = reference_plan.reference_plan(tiny, need)
    assert (plan.mode, plan.dtype) == ("streamed", "fp32") and plan.need <= need


def test_a_model_that_cannot_stream_keeps_todays_rule(tiny: ResolvedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(_folder: Path) -> Any:
        raise streaming.StreamUnsupported("no decoder layers found")

    monkeypatch.setattr(reference_plan, "model_layout", unsupported)
    params = reference_plan.parameter_count(tiny)
    plan = reference_plan.reference_plan(tiny, params * 4)  # float32 fits in memory, float64 does not
    assert (plan.mode, plan.dtype) == ("in_memory", "fp32") and "no decoder layers" in plan.note
    with pytest.raises(ReferenceUnavailable, match=r"cannot stream \(no decoder layers found\).*--reference-memory"):
        reference_plan.reference_plan(tiny, params * 4 - 1)


def test_no_safetensors_cannot_stream(tmp_path: Path) -> None:
    with pytest.raises(streaming.StreamUnsupported, match=r"no \*\.safetensors"):
        streaming.CheckpointIndex(tmp_path)


def test_the_generation_estimate_picks_who_generates() -> None:
    reqs = [GenRequest(prompt="x", max_tokens=16)] * 9
    small = reference_plan.Plan("in_memory", "fp64", None, 10**9, weights=10**9)  # ~SmolLM2-135M
    assert reference_plan.generation_estimate(small, reqs).mode == "reference generates"
    seven_b = reference_plan.Plan("streamed", "fp64", 64 << 30, 60 << 30, layers=32, held_layers=30,
                                  weights=56 * 10**9, layer_bytes=1_750_000_000)
    est = reference_plan.generation_estimate(seven_b, reqs)
    assert est.mode == "device generates, reference scores" and est.streamed_per_token == 3 * 1_750_000_000
    assert "144 tokens" in est.describe()


@contextlib.contextmanager
def _ctx(tmp_path: Path, model: str, reference_memory: int | None) -> Iterator[CheckContext]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path,
                       model=ModelSpec(name=model, precision="bf16"), reference_memory=reference_memory,
                       check_id="fw.reference")
    try:
        yield ctx
    finally:
        release(ctx)


def _reference(tmp_path: Path, model: str, memory: int | None, framework: str = "transformers",
               **size: Any) -> Any:
    with _ctx(tmp_path, model, memory) as ctx:
        return ReferenceCheck().run(ctx, ReferenceParams(framework=framework, **size))


def test_device_generates_and_the_streamed_reference_scores(tiny: ResolvedModel, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_plan, "GENERATE_BUDGET_S", 0.0)
    outcome = _reference(tmp_path, TINY, _streamed_budget(tiny), prompts=3, long_prompt_tokens=64, max_tokens=12)
    assert outcome.status == "pass", outcome.message
    run = outcome.details["teacher_forced"]["reference_run"]
    assert run["generation"] == "device generates, reference scores" and run["mode"] == "streamed"
    assert "device generates, reference scores" in outcome.details["reference"]
    rows = {r["name"]: r["ok"] for r in outcome.details["subchecks"]}
    assert rows["device answers end at EOS or max_tokens"] is True
    assert rows["teacher-forced distributions vs float64 reference"] is True
    assert rows["greedy tokens vs CPU reference"] is True
    assert list((tmp_path / "framework").glob("teacher-scored-*-k*.json"))  # where `adaptcheck repro` looks


def test_device_generates_still_catches_a_planted_defect(tiny: ResolvedModel, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_plan, "GENERATE_BUDGET_S", 0.0)
    outcome = _reference(tmp_path, TINY, _streamed_budget(tiny), "tests.steps.frameworks.planted:BadSiluBf16",
                         prompts=3, long_prompt_tokens=64, max_tokens=12)
    assert outcome.status == "fail", outcome.message
    run = outcome.details["teacher_forced"]["reference_run"]
    assert run["generation"] == "device generates, reference scores" and run["mode"] == "streamed"
    assert "teacher-forced distributions" in outcome.message


@pytest.mark.slow  # ~30 s: the 30-layer model, in memory and streamed
def test_smollm2_streamed_under_400mb_is_the_in_memory_reference() -> None:
    model = resolve_model(SMOLLM2)
    budget = 400 * 10**6
    plan = reference_plan.reference_plan(model, budget)
    assert (plan.mode, plan.dtype) == ("streamed", "fp64")
    streamed = cpu_transformers(model, "fp64", budget)
    seqs = _sequences(int(streamed.model.config.vocab_size), (40, 130))
    stats = streamed.streamer.stats
    got = _scores(streamed, seqs)
    want = _scores(cpu_transformers(model, "fp64", None), seqs)
    assert max_rel(want, got) <= REL
    assert stats.peak_bytes <= budget and stats.loads > stats.layers


@pytest.mark.slow  # 1-3 min each on 2 cores (bf16 generation on the CPU is most of it)
@pytest.mark.parametrize("generates", ["reference", "device"])
def test_smollm2_framework_reference_passes_with_a_streamed_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      generates: str) -> None:
    if generates == "device":
        monkeypatch.setattr(reference_plan, "GENERATE_BUDGET_S", 0.0)
    outcome = _reference(tmp_path, SMOLLM2, 400 * 10**6, prompts=2, long_prompt_tokens=96, max_tokens=10)
    assert outcome.status == "pass", outcome.message
    run = outcome.details["teacher_forced"]["reference_run"]
    assert run["mode"] == "streamed" and run["dtype"] == "fp64" and run["peak_bytes"] <= 400 * 10**6
    assert run["generation"] == ("reference generates" if generates == "reference"
                                 else "device generates, reference scores")


# --- every check scored against the reference takes the same path (not only framework.reference) ---

def _near_limit_verdict(tmp_path: Path, framework: str) -> tuple[Any, Any]:
    """What framework.long_context's "near-limit prompt vs float64 reference" row and the
    concurrent / KV-cache checks' control summary get from the reference: (teacher, row)."""
    from adaptcheck.steps.frameworks import teacher as tf_rules
    from adaptcheck.steps.frameworks.bounds import load_numerics
    from adaptcheck.steps.frameworks.lifecycle import acquire
    from adaptcheck.steps.frameworks.params import TeacherSize
    from adaptcheck.steps.frameworks.probes import local_tokenizer, teacher_and_control

    with _ctx(tmp_path, TINY, None) as ctx:
        active = acquire(ctx, framework, "fw.long")
        found = teacher_and_control(ctx, active, local_tokenizer(active),
                                    TeacherSize(prompts=2, long_prompt_tokens=48, chat=False, max_tokens=10))
        assert found is not None
        teacher, control = found
        assert control["positions"] > 0 and math.isfinite(control["kl_mean"])  # the control scored them too
        row, _record, _metrics = tf_rules.reference_verdict(ctx, active, teacher, load_numerics(), 20)
        return teacher, row


def test_the_other_checks_score_the_devices_answers_where_the_device_generates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_plan, "GENERATE_BUDGET_S", 0.0)
    teacher, row = _near_limit_verdict(tmp_path, "transformers")
    assert teacher.run.generation == "device generates, reference scores", teacher.run
    assert list((tmp_path / "framework").glob("teacher-scored-*-k*.json"))
    assert not list((tmp_path / "framework").glob("teacher-[0-9a-f]*-k*.json"))  # no CPU greedy decoding ran
    assert row.ok is True, row.detail


def test_the_other_checks_still_catch_a_planted_defect_where_the_device_generates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_plan, "GENERATE_BUDGET_S", 0.0)
    teacher, row = _near_limit_verdict(tmp_path, "tests.steps.frameworks.planted:BadSiluBf16")
    assert teacher.run.generation == "device generates, reference scores"
    assert row.ok is False, row.detail
