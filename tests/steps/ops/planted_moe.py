"""Planted defects for grouped_topk and fused_moe_shared, in the torch provider's path and around
vLLM's own code (shared by tests/steps/ops/test_moe_grouped.py and benchmarks/family_moe_ops.py).

Around vLLM the defects are what a model or adapter gets wrong when wiring vLLM's router and
experts: a config value passed wrong (bias, groups, scoring, factor, renormalization) or the
shared expert output dropped or added twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from adaptcheck.steps.ops.families.moe import fused_moe_shared
from adaptcheck.steps.ops.families.moe_routing import by_expert_id

ROUTING_DEFECTS = ("bias ignored in selection", "bias added to the output weights", "group selection skipped",
                   "softmax instead of sigmoid", "routed_scaling_factor dropped", "renormalization skipped")
SHARED_DEFECTS = ("shared experts dropped", "shared experts added twice")


def torch_router(defect: str | None = None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The torch provider's router written out step by step, with one defect switched on."""
    def route(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor | None, topk: int,
              num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
              routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
        logits = router_logits.float()
        sigmoid = scoring_func == "sigmoid" and defect != "softmax instead of sigmoid"
        scores = logits.sigmoid() if sigmoid else logits.softmax(dim=-1)
        t, e = scores.shape
        bias = e_score_correction_bias
        choice = scores if bias is None or defect == "bias ignored in selection" else scores + bias[None, :]
        groups = choice.view(t, num_expert_group, -1)
        group_score = groups.amax(-1) if bias is None else groups.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(topk_group, dim=-1).indices, True)
        if defect == "group selection skipped":
            keep[:] = True
        masked = choice.masked_fill(~keep.repeat_interleave(e // num_expert_group, dim=1), float("-inf"))
        ids = masked.topk(topk, dim=-1).indices
        weights = (choice if defect == "bias added to the output weights" else scores).gather(1, ids)
        if renormalize and defect != "renormalization skipped":
            weights = weights / weights.sum(-1, keepdim=True)
        if defect != "routed_scaling_factor dropped":
            weights = weights * routed_scaling_factor
        return by_expert_id(weights, ids)
    return route


def token_loop_router(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor | None, topk: int,
                      num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
                      routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct, written otherwise: one token at a time, float64, groups by stable sorts."""
    rows_w, rows_i = [], []
    per = router_logits.shape[1] // num_expert_group
    for logits in router_logits.double():
        scores = 1 / (1 + torch.exp(-logits)) if scoring_func == "sigmoid" else torch.exp(logits - logits.logsumexp(0))
        choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.double()
        groups = [choice[g * per:(g + 1) * per] for g in range(num_expert_group)]
        gscore = torch.stack([g.max() if e_score_correction_bias is None else g.sort(descending=True).values[:2].sum()
                              for g in groups])
        kept = gscore.sort(descending=True, stable=True).indices[:topk_group]
        allowed = torch.cat([torch.arange(int(g) * per, (int(g) + 1) * per) for g in kept])
        ids = allowed[choice[allowed].sort(descending=True, stable=True).indices[:topk]]
        w = scores[ids] / (scores[ids].sum() if renormalize else 1.0) * routed_scaling_factor
        rows_w.append(w)
        rows_i.append(ids)
    return by_expert_id(torch.stack(rows_w), torch.stack(rows_i))


def _swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    inter = w13.shape[0] // 2
    h = x @ w13.t()
    return (F.silu(h[:, :inter]) * h[:, inter:]) @ w2.t()


def torch_shared(defect: str) -> Callable[..., torch.Tensor]:
    """The torch provider's MoE with shared experts, the shared MLP dropped or added twice."""
    def moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            shared_w13: torch.Tensor, shared_w2: torch.Tensor) -> torch.Tensor:
        out = fused_moe_shared(x, topk_weights, topk_ids, w13, w2, shared_w13, shared_w2)
        shared = _swiglu(x, shared_w13, shared_w2)
        return out - shared if defect == "shared experts dropped" else out + shared
    return moe


def vllm_router(defect: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """vLLM's router (adapter vllm_moe.grouped_topk) with one value wired wrong."""
    from adaptcheck.steps.ops.providers import vllm_moe

    def route(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor | None, topk: int,
              num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
              routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
        args: dict[str, Any] = {"router_logits": router_logits, "e_score_correction_bias": e_score_correction_bias,
                                "topk": topk, "num_expert_group": num_expert_group, "topk_group": topk_group,
                                "scoring_func": scoring_func, "renormalize": renormalize,
                                "routed_scaling_factor": routed_scaling_factor}
        bias = e_score_correction_bias
        if defect == "bias ignored in selection" and bias is not None:
            args["e_score_correction_bias"] = torch.zeros_like(bias)  # same group rule, no steering
        elif defect == "group selection skipped":
            args.update(num_expert_group=1, topk_group=1)
        elif defect == "softmax instead of sigmoid":
            args["scoring_func"] = "softmax"
        elif defect == "routed_scaling_factor dropped":
            args["routed_scaling_factor"] = 1.0
        elif defect == "renormalization skipped":
            args["renormalize"] = False
        elif defect == "bias added to the output weights" and bias is not None:
            # vLLM's plain scores of its chosen experts, then the bias left in before normalizing.
            raw, ids = vllm_moe.grouped_topk(**{**args, "renormalize": False, "routed_scaling_factor": 1.0})
            w = raw + bias[ids.long()]
            w = w / w.sum(-1, keepdim=True) if renormalize else w
            return w * routed_scaling_factor, ids
        return vllm_moe.grouped_topk(**args)
    return route


def vllm_shared(defect: str) -> Callable[..., torch.Tensor]:
    """vLLM's routed experts and shared MLP (adapter vllm_moe) combined wrongly."""
    from adaptcheck.steps.ops.providers import vllm_moe

    def moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            shared_w13: torch.Tensor, shared_w2: torch.Tensor) -> torch.Tensor:
        routed = vllm_moe.cpu_routed_experts(x, topk_weights, topk_ids, w13, w2)
        if defect == "shared experts dropped":
            return routed
        shared = vllm_moe.shared_expert_mlp(x, shared_w13, shared_w2)
        return routed + shared + shared
    return moe
