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
"""

from __future__ import annotations

import re

from pydantic import JsonValue

from adaptcheck.base.schemas.framework_evidence import FeatureProof
from adaptcheck.frameworks.base import Framework, GenRequest, allowed_cores
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.kinds.compile import server_log
from adaptcheck.steps.frameworks.lifecycle import Active, tp_unfit
from adaptcheck.steps.frameworks.params import LoadOverrides
from adaptcheck.steps.frameworks.probes import not_applicable

HOST_RANKS = 2
"""Ranks on a CPU host: one core each. More would split a small host's cores further, and a
model's head counts must divide by the rank count (2 divides every model adaptcheck ships)."""
ENGINE_TP = re.compile(r"tensor_parallel_size=(\d+)")
WORKER_RANK = re.compile(r"\((?:Vllm)?Worker_TP(\d+)\b")
"""vLLM's per-rank log prefix ("(Worker_TP1 pid=…)") written by each tensor-parallel worker process."""


class TensorParallelParams(FeatureParams):
    """``framework.tensor_parallel``: one rank vs the ranks this machine has (devices, or host cores)."""


class TensorParallelCheck(FrameworkCheck):
    """Tensor parallel vs one rank: same greedy tokens, distributions within the same-framework
    bound, and the engine's world size is the rank count."""

    kind = "framework.tensor_parallel"
    step = 4
    description = ("Tensor parallel (over every device, or two CPU cores on one host) vs one rank give the "
                   "same answers; the engine's world size shows the ranks ran.")
    params_model = TensorParallelParams
    label = "tensor parallel vs one device"
    typical_s = 40.0

    def run(self, ctx: CheckContext, params: TensorParallelParams) -> Outcome:
        cls = framework_class(params.framework)
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
                                vs_float64=True)


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


def _prove(active: Active, ranks: int) -> Proof:
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
                 metrics={"world_size": world if isinstance(world, int) else None, "ranks_asked": ranks})


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
