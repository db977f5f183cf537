"""``framework.spec_decode``: the prover and params without vLLM (fast), and one small ladder through
the real CLI (slow): healthy n-gram and draft-model speculation pass, a verifier that accepts every
draft and a drafter that never drafts fail, each on the row that names why."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from adaptcheck.frameworks.synthetic import model_dir
from adaptcheck.steps.frameworks.kinds.spec_decode import (
    ACCEPTED,
    DRAFTS,
    SpecDecodeParams,
    _prove,
    default_draft,
)
from tests.conftest import ladder_text, run_cli

PLANTED = "tests.steps.frameworks.planted_spec:"


def active(facts: dict[str, Any]) -> Any:
    """What the prover reads of a feature instance: its framework's engine facts."""
    return SimpleNamespace(framework=SimpleNamespace(engine_facts=lambda: facts))


# ---- the prover (no vLLM) ---------------------------------------------------------------


def test_prove_passes_with_drafts_and_acceptances_and_records_the_rate() -> None:
    proof = _prove(active({"speculative_method": "ngram"}), {DRAFTS: 100.0, ACCEPTED: 70.0, "other": 1.0}, "ngram")
    assert [r.ok for r in proof.rows] == [True]
    assert proof.rows[0].name == "feature active: speculative decoding"
    assert proof.metrics["acceptance_rate"] == pytest.approx(0.7)
    assert proof.metrics["rejected_tokens"] == 30.0
    assert proof.record.active is True and proof.record.feature == "spec_decode"
    assert proof.record.counters == {DRAFTS: 100.0, ACCEPTED: 70.0}  # only the drafter's counters
    assert "100 tokens drafted, 70 accepted (acceptance 70%)" in (proof.record.how or "")


def test_prove_fails_when_nothing_was_drafted() -> None:
    proof = _prove(active({"speculative_method": "ngram"}), {}, "ngram")
    assert proof.rows[0].ok is False and proof.record.active is False
    assert "nothing was drafted" in proof.rows[0].detail
    assert proof.metrics["acceptance_rate"] is None


def test_prove_fails_when_no_draft_was_accepted() -> None:
    proof = _prove(active({"speculative_method": "draft_model"}), {DRAFTS: 12.0}, "draft_model")
    assert proof.rows[0].ok is False and "no draft token was ever accepted" in proof.rows[0].detail


def test_prove_fails_when_the_engine_runs_another_method() -> None:
    proof = _prove(active({"speculative_method": "ngram"}), {DRAFTS: 9.0, ACCEPTED: 9.0}, "draft_model")
    assert proof.rows[0].ok is False and "not the 'draft_model' asked for" in proof.rows[0].detail


def test_prove_reads_served_counters_by_their_total_names() -> None:
    # /metrics names counters with _total, and a served engine reads no settings back.
    proof = _prove(active({}), {DRAFTS + "_total": 8.0, ACCEPTED + "_total": 5.0}, "ngram")
    assert proof.rows[0].ok is True and proof.metrics["drafted_tokens"] == 8.0
    assert proof.metrics["accepted_tokens"] == 5.0


# ---- params, the speculative_config, the default draft -------------------------------------


