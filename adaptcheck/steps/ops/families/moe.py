"""MoE family: the fused mixture-of-experts layer (softmax → top-k → renormalize → experts), the
MoE layer with shared experts (DeepSeek: routed experts from a given routing plus one shared
SwiGLU MLP every token goes through), and, from moe_routing.py, DeepSeek's grouped top-k router.

What goes wrong: routing softmax taken over the wrong axis or in low precision, the top-k
renormalization skipped or applied when it should not be, gate and up halves of w13
swapped, expert outputs accumulated in fp16 (overflow for large activations), experts that
receive many tokens (every token on one expert) or a single token taking another path.

Router ties: if the k-th and (k+1)-th logits of a token were (nearly) equal, a correct
kernel could pick either expert and the outputs would differ by a whole expert — not a
numerical error. Inputs therefore keep a clear gap (≥ 0.2 after rounding to the dtype) at
that boundary, and the ``near_tie`` routing puts exact ties where they are harmless: among
the *selected* experts (equal weights, so their order does not matter) and among the
unselected ones.

The torch implementation (``native``) is the expert-by-expert loop a model without a
fused kernel runs: matmuls in the model dtype, the weighted sum across experts in fp32.

Shared experts (``fused_moe_shared``): the shared MLP's output is added with weight 1 to the
routed sum. What goes wrong: the shared experts dropped or added twice (a layer that adds them
and a runner that adds them again), the routing weights applied to them. The routing is an
input (weights summing to a routed scaling factor, distinct ids per token), so the check sees
only the experts.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.families.moe_routing import ROUTING_OPS
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import moe as ref

Routing = Literal["random", "same_expert", "near_tie"]

CUT_GAP = 0.25
"""Minimum logit gap (before rounding to the dtype) between the k-th and (k+1)-th expert."""


class MoeCase(CaseBase):
    """out[T, H] = Σ_topk weight · w2[e] (silu(gate) * up), [gate; up] = w13[e] x."""

    tokens: int = Field(ge=1, description="Tokens T.")
    hidden: int = Field(ge=1, description="Hidden size H.")
    intermediate: int = Field(ge=1, description="Expert intermediate size I (w13 has 2I rows).")
    experts: int = Field(ge=1, description="Number of experts E.")
    topk: int = Field(ge=1, description="Experts per token.")
    renormalize: bool = Field(default=True, description="Renormalize the top-k weights to sum to 1.")
    routing: Routing = Field(default="random", description="random | same_expert (all tokens on the same"
                             " experts) | near_tie (exact ties inside and outside the selected set).")
    large: bool = Field(default=False, description="Activations of ~1e5 (fp16 range exceeded for fp32/bf16).")

    @model_validator(mode="after")
    def _topk_fits(self) -> MoeCase:
        if self.topk > self.experts:
            raise ValueError(f"topk {self.topk} > experts {self.experts}")
        return self

    def work(self) -> float:
        return 2.0 * self.tokens * self.topk * 3 * self.hidden * self.intermediate

    def scaled(self, factor: float) -> MoeCase:
        # Fewer tokens first (routing patterns survive), then a narrower intermediate size;
        # H, E and topk define the layer's shape and stay.
        tokens = max(1, int(self.tokens * min(1.0, factor)))
        rest = factor * self.tokens / tokens
        inter = max(1, int(self.intermediate * min(1.0, rest)))
        return self.model_copy(update={"tokens": tokens, "intermediate": inter})


def _router_logits(case: MoeCase, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, object]]:
    t, e, k = case.tokens, case.experts, case.topk
    logits = torch.randn(t, e, generator=gen) * 2.0
    if case.routing == "same_expert":
        chosen = torch.randperm(e, generator=gen)[:k]
        logits[:, chosen] += 12.0
    elif case.routing == "near_tie":
        # Selected experts share one value (exact tie inside the set); the others sit on a
        # coarse grid well below, so many of them tie exactly with each other.
        for row in range(t):
            perm = torch.randperm(e, generator=gen)
            logits[row, perm[:k]] = 2.0
            logits[row, perm[k:]] = torch.randint(-8, 0, (e - k,), generator=gen).float() * 0.25
    if k < e:
        # Open a clear gap at the k-th / (k+1)-th boundary by lifting the selected experts.
        vals, idx = logits.sort(dim=1, descending=True)
        gap = vals[:, k - 1] - vals[:, k]
        lift = (CUT_GAP - gap).clamp(min=0.0)
        sel = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, idx[:, :k], True)
        logits = logits + sel * lift[:, None]
    out = logits.to(dtype)
    notes: dict[str, object] = {"routing": case.routing}
    if k < e:
        vals = out.double().sort(dim=1, descending=True).values
        notes["min_cut_gap"] = float((vals[:, k - 1] - vals[:, k]).min())
    return out, notes


def _moe_inputs(case: MoeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, h, i, e = case.tokens, case.hidden, case.intermediate, case.experts
    # Weights scaled by 1/sqrt(fan-in) keep activations O(1) through both products.
    x_scale = 1.0
    if case.large:
        # Output ≈ x_scale²·O(1) through silu(gate)·up: ~1e5 overflows an fp16 accumulator;
        # for fp16 itself stay well inside its range (~1e3, tails ~3e4) so a correct fp16
        # kernel, whose intermediates are fp16, can pass.
        x_scale = math.sqrt(1e3) if dtype == "fp16" else math.sqrt(1e5)
    x = (torch.randn(t, h, generator=gen) * x_scale).to(tdt)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / math.sqrt(h)).to(tdt)
    w2 = (torch.randn(e, h, i, generator=gen) / math.sqrt(i)).to(tdt)
    logits, notes = _router_logits(case, tdt, gen)
    ids = logits.float().topk(case.topk, dim=1).indices
    counts = torch.bincount(ids.reshape(-1), minlength=e)
    notes.update({"max_tokens_per_expert": int(counts.max()), "experts_used": int((counts > 0).sum()),
                  "x_scale": x_scale})
    return OpInputs({"x": x, "router_logits": logits, "w13": w13, "w2": w2, "topk": case.topk,
                     "renormalize": case.renormalize}, notes=notes)


class MoeSharedCase(CaseBase):
    """out[T, H] = Σ_k topk_weights · expert_{topk_ids}(x) + shared(x), SwiGLU experts, routing given."""

    tokens: int = Field(ge=1, description="Tokens T.")
    hidden: int = Field(ge=1, description="Hidden size H.")
    intermediate: int = Field(ge=1, description="Routed expert intermediate size I.")
    experts: int = Field(ge=1, description="Routed experts E.")
    topk: int = Field(ge=1, description="Routed experts per token.")
    n_shared: int = Field(default=1, ge=1, description="Shared experts, fused into one MLP of width n_shared·I.")
    routed_scaling_factor: float = Field(default=1.0, gt=0, description="What each token's routing weights sum to.")
    same_expert: bool = Field(default=False, description="Every token routed to the same experts (a hot expert).")

    @model_validator(mode="after")
    def _topk_fits(self) -> MoeSharedCase:
        if self.topk > self.experts:
            raise ValueError(f"topk {self.topk} > experts {self.experts}")
        return self

    def work(self) -> float:
        return 2.0 * self.tokens * (self.topk + self.n_shared) * 3 * self.hidden * self.intermediate

    def scaled(self, factor: float) -> MoeSharedCase:
        tokens = max(1, int(self.tokens * min(1.0, factor)))
        rest = factor * self.tokens / tokens
        inter = max(1, int(self.intermediate * min(1.0, rest)))
        if self.intermediate % 32 == 0:
            # Model widths are multiples of 32 and kernels rely on it (vLLM's silu_and_mul
            # needs the shared width to be a multiple of its vector length): keep it so.
            inter = max(32, inter // 32 * 32)
        return self.model_copy(update={"tokens": tokens, "intermediate": inter})


def _moe_shared_inputs(case: MoeSharedCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, h, i, e, k = case.tokens, case.hidden, case.intermediate, case.experts, case.topk
    shared_i = case.n_shared * i
    x = torch.randn(t, h, generator=gen).to(tdt)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / math.sqrt(h)).to(tdt)
    w2 = (torch.randn(e, h, i, generator=gen) / math.sqrt(i)).to(tdt)
    shared_w13 = (torch.randn(2 * shared_i, h, generator=gen) / math.sqrt(h)).to(tdt)
    shared_w2 = (torch.randn(h, shared_i, generator=gen) / math.sqrt(shared_i)).to(tdt)
    if case.same_expert:
        ids = torch.randperm(e, generator=gen)[:k].repeat(t, 1)
    else:
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    # Positive weights away from zero (each expert visibly contributes), summing to the factor
    # as a renormalized, scaled router output does.
    raw = 0.5 + torch.rand(t, k, generator=gen)
    weights = (raw / raw.sum(dim=1, keepdim=True) * case.routed_scaling_factor).float()
    counts = torch.bincount(ids.reshape(-1), minlength=e)
    return OpInputs({"x": x, "topk_weights": weights, "topk_ids": ids.to(torch.int32), "w13": w13, "w2": w2,
                     "shared_w13": shared_w13, "shared_w2": shared_w2},
                    notes={"max_tokens_per_expert": int(counts.max()), "experts_used": int((counts > 0).sum()),
                           "shared_intermediate": shared_i})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk: int, renormalize: bool) -> torch.Tensor:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok] @ w13[e].t()  # matmuls in the model dtype, as a model runs them
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2[e].t()
        # Weighted sum across experts in fp32: several experts add into one row.
        out.index_add_(0, tok, y.float() * weights[tok, slot].unsqueeze(1))
    return out.to(x.dtype)


def _swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w13.t()
    inter = w13.shape[0] // 2
    return (F.silu(h[:, :inter]) * h[:, inter:]) @ w2.t()


def fused_moe_shared(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                     w2: torch.Tensor, shared_w13: torch.Tensor, shared_w2: torch.Tensor) -> torch.Tensor:
    # Shared MLP in the model dtype, as the model's dense MLP runs; routed experts as fused_moe.
    out = _swiglu(x, shared_w13, shared_w2).float()
    ids = topk_ids.long()
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel():
            y = _swiglu(x[tok], w13[e], w2[e])
            out.index_add_(0, tok, y.float() * topk_weights[tok, slot].float().unsqueeze(1))
    return out.to(x.dtype)


OPS = [
    OpDef(
        name="fused_moe", family="moe",
        description="Mixture of experts: fp32 softmax router, top-k, optional renormalization, SwiGLU experts.",
        signature=("fused_moe(x: [T, H], router_logits: [T, E], w13: [E, 2I, H], w2: [E, H, I], topk: int,"
                   " renormalize: bool) -> out: [T, H] (dtype of x); w13 rows: first I gate, next I up"),
        case_model=MoeCase, make_inputs=_moe_inputs, reference=ref.fused_moe, native=fused_moe,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="fused_moe_shared", family="moe",
        description="MoE layer with shared experts: given routing, SwiGLU routed experts plus a shared SwiGLU MLP.",
        signature=("fused_moe_shared(x: [T, H], topk_weights: [T, k] float32, topk_ids: [T, k] int32, w13: [E, 2I, H],"
                   " w2: [E, H, I], shared_w13: [2Is, H], shared_w2: [H, Is]) -> out: [T, H] (dtype of x);"
                   " out = Σ_k topk_weights · expert(x) + shared(x); w13 rows: first I gate, next I up"),
        case_model=MoeSharedCase, make_inputs=_moe_shared_inputs, reference=ref.fused_moe_shared,
        native=fused_moe_shared, outputs=("out",), tolerance=("reduction",),
    ),
    *ROUTING_OPS,
]
