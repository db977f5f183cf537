"""``framework.tensor_parallel``: the model split over tensor-parallel ranks gives the one-rank
answers, and the engine really ran that many ranks (docs/features.md, "Tensor parallel on one host").

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared feature body is :mod:`adaptcheck.steps.frameworks.feature`.

When it applies: on an accelerator, over every device when there is more than one (the adapter
must have tensor parallelism). On the CPU, where the adapter runs its ranks as processes on the
host's cores (:attr:`Framework.host_tensor_parallel_env`, vLLM's CPU backend), over two ranks of
one core each whenever this process may use at least two cores: the adapter's binding variable
gives rank ``i`` the ``i``-th allowed core. The proof is the engine's own world size (in process)
or its config line and per-rank worker lines in the server's log (served).

Under ``--serve`` (docs/features.md, "Tensor parallel as deployed"), a check of the deployed model
compares the deployed TP size with the *smallest size the model fits* (:func:`smallest_tp_that_fits`:
the weights and a KV/activation reserve against one device's memory, over the sizes whose heads
divide), not blindly with one rank: a 72B model deployed at TP 4 on 80 GB cards is compared with TP 2,
since TP 1 would not load. Where the deployed size is the only one that fits, the check is n/a with
the figures.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import Field, JsonValue

from adaptcheck.base.dtypes import itemsize
from adaptcheck.base.errors import AdaptcheckError
from adaptcheck.base.families import language_config
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.framework_evidence import FeatureProof
from adaptcheck.frameworks.base import Framework, GenRequest, allowed_cores
from adaptcheck.frameworks.modelfiles import read_config
from adaptcheck.frameworks.modelsrc import ResolvedModel, resolve_model
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.kinds.compile import server_log
from adaptcheck.steps.frameworks.lifecycle import Active, deployed_here, tp_unfit
from adaptcheck.steps.frameworks.params import LoadOverrides
from adaptcheck.steps.frameworks.probes import not_applicable

HOST_RANKS = 2
"""Ranks on a CPU host: one core each. More would split a small host's cores further, and a
model's head counts must divide by the rank count (2 divides every model adaptcheck ships)."""
ENGINE_TP = re.compile(r"tensor_parallel_size=(\d+)")
WORKER_RANK = re.compile(r"\((?:Vllm)?Worker_TP(\d+)\b")
"""vLLM's per-rank log prefix ("(Worker_TP1 pid=…)") written by each tensor-parallel worker process."""
GIB = 1 << 30
GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of a device's total memory one engine may take
(weights, activations and KV cache together); the deployment's own value wins."""
CPU_KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU backend: the KV cache each rank allocates, in GiB (adaptcheck's default: 1, vllm_env_defaults)."""


class TensorParallelParams(FeatureParams):
    """``framework.tensor_parallel``: one rank vs the ranks this machine has (devices, or host cores);
    under ``--serve``, the deployed size vs the smallest size the model fits."""

    activation_reserve_gib: float = Field(default=1.0, ge=0, description="Memory each rank keeps for activations "
                                          "beside its weights and KV cache, in GiB, when the smallest tensor-parallel "
                                          "size the deployed model fits is worked out (--serve only).")


class TensorParallelCheck(FrameworkCheck):
    """Tensor parallel vs one rank: same greedy tokens, distributions within the same-framework
    bound, and the engine's world size is the rank count."""

    kind = "framework.tensor_parallel"
    step = 4
    description = ("Tensor parallel gives the answers of fewer ranks: every device (two CPU cores on one host) vs "
                   "one rank; under --serve the deployed size vs the smallest size the model fits. The engine's "
                   "world size shows the ranks ran.")
    params_model = TensorParallelParams
    label = "tensor parallel vs one device"
    typical_s = 40.0

    def run(self, ctx: CheckContext, params: TensorParallelParams) -> Outcome:
        cls = framework_class(params.framework)
        dep = ctx.deployment
        if dep is not None and dep.tensor_parallel_size > 1 and deployed_here(ctx, cls, params.model):
            return _as_deployed(ctx, params, cls, dep)
        plan = tp_plan(cls, ctx.device.type, ctx.device_count, allowed_cores())
        if isinstance(plan, str):
            return not_applicable(params, plan)
        ranks = plan["tensor_parallel_size"]
        unfit = tp_unfit(cls, params.model or ctx.model.name, ctx.seed, ranks)
        if unfit is not None:
            return not_applicable(params, unfit)
        return feature_vs_plain(ctx, params, "tensor parallel", plan, lambda active: _requests(params),
                                lambda active, deltas: _prove(active, ranks),
                                names=("1 rank", f"{ranks} ranks"), plain={"tensor_parallel_size": 1},
                                vs_float64=True, feature_name="tensor_parallel")


def tp_plan(cls: type[Framework], device_type: str, device_count: int, cores: list[int]) -> LoadOverrides | str:
    """How the feature instance loads (rank count, the binding environment), or why TP does not apply."""
    if device_type == "cpu" and cls.host_tensor_parallel_env is not None:
        if len(cores) < HOST_RANKS:
            return (f"tensor parallel on the CPU needs {HOST_RANKS} cores, one per rank; this process may "
                    f"use {len(cores)}")
        binding = "|".join(str(c) for c in cores[:HOST_RANKS])
        return {"tensor_parallel_size": HOST_RANKS, "env": {cls.host_tensor_parallel_env: binding}}
    if device_count < 2:
        return "tensor parallel needs more than one device"
    if not cls.supports_tensor_parallel:
        return f"{cls.display_name} has no tensor parallelism"
    return {"tensor_parallel_size": device_count}


def _requests(p: TensorParallelParams) -> list[GenRequest]:
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n)
            for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]


