"""framework.tensor_parallel: when it applies and how it is proven (fast), and one real run of
TP 2 on two CPU cores (slow): healthy passes with world size 2, a dropped rank partial sum fails
(tests/steps/frameworks/planted_ctp.py; docs/features.md, "Tensor parallel on one host")."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import JsonValue

from adaptcheck.frameworks.registry import framework_class
from adaptcheck.steps.frameworks.kinds.tensor_parallel import _prove, tp_plan
from adaptcheck.steps.frameworks.lifecycle import Active
from tests.conftest import run_checks
from tests.steps.frameworks.planted_ctp import tensor_parallel_checks

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def test_cpu_host_runs_two_ranks_one_core_each() -> None:
    vllm = framework_class("vllm")
    assert tp_plan(vllm, "cpu", 1, [4, 7, 9]) == {"tensor_parallel_size": 2,
                                                   "env": {"VLLM_CPU_OMP_THREADS_BIND": "4|7"}}
    assert tp_plan(framework_class("vllm_serve"), "cpu", 1, [0, 1])["env"]  # type: ignore[index]
    assert "needs 2 cores" in str(tp_plan(vllm, "cpu", 1, [0]))
    # An adapter without host ranks needs devices, as before.
    assert tp_plan(framework_class("transformers"), "cpu", 1, [0, 1]) == "tensor parallel needs more than one device"


def test_accelerators_keep_every_device() -> None:
    assert tp_plan(framework_class("vllm"), "cuda", 4, [0, 1]) == {"tensor_parallel_size": 4}
    assert tp_plan(framework_class("vllm"), "cuda", 1, [0, 1]) == "tensor parallel needs more than one device"


def test_heads_that_do_not_divide_among_the_ranks_are_refused_before_a_start(tmp_path: Path) -> None:
    vllm = framework_class("vllm")
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 9}))  # SmolLM2-135M
    assert "9 attention heads do not divide among 2" in str(vllm.tensor_parallel_unfit(tmp_path, 2))
    assert vllm.tensor_parallel_unfit(tmp_path, 3) is None
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_attention_heads": 4}}))
    assert vllm.tensor_parallel_unfit(tmp_path, 2) is None  # a multimodal model's text tower
    (tmp_path / "config.json").write_text("{}")
    assert vllm.tensor_parallel_unfit(tmp_path, 2) is None  # no field: the framework judges


def test_host_ranks_get_one_core_each_unless_the_caller_bound_them(tmp_path: Path) -> None:
    from adaptcheck.frameworks.base import LoadOptions, allowed_cores

    vllm = framework_class("vllm")
    opts = LoadOptions(model_path=tmp_path, dtype="bf16", max_model_len=64, tensor_parallel_size=2)
    cores = allowed_cores()
    if len(cores) >= 2:
        assert vllm.host_rank_env(opts, "cpu") == {"VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}|{cores[1]}"}
    opts.env = {"VLLM_CPU_OMP_THREADS_BIND": "3|5"}
    assert vllm.host_rank_env(opts, "cpu") == {"VLLM_CPU_OMP_THREADS_BIND": "3|5"}
    opts.env = {}
    assert vllm.host_rank_env(opts, "cuda:0") == {}  # devices, not cores
    opts.tensor_parallel_size = 1
    assert vllm.host_rank_env(opts, "cpu") == {}


def fake(facts: dict[str, JsonValue], log: Path | None = None) -> Active:
    fw = SimpleNamespace(engine_facts=lambda: facts,
                         describe=lambda: {"server_log": str(log)} if log is not None else {})
    return cast(Active, SimpleNamespace(framework=fw))


def test_world_size_is_the_proof(tmp_path: Path) -> None:
    assert _prove(fake({"world_size": 2, "tensor_parallel_size": 2}), 2).rows[0].ok is True
    assert _prove(fake({"world_size": 1, "tensor_parallel_size": 1}), 2).rows[0].ok is False
    log = tmp_path / "server.log"
    log.write_text("with config: tensor_parallel_size=2, pipeline_parallel_size=1\n"
                   "(Worker_TP0 pid=1) INFO ready\n(Worker_TP1 pid=2) INFO ready\n")
    assert _prove(fake({}, log), 2).rows[0].ok is True
    log.write_text("with config: tensor_parallel_size=1, pipeline_parallel_size=1\n")
    assert _prove(fake({}, log), 2).rows[0].ok is False
    assert _prove(fake({}), 2).rows[0].ok is None  # nothing read back: never a pass


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return run_checks(tmp_path_factory.mktemp("tp"), tensor_parallel_checks(),  # type: ignore[arg-type]
                      check_timeout_s=900, timeout=1800)


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in check["details"]["subchecks"]}


@pytest.mark.slow
@needs_vllm
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TP 2 on the CPU needs 2 cores")
def test_healthy_tp2_passes_with_world_size_2(tp_run: dict[str, dict[str, Any]]) -> None:
    check = tp_run["tp.healthy"]
    assert check["status"] == "pass", check["message"]
    engine = check["details"]["feature"]["engine"]
    assert engine["world_size"] == 2 and engine["tensor_parallel_size"] == 2
    assert engine["distributed_executor_backend"] == "mp"


@pytest.mark.slow
@needs_vllm
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TP 2 on the CPU needs 2 cores")
def test_dropped_partial_sum_fails(tp_run: dict[str, dict[str, Any]]) -> None:
    check = tp_run["tp.dropped"]
    got = rows(check)
    assert check["status"] == "fail", check["message"]
    assert got["feature active: tensor parallel"]["ok"] is True  # two ranks ran; their sum is what is wrong
    assert got["greedy tokens: 1 rank vs 2 ranks"]["ok"] is False
