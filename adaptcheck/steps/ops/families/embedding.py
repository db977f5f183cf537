"""Embedding family: token-id → row lookup, judged exactly.

What goes wrong: ids narrowed to 16 (or 32) bits somewhere in the kernel, so ids past
32767 / 65535 read another row; the last row (V − 1) missed by an off-by-one bound;
duplicated ids mishandled by a kernel that assumes distinct rows; a table cast through
another dtype on the way (bf16 → fp16 loses range, anything → lower precision loses bits).
A lookup is a copy, so the output must equal the table rows bit for bit.

``ids``: ``mixed`` is random ids plus the boundary ids (0, V − 1 twice, 32767, 32768,
65535, 65536 where V allows); ``high`` is ids from the last 64 rows, V − 1 included;
``repeated`` draws from three ids only; ``uniform`` is plain random ids.

The torch implementation (``native``) is ``F.embedding``, what ``nn.Embedding`` calls.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import embedding as ref

IdDist = Literal["mixed", "uniform", "high", "repeated"]

BOUNDARY_IDS = (32767, 32768, 65535, 65536)
"""Where int16 / uint16 index arithmetic wraps."""


class EmbeddingCase(CaseBase):
    """out[t] = table[ids[t]] with table [vocab, hidden]."""

    tokens: int = Field(ge=1, description="Number of ids (T).")
    vocab: int = Field(ge=1, description="Rows of the table (V), e.g. 151936 for Qwen.")
    hidden: int = Field(ge=1, description="Row length (H).")
    ids: IdDist = Field(default="mixed", description="How ids are drawn.")

    @model_validator(mode="after")
    def _table_size(self) -> EmbeddingCase:
        # The reference holds a float64 copy of the table: keep it under ~2 GiB.
        if self.vocab * self.hidden > 2**28:
            raise ValueError(f"table {self.vocab}×{self.hidden} is too large for the float64 reference"
                             f" (vocab × hidden must be ≤ {2**28}); shrink hidden, keep the vocabulary")
        return self

    def work(self) -> float:
        return float(self.vocab * self.hidden + self.tokens * self.hidden)

    def scaled(self, factor: float) -> EmbeddingCase:
        # The vocabulary size is the point (large ids); shrink the row length, then the ids.
        hidden = max(min(self.hidden, 8), int(self.hidden * factor))
        rest = factor * self.hidden / hidden
        return self.model_copy(update={"hidden": hidden, "tokens": max(1, int(self.tokens * min(1.0, rest)))})


def make_ids(case: EmbeddingCase, gen: torch.Generator) -> torch.Tensor:
    """int64 ids in [0, vocab) following ``case.ids``."""
    v, t = case.vocab, case.tokens
    if case.ids == "high":
        ids = v - 1 - torch.randint(0, min(v, 64), (t,), generator=gen)
        ids[0] = v - 1
        return ids
    if case.ids == "repeated":
        pool = torch.tensor([v - 1, 0, v // 2])
        return pool[torch.randint(0, len(pool), (t,), generator=gen)]
    ids = torch.randint(0, v, (t,), generator=gen)
    if case.ids == "mixed":
        boundary = [v - 1, 0, v - 1] + [i for i in BOUNDARY_IDS if i < v]
        n = min(t, len(boundary))
        ids[:n] = torch.tensor(boundary[:n])
    return ids


def _inputs(case: EmbeddingCase, dtype: str, gen: torch.Generator) -> OpInputs:
    ids = make_ids(case, gen)
    # Random normal rows: every row differs from every other, so a wrong row cannot match.
    table = torch.randn(case.vocab, case.hidden, generator=gen, dtype=torch.float32).to(torch_dtype(dtype))
    return OpInputs({"ids": ids, "table": table},
                    notes={"ids": case.ids, "max_id": int(ids.max()), "distinct_ids": int(ids.unique().numel())})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


OPS = [
    OpDef(
        name="embedding", family="embedding", description="Embedding lookup: out[t] = table[ids[t]] (exact).",
        signature="embedding(ids: [T] int64, table: [V, H]) -> out: [T, H] (table's dtype)",
        case_model=EmbeddingCase, make_inputs=_inputs, reference=ref.embedding, native=embedding,
        outputs=("out",), tolerance=("exact",),
    ),
]
