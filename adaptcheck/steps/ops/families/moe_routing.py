"""MoE family, routing part: DeepSeek's group-limited top-k router (``grouped_topk``), as
DeepSeek-V3 ("noaux_tc": sigmoid scores, a correction bias, group score = sum of a group's two
best) and DeepSeek-V2 (softmax scores, no bias, group score = a group's best) route tokens.

What goes wrong: the correction bias ignored when choosing experts, or left in the output
weights (it steers the choice only); the group stage skipped (plain top-k over all experts);
softmax scoring where the model says sigmoid; the routed scaling factor or the top-k
renormalization dropped. The inputs are built so that each of these changes the answer for
most tokens (the notes count the tokens where the bias and the groups decide).

Ties: if two groups (or the k-th and (k+1)-th experts) scored nearly the same, two correct
routers could keep different ones and disagree by a whole expert. The inputs are therefore
designed rather than drawn: per token, the kept groups and the chosen experts get values from
separate bands with clear gaps (≥ 0.05 in choice score with a bias, ≥ 0.3 in logits
without), and one dropped group holds a "star" expert that beats the weakest chosen one, so
that a router without the group stage picks it. The gaps, measured on the inputs rounded to
the checked dtype, are in the notes.

Output order: routers return the k experts of a token in any order (vLLM's topk runs with
sorted=False); the op's rows are in ascending expert id, weights alongside, so ids compare
exactly and weights with the element-wise tolerance. ``by_expert_id`` puts a router's
output in that order.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import moe as ref

Scoring = Literal["sigmoid", "softmax"]

BIAS_RANGE = 0.15
"""Correction biases are drawn from ±BIAS_RANGE: enough to change which experts a token gets
(choice-score bands are 0.05-0.2 apart), small enough to keep every score in (0.05, 0.95)."""

# Design bands per token. With a bias (choice = sigmoid score + bias): chosen experts 0.60-0.80
# (one of them below 0.63), the others of kept groups 0.46-0.52, dropped groups 0.20-0.26 with
# one star at 0.68-0.72. Kept group scores are then ≥ 0.60 + 0.46 = 1.06, dropped ones
# ≤ 0.72 + 0.26 = 0.98: gaps 0.08 at both cuts. Without a bias (choice = logit, group score =
# best logit): each kept group's leader 2.6-3.0, further chosen 1.4-1.8, the rest -1-1, the star
# 2.0-2.3; gaps 0.3 (groups) and 0.4 (experts).
_BIAS_BANDS = {"chosen": (0.60, 0.80), "weakest": (0.60, 0.63), "kept": (0.46, 0.52), "dropped": (0.20, 0.26),
               "star": (0.68, 0.72)}
_LOGIT_BANDS = {"leader": (2.6, 3.0), "chosen": (1.4, 1.8), "kept": (-1.0, 1.0), "dropped": (-1.0, 1.0),
                "star": (2.0, 2.3)}


class GroupedTopkCase(CaseBase):
    """Group-limited top-k: keep the topk_group best of n_group expert groups, then the topk best experts."""

    tokens: int = Field(ge=1, description="Tokens T.")
    experts: int = Field(ge=2, description="Routed experts E (n_group equal groups of consecutive ids).")
    topk: int = Field(ge=1, description="Experts per token k (≥ topk_group: one per kept group at least).")
    n_group: int = Field(ge=1, description="Expert groups.")
    topk_group: int = Field(ge=1, description="Groups kept per token.")
    scoring: Scoring = Field(default="sigmoid", description="sigmoid (DeepSeek-V3) | softmax (DeepSeek-V2) scores.")
    correction_bias: bool = Field(default=True, description="An e_score_correction_bias steers the choice (V3"
                                  " noaux_tc: group score = sum of the two best); without, group score = the best.")
    renormalize: bool = Field(default=True, description="Divide the k weights by their sum (norm_topk_prob).")
    routed_scaling_factor: float = Field(default=1.0, gt=0, description="Multiplies the final weights.")

    @model_validator(mode="after")
    def _shape_fits(self) -> GroupedTopkCase:
        if self.experts % self.n_group:
            raise ValueError(f"experts {self.experts} not divisible by n_group {self.n_group}")
        per_group = self.experts // self.n_group
        if not self.topk_group <= self.n_group:
            raise ValueError(f"topk_group {self.topk_group} > n_group {self.n_group}")
        if not self.topk_group <= self.topk <= self.topk_group * per_group:
            raise ValueError(f"topk {self.topk} outside {self.topk_group}..{self.topk_group * per_group}")
        if self.correction_bias and (self.scoring != "sigmoid" or per_group < 2):
            raise ValueError("a correction bias needs sigmoid scoring and groups of ≥ 2 experts (noaux_tc)")
        return self

    def work(self) -> float:
        return 20.0 * self.tokens * self.experts

    def scaled(self, factor: float) -> GroupedTopkCase:
        return self.model_copy(update={"tokens": max(1, int(self.tokens * min(1.0, factor)))})


def _uniform(band: tuple[float, float], n: int, gen: torch.Generator) -> torch.Tensor:
    lo, hi = band
    return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)


def _design_row(case: GroupedTopkCase, gen: torch.Generator) -> torch.Tensor:
    """One token's choice values (score + bias, or logits) with the bands above."""
    e, g = case.experts, case.n_group
    per = e // g
    bands = _BIAS_BANDS if case.correction_bias else _LOGIT_BANDS
    groups = torch.randperm(g, generator=gen)
    kept, dropped = groups[:case.topk_group], groups[case.topk_group:]
    row = _uniform(bands["dropped"], e, gen)
    members = torch.cat([torch.arange(int(k) * per, (int(k) + 1) * per) for k in kept])
    row[members] = _uniform(bands["kept"], members.numel(), gen)
    leaders = kept * per + torch.randint(per, (kept.numel(),), generator=gen)
    rest = members[~torch.isin(members, leaders)]
    extra = rest[torch.randperm(rest.numel(), generator=gen)[:case.topk - kept.numel()]]
    if case.correction_bias:
        chosen = torch.cat([leaders, extra])
        row[chosen] = _uniform(bands["chosen"], chosen.numel(), gen)
        # The weakest chosen expert sits below the star, so a router without groups takes the star.
        row[chosen[torch.randint(chosen.numel(), (1,), generator=gen)]] = _uniform(bands["weakest"], 1, gen)
    else:
        row[leaders] = _uniform(bands["leader"], leaders.numel(), gen)
        row[extra] = _uniform(bands["chosen"], extra.numel(), gen)
    if dropped.numel():
        star = int(dropped[torch.randint(dropped.numel(), (1,), generator=gen)]) * per
        row[star + int(torch.randint(per, (1,), generator=gen))] = _uniform(bands["star"], 1, gen)
    return row


