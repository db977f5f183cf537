"""Sampling family: greedy argmax and the top-k / top-p logit mask.

What goes wrong: argmax over a truncated vocabulary or with int16/int32 index arithmetic
(Qwen's vocabulary is 151,936 > 2^16), ties resolved differently, top-k keeping one too
many, nucleus (top-p) mass accumulated over unsorted probabilities or not renormalized
after top-k.

Both outputs must be exact, so the inputs make the expected answer unique: greedy rows
compare only where top-1 beats top-2 clearly in the dtype (``compare_mask``); the mask op's
logits have distinct values wherever a cut can fall, and each p is placed halfway between
two consecutive nucleus masses, far from both compared with float32 summation error.

The torch implementations (``native``): greedy is ``torch.argmax``; the mask is vLLM's
sort-based top-k / top-p (sort ascending, mask below the k-th largest, then the low end whose
cumulative fp32 probability stays ≤ 1 − p; the top token always survives).

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import sampling as ref

CLEAR_GAP = 2.0**-5
"""A greedy row is compared when top1 - top2 ≥ CLEAR_GAP · |top1| (≥ 4 bf16 ULPs)."""
P_MARGIN = 5e-3
"""Minimum distance of p from the nucleus masses on either side of the intended cut."""


class GreedyCase(CaseBase):
    """ids[B] = argmax over V."""

    batch: int = Field(ge=1, description="Rows B.")
    vocab: int = Field(ge=2, description="Vocabulary V.")

    def work(self) -> float:
        return 50.0 * self.batch * self.vocab  # reference and device are both memory-bound scans

    def scaled(self, factor: float) -> GreedyCase:
        # Keep the vocabulary (large indices are the point); drop rows.
        return self.model_copy(update={"batch": max(1, int(self.batch * min(1.0, factor)))})


def _planted_positions(batch: int, vocab: int, gen: torch.Generator) -> list[int]:
    """Where each row's maximum goes: the last index first (truncation), then just past
    int16 and uint16 ranges, the second-to-last, then random positions."""
    fixed = [vocab - 1, 32768, 65536, vocab - 2]
    out = []
    for row in range(batch):
        pos = fixed[row] if row < len(fixed) and fixed[row] < vocab else int(torch.randint(vocab, (1,), generator=gen))
        out.append(pos)
    return out


def _greedy_inputs(case: GreedyCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    b, v = case.batch, case.vocab
    logits = torch.randn(b, v, generator=gen) * 3.0
    positions = _planted_positions(b, v, gen)
    tied_row = b - 1 if b >= 4 else None
    for row, pos in enumerate(positions):
        top = float(logits[row].max())
        logits[row, pos] = top + 1.0  # a clear winner, 1.0 above the rest
        # Ties elsewhere: the runner-up value repeated at a few positions (harmless).
        dup = torch.randint(v, (min(8, v - 1),), generator=gen)
        dup = dup[dup != pos]
        logits[row, dup] = top
        if row == tied_row:
            # A tie at the maximum: implementations may legitimately pick either index, so
            # this row is run but not compared.
            other = (pos + v // 2) % v
            logits[row, other] = top + 1.0
    logits = logits.to(tdt)
    z = logits.double()
    two = z.topk(2, dim=1).values
    mask = (two[:, 0] - two[:, 1]) >= CLEAR_GAP * two[:, 0].abs()
    notes = {"argmax_positions": positions, "rows_compared": int(mask.sum()),
             "rows_not_compared": [int(i) for i in torch.nonzero(~mask).flatten()]}
    return OpInputs({"logits": logits}, notes=notes, compare_mask=mask)


class TopKTopPCase(CaseBase):
    """masked[B, V]: -inf outside the top-k and outside the nucleus of mass p."""

    batch: int = Field(ge=1, description="Rows B; rows cycle through (k, p) patterns.")
    vocab: int = Field(ge=2, description="Vocabulary V.")
    head: int = Field(default=64, ge=2, description="Distinct high logits where the cuts fall.")

    def work(self) -> float:
        return 40.0 * self.batch * self.vocab  # sorts dominate

    def scaled(self, factor: float) -> TopKTopPCase:
        return self.model_copy(update={"batch": max(1, int(self.batch * min(1.0, factor)))})


Pattern = Literal["k_and_p", "p_only", "k1", "all", "tiny_p", "k_only"]
PATTERNS: tuple[Pattern, ...] = ("k_and_p", "p_only", "k1", "all", "tiny_p", "k_only")
"""(k, p) per row, cycled: top-k then top-p; k = V with a p cut; k = 1; k = V with p = 1
(nothing masked); k = V with p = 1e-6 (only the top token); top-k with p = 1."""


def _distinct_values(n: int, lo: float, hi: float, tdt: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """n distinct values of dtype ``tdt`` in [lo, hi), in random order (by bit patterns:
    positive floats are ordered like their bit patterns)."""
    int_t = {2: torch.int16, 4: torch.int32}[tdt.itemsize]
    lo_b = int(torch.tensor(lo, dtype=tdt).view(int_t))
    hi_b = int(torch.tensor(hi, dtype=tdt).view(int_t))
    span = hi_b - lo_b
    if span < n:
        raise ValueError(f"only {span} distinct {tdt} values in [{lo}, {hi}), {n} needed")
    if span <= 1 << 20:
        picks = torch.randperm(span, generator=gen)[:n]
    else:
        picks = torch.unique(torch.randint(span, (4 * n,), generator=gen))
        picks = picks[torch.randperm(picks.numel(), generator=gen)][:n]
    return (picks + lo_b).to(int_t).view(tdt)


def _choose_p(probs_desc: np.ndarray, head: int, gen: torch.Generator) -> float | None:
    """A float32 p halfway between two consecutive nucleus masses, P_MARGIN from both,
    with the cut among the first ``head`` (distinct) values."""
    mass = np.cumsum(probs_desc)
    cands = []
    for n in range(1, min(probs_desc.size, head)):
        p = float(np.float32(mass[n - 1] + probs_desc[n] / 2))
        if p - mass[n - 1] >= P_MARGIN and mass[n] - p >= P_MARGIN and p < 1.0:
            cands.append(p)
    if not cands:
        return None
    return cands[int(torch.randint(len(cands), (1,), generator=gen))]


def _topk_topp_inputs(case: TopKTopPCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    b, v = case.batch, case.vocab
    head = min(case.head, v)
    # Tail in [-8, 2) (ties allowed: always below every cut), head distinct in [4, 12).
    logits = (torch.rand(b, v, generator=gen) * 10.0 - 8.0).to(tdt)
    ks = torch.empty(b, dtype=torch.int64)
    ps = torch.empty(b, dtype=torch.float32)
    patterns: list[str] = []
    for row in range(b):
        pos = torch.randperm(v, generator=gen)[:head]
        logits[row, pos] = _distinct_values(head, 4.0, 12.0, tdt, gen)
        pattern: str = PATTERNS[row % len(PATTERNS)]
        k = {"k1": 1, "p_only": v, "all": v, "tiny_p": v}.get(pattern, 0)
        if k == 0:
            k = int(torch.randint(2, head + 1, (1,), generator=gen)) if head >= 2 else 1
        p = {"tiny_p": 1e-6}.get(pattern, 1.0)
        if pattern in ("k_and_p", "p_only"):
            z = logits[row].double().numpy()
            top = np.sort(z)[::-1][:k]
            e = np.exp(top - top.max())
            chosen = _choose_p(e / e.sum(), head, gen)
            if chosen is None:
                pattern, chosen = pattern + "(no safe p cut: p=1)", 1.0
            p = chosen
        ks[row], ps[row] = k, p
        patterns.append(pattern)
    notes = {"patterns": patterns, "k": ks.tolist(), "p": ps.tolist()}
    return OpInputs({"logits": logits, "k": ks, "p": ps}, notes=notes)


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1).to(torch.int64)


def top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Sort ascending, mask below the k-th largest, then mask the low end whose cumulative
    probability stays ≤ 1 - p (the top token always survives); scatter back."""
    vals, idx = logits.sort(dim=-1, descending=False)
    v = logits.shape[-1]
    kth = vals.gather(1, (v - k.to(torch.long)).unsqueeze(1))
    vals = vals.masked_fill(vals < kth, float("-inf"))
    # Probabilities in fp32 whatever the logits dtype, as a sampler does.
    cum = torch.softmax(vals.float(), dim=-1).cumsum(dim=-1)
    drop = cum <= (1.0 - p.float()).unsqueeze(1)
    drop[:, -1] = False
    vals = vals.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, idx, vals)


OPS = [
    OpDef(
        name="greedy_sample", family="sampling", description="Greedy sampling: argmax over the vocabulary.",
        signature="greedy_sample(logits: [B, V]) -> ids: [B] int64",
        case_model=GreedyCase, make_inputs=_greedy_inputs, reference=ref.greedy_sample, native=greedy_sample,
        outputs=("ids",), tolerance=("exact",),
    ),
    OpDef(
        name="top_k_top_p_mask", family="sampling",
        description="Top-k then top-p (nucleus over the renormalized top-k softmax) logit mask.",
        signature=("top_k_top_p_mask(logits: [B, V], k: [B] int64, p: [B] float32) -> masked: [B, V]"
                   " (dtype of logits; -inf outside the kept set, other values unchanged)"),
        case_model=TopKTopPCase, make_inputs=_topk_topp_inputs, reference=ref.top_k_top_p_mask, native=top_k_top_p_mask,
        outputs=("masked",), tolerance=("exact",),
    ),
]