def _as_deployed(ctx: CheckContext, params: TensorParallelParams, cls: type[Framework], dep: Deployment) -> Outcome:
    """The deployed TP size ("with") against the smallest size the model fits ("without"); n/a where
    the deployed size is the only one that fits."""
    deployed = dep.tensor_parallel_size
    try:
        model = resolve_model(dep.model, seed=ctx.seed)
    except (AdaptcheckError, OSError) as exc:
        return not_applicable(params, f"the deployed model does not resolve: {exc}")
    memory = tp_memory(model, dep, ctx, params.activation_reserve_gib)
    fit = smallest_tp_that_fits(range(1, deployed + 1), lambda n: cls.tensor_parallel_unfit(model.path, n), memory)
    # The deployment runs at its own size whatever the estimate says (framework.load judges whether it
    # really loads): only sizes below it are candidates for the other side.
    smaller = [n for n in fit.fitting if n < deployed]
    if not smaller:
        return not_applicable(params, f"only TP {deployed} fits: {fit.figures}")
    base = smaller[0]
    extra: dict[str, float | str | None] = {"deployed_tp": deployed, "smallest_fitting_tp": base,
                                            "tp_fit": fit.figures}
    return feature_vs_plain(ctx, params, "tensor parallel as deployed", {}, lambda active: _requests(params),
                            lambda active, deltas: _prove(active, deployed, extra),
                            names=(f"TP {base} (smallest that fits)", f"TP {deployed} as deployed"),
                            plain={"tensor_parallel_size": base}, vs_float64=True, feature_name="tensor_parallel")


# ------------------------------------------------------------ the smallest size that fits --

@dataclass(frozen=True)
class TpMemory:
    """What the smallest-fit arithmetic knows: the model's bytes and one device's memory."""

    weights_bytes: int
    """The weights at the served dtype, split evenly over the ranks."""
    kv_bytes: int = 0
    """KV cache of one ``max_model_len`` sequence over every layer (split over the ranks as the KV
    heads are: by at most ``kv_heads``, replicated past that)."""
    kv_heads: int | None = None
    kv_bytes_per_rank: int | None = None
    """A fixed cache each rank allocates instead (vLLM's CPU ``VLLM_CPU_KVCACHE_SPACE``,
    ``kv_cache_memory_bytes``), in place of ``kv_bytes``' share."""
    reserve_bytes: int = GIB
    """Activations, per rank."""
    device_bytes: int | None = None
    """What one device gives the engine (total × gpu_memory_utilization), or the host pool the ranks
    share (``shared``); None: unknown, every size is taken to fit."""
    shared: bool = False
    """The ranks share ``device_bytes`` (CPU ranks are processes on one host's memory)."""
    where: str = ""
    """Where ``device_bytes`` came from, in words, for the figures."""