def _cut_gaps(case: GroupedTopkCase, choice: np.ndarray) -> tuple[float, float]:
    """Smallest margin over tokens at the group cut and at the expert cut (inf: no cut)."""
    t, e = choice.shape
    grouped = -np.sort(-choice.reshape(t, case.n_group, -1), axis=-1)
    group_score = grouped[:, :, :2].sum(-1) if case.correction_bias else grouped[:, :, 0]
    ranked = -np.sort(-group_score, axis=-1)
    group_gap = (ranked[:, case.topk_group - 1] - ranked[:, case.topk_group]).min() \
        if case.topk_group < case.n_group else math.inf
    cut_gap = math.inf
    per = e // case.n_group
    for tok in range(t):
        kept = np.argsort(-group_score[tok], kind="stable")[:case.topk_group]
        vals = -np.sort(-np.concatenate([choice[tok, k * per:(k + 1) * per] for k in kept]))
        if case.topk < vals.size:
            cut_gap = min(cut_gap, float(vals[case.topk - 1] - vals[case.topk]))
    return float(group_gap), cut_gap


def _grouped_topk_inputs(case: GroupedTopkCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    design = torch.stack([_design_row(case, gen) for _ in range(case.tokens)])
    bias: torch.Tensor | None = None
    if case.correction_bias:
        # vLLM keeps DeepSeek's e_score_correction_bias in float32 whatever the model dtype.
        bias = ((torch.rand(case.experts, generator=gen, dtype=torch.float64) * 2 - 1) * BIAS_RANGE).float()
        scores = design - bias.double()[None, :]
        logits = torch.log(scores) - torch.log1p(-scores)
    else:
        logits = design
    logits = logits.to(tdt)
    # Margins and decisive tokens measured on what the kernel receives (logits in the dtype).
    logits64 = logits.double().numpy()
    bias64 = None if bias is None else bias.double().numpy()
    if bias64 is not None:
        choice = ref.routing_scores(logits64, case.scoring) + bias64[None, :]
    else:
        choice = logits64  # monotone in each row's scores for sigmoid and softmax alike
    group_gap, cut_gap = _cut_gaps(case, choice)
    args = (case.topk, case.n_group, case.topk_group, case.scoring, case.renormalize, case.routed_scaling_factor)
    ids = ref.grouped_route(logits64, bias64, *args)[0]
    no_groups = ref.grouped_route(logits64, bias64, case.topk, 1, 1, *args[3:])[0]
    notes: dict[str, object] = {
        "gap_domain": "score + bias" if bias is not None else "logit",
        "min_group_gap": group_gap, "min_cut_gap": cut_gap,
        "tokens_groups_decide": int((ids != no_groups).any(axis=1).sum()),
    }
    if bias64 is not None:
        unbiased = ref.grouped_route(logits64, np.zeros_like(bias64), *args)[0]
        notes["tokens_bias_decides"] = int((ids != unbiased).any(axis=1).sum())
    return OpInputs({"router_logits": logits, "e_score_correction_bias": bias, "topk": case.topk,
                     "num_expert_group": case.n_group, "topk_group": case.topk_group,
                     "scoring_func": case.scoring, "renormalize": case.renormalize,
                     "routed_scaling_factor": case.routed_scaling_factor}, notes=notes)


# --- native: the torch provider's implementation (device-generic torch, as DeepSeek's model code
# routes without a fused kernel: fp32 scores, masked top-k).


def by_expert_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's (weights, ids) with each row in ascending expert id: the op's output order."""
    ids_sorted, order = ids.sort(dim=-1)
    return weights.float().gather(-1, order), ids_sorted.to(torch.int32)


def grouped_topk(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor | None, topk: int,
                 num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
                 routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else torch.sigmoid(logits)
    t, e = scores.shape
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.float()[None, :]
    per_group = choice.view(t, num_expert_group, e // num_expert_group)
    if e_score_correction_bias is None:
        group_score = per_group.amax(dim=-1)
    else:
        group_score = per_group.topk(2, dim=-1).values.sum(dim=-1)
    kept = torch.zeros_like(group_score, dtype=torch.bool)
    kept.scatter_(1, group_score.topk(topk_group, dim=-1).indices, True)
    allowed = kept.repeat_interleave(e // num_expert_group, dim=1)
    ids = choice.masked_fill(~allowed, float("-inf")).topk(topk, dim=-1).indices
    weights = scores.gather(1, ids)  # the bias chose the experts; the weights are the plain scores
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return by_expert_id(weights * routed_scaling_factor, ids)


ROUTING_OPS = [
    OpDef(
        name="grouped_topk", family="moe",
        description="DeepSeek group-limited top-k routing: sigmoid/softmax scores, correction bias, expert groups.",
        signature=("grouped_topk(router_logits: [T, E], e_score_correction_bias: [E] float32 | None, topk: int,"
                   " num_expert_group: int, topk_group: int, scoring_func: 'sigmoid' | 'softmax', renormalize: bool,"
                   " routed_scaling_factor: float) -> topk_weights: [T, k] float32, topk_ids: [T, k] int;"
                   " each row in ascending expert id"),
        case_model=GroupedTopkCase, make_inputs=_grouped_topk_inputs, reference=ref.grouped_topk,
        native=grouped_topk, outputs=("topk_weights", "topk_ids"), tolerance=("elementwise", "exact"),
    ),
]
"""Read by moe.py's OPS (the catalog reads the family module ``moe``)."""
