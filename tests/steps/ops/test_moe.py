"""fused_moe: realistic routing/expert defects are caught, a token-by-token loop passes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.moe import fused_moe
from adaptcheck.steps.ops.providers.base import DictProvider

SMALL = {"hidden": 64, "intermediate": 32}
CASES = [
    {"name": "e8_top2", "tokens": 16, "experts": 8, "topk": 2, **SMALL},
    {"name": "e64_top8_no_renorm", "tokens": 8, "experts": 64, "topk": 8, "renormalize": False, **SMALL},
    {"name": "one_token_top1", "tokens": 1, "experts": 8, "topk": 1, **SMALL},
    {"name": "same_expert", "tokens": 16, "experts": 8, "topk": 2, "routing": "same_expert", **SMALL},
    {"name": "near_tie", "tokens": 16, "experts": 8, "topk": 2, "routing": "near_tie", **SMALL},
    {"name": "large", "tokens": 8, "experts": 8, "topk": 2, "large": True, **SMALL},
]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(fn: Callable[..., Any], dtypes: list[str], seed: int = 0,
         cases: list[dict[str, Any]] = CASES) -> dict[str, Status]:
    params = OpCheckParams(op="fused_moe", dtypes=dtypes, cases=cases, budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {"fused_moe": fn})).run(_ctx(seed), params)}


def _variant(*, softmax_dim: int = -1, swap_gate_up: bool = False, skip_renorm: bool = False,
             softmax_after_topk: bool = False, acc_dtype: torch.dtype = torch.float32) -> Callable[..., torch.Tensor]:
    """The torch provider's expert loop with one defect switched on."""
    def moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            topk: int, renormalize: bool) -> torch.Tensor:
        if softmax_after_topk:
            # Mixtral-style shortcut: softmax over the top-k logits only — equal to the
            # renormalized weights, wrong whenever renormalize is False.
            logits, ids = torch.topk(router_logits.float(), topk, dim=-1)
            weights = torch.softmax(logits, dim=-1)
        else:
            probs = torch.softmax(router_logits.float(), dim=softmax_dim)
            weights, ids = torch.topk(probs, topk, dim=-1)
            if renormalize and not skip_renorm:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        inter = w13.shape[1] // 2
        out = torch.zeros(x.shape, dtype=acc_dtype)
        for e in range(w13.shape[0]):
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            h = x[tok] @ w13[e].t()
            gate, up = (h[:, inter:], h[:, :inter]) if swap_gate_up else (h[:, :inter], h[:, inter:])
            y = (F.silu(gate) * up) @ w2[e].t()
            out.index_add_(0, tok, (y.float() * weights[tok, slot].unsqueeze(1)).to(acc_dtype))
        return out.to(x.dtype)
    return moe


def token_by_token(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk: int, renormalize: bool) -> torch.Tensor:
    """Correct, but loops over tokens, computing probabilities as exp(l - logsumexp(l))."""
    inter = w13.shape[1] // 2
    rows = []
    for t in range(x.shape[0]):
        lf = router_logits[t].float()
        probs = torch.exp(lf - torch.logsumexp(lf, dim=0))
        w, ids = torch.topk(probs, topk)
        if renormalize:
            w = w / w.sum()
        acc = torch.zeros(x.shape[1], dtype=torch.float32)
        for j in reversed(range(topk)):  # other summation order than the provider
            e = int(ids[j])
            h = w13[e] @ x[t]
            y = w2[e] @ (F.silu(h[:inter]) * h[inter:])
            acc += w[j] * y.float()
        rows.append(acc)
    return torch.stack(rows).to(x.dtype)


@pytest.mark.parametrize("seed", range(5))
def test_torch_provider_and_token_loop_pass_across_seeds(seed: int) -> None:
    assert set(_run(fused_moe, ["fp32", "bf16", "fp16"], seed).values()) == {Status.PASS}
    assert set(_run(token_by_token, ["fp32", "bf16"], seed).values()) == {Status.PASS}


@pytest.mark.parametrize(("name", "wrong", "cases"), [
    ("no renormalization", _variant(skip_renorm=True), [CASES[0]]),
    ("softmax over the token axis", _variant(softmax_dim=0), [CASES[0]]),
    ("gate and up swapped", _variant(swap_gate_up=True), [CASES[0]]),
    ("softmax over top-k logits with renormalize off", _variant(softmax_after_topk=True), [CASES[1]]),
])
def test_routing_and_expert_defects_are_caught(name: str, wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run(wrong, ["fp32", "bf16"], cases=cases) == {"fp32": Status.FAIL, "bf16": Status.FAIL}, name


def test_softmax_after_topk_is_harmless_when_renormalizing() -> None:
    # Documents why the no-renormalize case exists: with renormalize on, the shortcut is exact.
    assert _run(_variant(softmax_after_topk=True), ["fp32"], cases=[CASES[0]]) == {"fp32": Status.PASS}


def test_fp16_accumulation_is_caught() -> None:
    wrong = _variant(acc_dtype=torch.float16)
    # fp32: 11-bit sums; bf16: outputs ~1e5 overflow an fp16 accumulator in the 'large' case.
    assert _run(wrong, ["fp32"], cases=[CASES[0]]) == {"fp32": Status.FAIL}
    assert _run(wrong, ["bf16"], cases=[CASES[5]]) == {"bf16": Status.FAIL}
    assert _run(wrong, ["bf16"], cases=[CASES[0]]) == {"bf16": Status.PASS}  # why 'large' is needed


def test_inputs_keep_a_gap_at_the_topk_cut_and_ties_inside() -> None:
    from adaptcheck.steps.ops.catalog import get_op
    from adaptcheck.steps.ops.families.moe import MoeCase

    op = get_op("fused_moe")
    gen = torch.Generator().manual_seed(3)
    case = MoeCase.model_validate(CASES[4])
    inputs = op.make_inputs(case, "bf16", gen)
    assert inputs.notes["min_cut_gap"] >= 0.2
    top = inputs.kwargs["router_logits"].float().topk(2, dim=1).values
    assert bool((top[:, 0] == top[:, 1]).all())  # the two selected experts tie exactly
    shrunk = case.scaled(0.01)
    assert shrunk.tokens < case.tokens and shrunk.experts == case.experts