@dataclass(frozen=True)
class TpFit:
    """The sizes that fit, in order; why each other size does not; the figures in one line."""

    fitting: list[int]
    refused: dict[int, str] = field(default_factory=dict)
    figures: str = ""

    @property
    def smallest(self) -> int | None:
        return self.fitting[0] if self.fitting else None


def rank_bytes(m: TpMemory, size: int) -> int:
    """Bytes one rank of a ``size``-way split needs: its share of the weights, its KV cache, its reserve."""
    kv = m.kv_bytes_per_rank if m.kv_bytes_per_rank is not None else m.kv_bytes // max(1, min(size, m.kv_heads or size))
    return -(-m.weights_bytes // size) + kv + m.reserve_bytes


def smallest_tp_that_fits(sizes: Iterable[int], unfit: Callable[[int], str | None], m: TpMemory) -> TpFit:
    """The tensor-parallel sizes (of ``sizes``) a model fits, smallest first.

    A size fits when ``unfit(size)`` is None (every rank holds whole attention heads:
    :meth:`Framework.tensor_parallel_unfit`) and one rank's need (:func:`rank_bytes`) fits one
    device, or, where the ranks share one pool (a CPU host), ``size`` ranks' needs fit it together.
    Pure: the memory and the head rule are given.
    """
    fitting: list[int] = []
    refused: dict[int, str] = {}
    parts: list[str] = []
    for n in sorted(set(sizes)):
        why = unfit(n)
        if why is not None:
            refused[n] = why
            parts.append(f"TP {n}: {_heads_words(why)}")
            continue
        need = rank_bytes(m, n) * (n if m.shared else 1)
        per = "for its ranks together" if m.shared else "per device"
        if m.device_bytes is not None and need > m.device_bytes:
            refused[n] = f"needs {size_text(need)} {per}, more than {size_text(m.device_bytes)}"
            parts.append(f"TP {n} needs {size_text(need)} {per}")
            continue
        fitting.append(n)
        parts.append(f"TP {n} needs {size_text(need)} {per}")
    have = (f"of {size_text(m.device_bytes)} ({m.where})" if m.device_bytes is not None
            else "device memory unknown: every size taken to fit")
    return TpFit(fitting=fitting, refused=refused,
                 figures=f"{'; '.join(parts)} {have}; weights {size_text(m.weights_bytes)}")


def size_text(n: int) -> str:
    """Bytes in GiB with one decimal, or MiB below a tenth of a GiB (a test model's weights)."""
    return f"{n / GIB:,.1f} GiB" if n >= GIB // 10 else f"{n / 2**20:,.1f} MiB"


def _heads_words(why: str) -> str:
    """The head rule's reason, shortened for the figures line."""
    return why.split(" (", 1)[0]


def tp_memory(model: ResolvedModel, dep: Deployment, ctx: CheckContext, reserve_gib: float) -> TpMemory:
    """The smallest-fit inputs for the deployed model on this machine (docs/features.md, "Tensor
    parallel as deployed", says why each figure is what it is)."""
    config = read_config(model.path) or {}
    cfg = language_config(config)
    served = itemsize(dep.dtype or "") or 2
    stored = itemsize(str(model.torch_dtype or ""))
    weights = model.weights_bytes
    if stored is not None and not dep.quantization and not cfg.get("quantization_config"):
        weights = weights * served // stored  # a float checkpoint stored at another dtype than served
    layers, kv_heads, head_dim = (_num(cfg.get("num_hidden_layers")), _num(cfg.get("num_key_value_heads"))
                                  or _num(cfg.get("num_attention_heads")), model.head_dim)
    kv_elem = 1 if dep.kv_cache_dtype.startswith("fp8") else served
    max_len = dep.max_model_len or model.max_position or ctx.model.context_length
    kv = 2 * layers * kv_heads * head_dim * kv_elem * max_len if layers and kv_heads and head_dim else 0
    fixed: int | None = _num(dep.engine_args.get("kv_cache_memory_bytes")) or None
    reserve = int(reserve_gib * GIB)
    if ctx.device.type == "cpu":
        # CPU ranks are processes on one host: they share its memory, and each allocates the KV cache
        # vLLM's CPU backend is given (VLLM_CPU_KVCACHE_SPACE GiB, adaptcheck's default 1) however
        # long the context. The pool is the memory available now (MemAvailable), not the total: the
        # host also runs this process and the float64 reference.
        if fixed is None:
            from adaptcheck.frameworks.vllm_fw import vllm_env_defaults

            space = os.environ.get(CPU_KVCACHE_ENV) or vllm_env_defaults().get(CPU_KVCACHE_ENV)
            fixed = int(float(space) * GIB) if space and space.replace(".", "", 1).isdigit() else None
        free = ctx.backend.memory_stats(ctx.device_index).get("free")
        return TpMemory(weights_bytes=weights, kv_bytes=kv, kv_heads=kv_heads, kv_bytes_per_rank=fixed,
                        reserve_bytes=reserve, device_bytes=int(free) if free else None, shared=True,
                        where="host memory available, shared by the ranks")
    total = ctx.backend.memory_stats(ctx.device_index).get("total")
    if total is None:
        devices, _note = ctx.backend.inventory()
        mib = devices[ctx.device_index].memory_total_mib if len(devices) > ctx.device_index else None
        total = mib * 2**20 if mib else None
    util_arg = dep.engine_args.get("gpu_memory_utilization")
    util = float(util_arg) if isinstance(util_arg, (int, float)) and not isinstance(util_arg, bool) else \
        GPU_MEMORY_UTILIZATION
    return TpMemory(weights_bytes=weights, kv_bytes=kv, kv_heads=kv_heads, kv_bytes_per_rank=fixed,
                    reserve_bytes=reserve, device_bytes=int(total * util) if total else None,
                    where=f"{total / GIB:,.1f} GiB per device × gpu_memory_utilization {util:g}" if total else "")


def _num(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _prove(active: Active, ranks: int, extra: Mapping[str, float | str | None] | None = None) -> Proof:
    facts = facts_of(active)
    ok: bool | None
    if facts and "world_size" in facts:
        world, tp = facts.get("world_size"), facts.get("tensor_parallel_size")
        ok = world == ranks and tp == ranks
        how = (f"engine world size {world}, tensor parallel size {tp}, executor "
               f"{facts.get('distributed_executor_backend')!r}")
        if not ok:
            how += f": {ranks} ranks were asked for"
    else:
        facts, ok, how = _from_log(active, ranks)
    record = FeatureProof(feature="tensor_parallel", active=ok, how=how, engine=facts)
    world = facts.get("world_size")
    return Proof(rows=[engine_row("tensor parallel", ok, how)], record=record,
                 metrics={"world_size": world if isinstance(world, int) else None, "ranks_asked": ranks,
                          **(extra or {})})


def _from_log(active: Active, ranks: int) -> tuple[dict[str, JsonValue], bool | None, str]:
    """A served engine: its logged config's TP size and the ranks whose workers logged."""
    text = server_log(active)
    if text is None:
        return {}, None, "not read back: the framework exposes neither its engine config nor a log"
    tp = ENGINE_TP.search(text)
    logged = sorted({int(m.group(1)) for m in WORKER_RANK.finditer(text)})
    facts: dict[str, JsonValue] = {"tensor_parallel_size": int(tp.group(1)) if tp else None,
                                   "worker_ranks_logged": list(logged)}
    if tp is None and not logged:
        return facts, None, "not read back: the server log names no tensor-parallel size or worker rank"
    ok = (tp is None or int(tp.group(1)) == ranks) and (not logged or logged == list(range(ranks)))
    if ok and logged:
        facts["world_size"] = len(logged)
    how = (f"the server's engine logged tensor_parallel_size={tp.group(1) if tp else '?'}; worker ranks "
           f"{logged or 'not named'} logged")
    if not ok:
        how += f": {ranks} ranks were asked for"
    return facts, ok, how