def test_speculative_config_per_method() -> None:
    ngram = SpecDecodeParams(framework="vllm", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=5)
    assert ngram.speculative_config() == {"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    draft = SpecDecodeParams(framework="vllm", method="draft_model")
    assert draft.speculative_config("/m/draft") == {"method": "draft_model", "model": "/m/draft",
                                                    "num_speculative_tokens": 5}


def test_inconsistent_params_are_ladder_errors() -> None:
    with pytest.raises(ValidationError, match=r"prompt_lookup_max \(2\) is below prompt_lookup_min \(4\)"):
        SpecDecodeParams(framework="vllm", prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValidationError, match="draft_model is only read with method: draft_model"):
        SpecDecodeParams(framework="vllm", draft_model="embedded:tiny-llama-draft")
    with pytest.raises(ValidationError, match="method"):
        SpecDecodeParams(framework="vllm", method="eagle")  # type: ignore[arg-type]


def test_default_draft_is_the_embedded_family_draft() -> None:
    assert default_draft("embedded:tiny-llama") == "embedded:tiny-llama-draft"
    assert default_draft("embedded:tiny-moe") is None  # no draft of that one
    assert default_draft("/models/some-llama") is None


def test_adding_the_draft_left_the_other_embedded_models_where_they_were(tmp_path: Path) -> None:
    # The folder name carries the spec hash: these are the names before the draft was added.
    assert model_dir("tiny-llama", root=tmp_path).name == "tiny-llama-seed0-g3-72115b90b3b5"
    assert model_dir("tiny-qwen2-d80", root=tmp_path).name == "tiny-qwen2-d80-seed0-g3-f6b883e10303"
    assert model_dir("tiny-moe", root=tmp_path).name == "tiny-moe-seed0-g3-2b2a87334e85"


# ---- one small ladder through the real CLI (slow) --------------------------------------------


def spec_check(id_: str, framework: str, **params: Any) -> dict[str, Any]:
    # Eager on both instances: the compile path is framework.compile's business, and it costs minutes here.
    return {"id": id_, "step": 4, "kind": "framework.spec_decode",
            "params": {"framework": framework, "compile": False, **params}}


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("spec_decode")
    checks = [
        spec_check("ngram", "vllm"),
        spec_check("draft", "vllm", method="draft_model"),
        spec_check("accept_all.ngram", PLANTED + "AcceptAllDrafts"),
        spec_check("never_drafts", PLANTED + "NeverDrafts"),
    ]
    ladder = root / "ladder.yaml"
    ladder.write_text(ladder_text(checks, timeout_s=600))
    out = root / "run"
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--model", "embedded:tiny-llama",
                    "--out", str(out), "--quiet"], timeout=1800)
    assert (out / "results.json").exists(), proc.stderr[-3000:]
    return {c["id"]: c for c in json.loads((out / "results.json").read_text())["checks"]}


def rows(check: dict[str, Any]) -> dict[str, bool | None]:
    return {r["name"].split(":")[0]: r["ok"] for r in check["details"]["subchecks"]}


@pytest.mark.slow
@pytest.mark.parametrize("id_, method", [("ngram", "ngram"), ("draft", "draft_model")])
def test_healthy_speculation_passes_with_its_proof(ladder_run: dict[str, dict[str, Any]], id_: str,
                                                   method: str) -> None:
    check = ladder_run[id_]
    assert check["status"] == "pass", check["message"]
    m = check["metrics"]
    assert m["drafted_tokens"] > 0 and m["accepted_tokens"] > 0
    # The verifier was exercised both ways: some drafts rejected (else accept-all could not show).
    assert m["rejected_tokens"] > 0
    feature = check["details"]["feature"]
    assert feature["active"] is True and feature["engine"]["speculative_method"] == method
    assert m["tie_margin"] == 0.5  # bf16: the near-tie rule, not the looser top-N


@pytest.mark.slow
# The draft-model variant of this defect (accept_all.draft) fails the same way over seeds 0-4 in
# benchmarks/feature_spec_decode.py; CI keeps the n-gram one (one engine start fewer).
@pytest.mark.parametrize("id_", ["accept_all.ngram"])
def test_a_verifier_that_accepts_every_draft_fails_on_the_greedy_tokens(
        ladder_run: dict[str, dict[str, Any]], id_: str) -> None:
    check = ladder_run[id_]
    assert check["status"] == "fail", check["message"]
    assert rows(check)["greedy tokens"] is False
    # The drafter still ran: what fails is the answers, and every draft was "accepted".
    assert rows(check)["feature active"] is True
    assert check["metrics"]["rejected_tokens"] == 0


@pytest.mark.slow
def test_a_drafter_that_never_drafts_fails_the_feature_active_row(ladder_run: dict[str, dict[str, Any]]) -> None:
    check = ladder_run["never_drafts"]
    assert check["status"] == "fail", check["message"]
    assert rows(check)["feature active"] is False
    assert rows(check)["greedy tokens"] is True  # the answers alone could not tell
    assert "nothing was drafted" in check["message"]


def test_the_benchmark_ladder_is_valid(tmp_path: Path) -> None:
    """benchmarks/feature_spec_decode.py's ladder loads (its runs are minutes; this is its smoke test)."""
    import importlib.util

    import yaml

    from adaptcheck.ladder.loader import load_ladder

    spec = importlib.util.spec_from_file_location("feature_spec_decode", Path(__file__).parents[4] / "benchmarks"
                                                  / "feature_spec_decode.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "l.yaml"
    path.write_text(yaml.safe_dump(bench.ladder(served=True), sort_keys=False) + bench.GRADE)
    ids = [c.id for c in load_ladder(str(path)).spec.checks]
    assert ids == ["load", *bench.HEALTHY, *bench.PLANTED_IDS, "served.ngram"]
