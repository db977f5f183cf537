"""benchmarks/family_moe_models.py without a run (a real one takes minutes per seed): its ladder
is one the loader accepts, and its figures line reads a results.json entry."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.benchmarks import load_script


def test_the_ladder_has_healthy_and_planted_reference_checks(tmp_path: Path) -> None:
    from adaptcheck.ladder.loader import load_ladder

    bench = load_script("family_moe_models")
    ladder, healthy, planted = bench.checks(vllm=True)
    assert healthy == ["ds.transformers", "ds.vllm", "q3.transformers", "q3.vllm"]
    assert len(planted) == 4 and all(c["kind"] == "framework.reference" for c in ladder)
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "id": "b", "version": "0", "checks": ladder},
                                   sort_keys=False) + bench.GRADE)
    assert len(load_ladder(str(path)).spec.checks) == 8


def test_figures_line() -> None:
    bench = load_script("family_moe_models")
    check = {"status": "fail", "duration_s": 12.5,
             "metrics": {"tf_kl_mean": 1.76, "tf_kl_p99": 11.2, "tf_same_top_rate": 0.646, "token_agreement": 0.18},
             "details": {"teacher_forced": {"bounds": {"kl_mean": {"bound": 0.0063}}}}}
    line = bench.figures(check)
    assert line.startswith("fail") and "kl_mean 1.7600 (bound 0.0063)" in line and "12.5 s" in line
    assert bench.figures(None) == "missing"
