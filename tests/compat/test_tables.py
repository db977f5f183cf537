"""The ``version_table`` and ``arch_supported`` rule types, and vendor version strings."""

from __future__ import annotations

from typing import Any

import pytest

from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.yamldata import MatrixError, parse_model
from adaptcheck.compat.archs import ArchSupportedRule, covers
from adaptcheck.compat.rules import RuleInputs, RulesFile, evaluate
from adaptcheck.compat.stackkeys import comparable, fits, target_text
from adaptcheck.compat.tables import VersionTableRule
from tests.steps.matrix.factories import make_env, requires_from

TABLE: dict[str, Any] = {
    "id": "t", "type": "version_table", "description": "d", "source": "s", "backends": ["ascend"],
    "subject": "package.vllm-ascend", "object": "runtime.cann",
    "rows": [{"subject": "==0.9.1", "object": "==8.2.RC1"}, {"subject": "==0.7.3", "object": "==8.1.RC1"},
             {"subject": "==0.7.3.post1", "object": "==8.1.RC1"}],
}


def run_table(cann: str | None, plugin: str | None, backend: str = "ascend", **rule: Any) -> Any:
    env = make_env(backend=backend, runtimes={"cann": cann}, packages={"vllm-ascend": plugin})
    return evaluate(VersionTableRule.model_validate({**TABLE, **rule}), RuleInputs(env, requires=requires_from({})))


@pytest.mark.parametrize(("cann", "plugin", "verdict"), [
    ("8.2.RC1", "0.9.1", "ok"),
    ("8.1.RC1", "0.9.1", "incompatible"),        # the planted mismatch
    ("8.2.rc1", "0.9.1", "ok"),                  # RC and rc are the same PEP 440 pre-release
    (None, "0.9.1", "warn"),                     # the version file could not be read: never a pass
    ("8.2.RC1", None, "not_applicable"),         # no vllm-ascend
    ("8.2.RC1", "0.12.0", "warn"),               # newer than the table: pairing unknown
])
def test_version_table_verdicts(cann: str | None, plugin: str | None, verdict: str) -> None:
    assert run_table(cann, plugin).verdict == verdict


def test_version_table_advice_names_both_ways_out() -> None:
    v = run_table("8.1.RC1", "0.9.1")
    assert v.message == "vllm-ascend 0.9.1 needs cann ==8.2.RC1, but 8.1.RC1 is installed"
    assert v.advice == ["cann 8.1.RC1 → 8.2.RC1", "or vllm-ascend 0.9.1 → 0.7.3", "or vllm-ascend 0.9.1 → 0.7.3.post1"]
    assert run_table("8.2.RC1", "0.9.1").advice == []


def test_version_table_options_and_backend_scope() -> None:
    assert run_table("8.1.RC1", "0.9.1", on_mismatch="warn").verdict == "warn"
    assert run_table("8.2.RC1", "0.12.0", on_unknown="not_applicable").verdict == "not_applicable"
    assert run_table(None, "0.9.1", on_missing_object="incompatible").verdict == "incompatible"
    other = run_table("8.1.RC1", "0.9.1", backend="cuda")
    assert other.verdict == "not_applicable" and "a rule for ascend" in other.message


def test_rule_files_refuse_unknown_keys_backends_and_self_pairs() -> None:
    def error(**change: Any) -> str:
        import yaml

        text = yaml.safe_dump({"schema_version": 1, "rules": [{**TABLE, **change}]}, sort_keys=False)
        with pytest.raises(MatrixError) as info:
            parse_model(text, "r.yaml", RulesFile, MatrixError)
        return str(info.value)

    assert "unknown backend 'ascnd'" in error(backends=["ascnd"]) and "did you mean 'ascend'" in error(backends=["ascnd"])
    assert "unknown constraint key 'cann'" in error(object="cann")
    assert "both 'runtime.cann'" in error(subject="runtime.cann")
    assert "not a PEP 440 version specifier" in error(rows=[{"subject": "0.9.1", "object": "==8.2.RC1"}])
    assert issubclass(MatrixError, InvalidInputError)


@pytest.mark.parametrize(("value", "expected"), [
    ("v6.2.29", "v6.2.29"), ("3.3.5-server", "3.3.5"), ("6.3.27-V1.2.5", "6.3.27"), ("8.0.RC3", "8.0.RC3"),
    ("2.5.1+cu124", "2.5.1+cu124"), ("6.0.2-115", "6.0.2-115"), ("unknown", "unknown"),
])
def test_vendor_strings_compare_as_their_release(value: str, expected: str) -> None:
    assert comparable(value) == expected


def test_fits_and_targets() -> None:
    assert fits(">=6.2.0", "v6.2.29") and not fits(">=6.3", "v6.2.29")
    assert fits("==2.5.1", "2.5.1+cu124") and not fits("==2.5.1+cxx11.abi", "2.5.1+cu124")
    assert fits("re:8\\.1\\.RC1", "8.1.RC1") and not fits("re:8\\.1", "8.1.RC1")   # a regex matches the whole value
    assert [target_text(c) for c in ("==2.7.1", ">=525.60.13", "==2.7.*", ">=1,<2", "re:26\\.04.*")] == \
        ["2.7.1", ">=525.60.13", "2.7.*", ">=1,<2", "/26\\.04.*/"]


# --------------------------------------------------------------------------- arch_supported
@pytest.mark.parametrize(("archs", "device", "model", "how"), [
    (["sm_80", "sm_90"], "sm_90", "cuda", "native"),
    (["sm_80", "sm_90"], "sm_86", "cuda", "native"),       # same major, lower minor cubin runs
    (["sm_80", "sm_90"], "sm_75", "cuda", "no"),           # never down a major
    (["sm_86"], "sm_80", "cuda", "no"),                    # a higher minor cubin does not run
    (["sm_90a"], "sm_90", "cuda", "native"),               # the exact arch-specific target
    (["sm_90a"], "sm_91", "cuda", "no"),                   # ... and nothing else
    (["sm_90", "compute_90"], "sm_120", "cuda", "ptx"),    # JIT from PTX
    (["compute_120"], "sm_100", "cuda", "no"),             # PTX never runs on a lower capability
    (["gfx90a", "gfx942"], "gfx942:sramecc+:xnack-", "exact", "native"),
    (["gfx90a", "gfx942"], "gfx950", "exact", "no"),
])
def test_arch_coverage(archs: list[str], device: str, model: str, how: str) -> None:
    assert covers(archs, device, model) == how


def test_arch_rule_without_device_or_list() -> None:
    rule = ArchSupportedRule(id="a", type="arch_supported", description="d", source="s", compatibility="cuda")
    inp = RuleInputs(make_env(backend="cuda", device_arch=None), requires=requires_from({}))
    assert evaluate(rule, inp).verdict == "not_applicable"
    inp = RuleInputs(make_env(backend="cuda", device_arch="sm_90", torch="2.99.0+cu999"), requires=requires_from({}))
    v = evaluate(rule, inp)
    assert v.verdict == "warn" and "support is unknown" in v.message        # never a pass without evidence
