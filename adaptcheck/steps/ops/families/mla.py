"""MLA family: DeepSeek-V2/V3 multi-head latent attention, paged decode (absorbed) and causal prefill.

MLA caches per token one normalized latent ``kv_c`` (``kv_lora_rank`` L wide) and one rotary key
``k_pe`` (R wide, shared by the heads); ``kv_b_proj [N, P+V, L]`` turns the latent into each head's
no-rope key (rows ``0..P-1``, W_UK) and value (rows ``P..``, W_UV). The logit is
``scale · (q_nope·k_nope + q_pe·k_pe)`` with ``scale = 1/sqrt(P + R)`` (DeepSeek's
``qk_head_dim ** -0.5``, which vLLM's DeepseekV2 attention passes to its MLA layer; YaRN models
multiply it by an mscale², so the scale is an argument, never derived from a head size).

* ``mla_decode``: one query per sequence against a paged latent cache, in the absorbed form
  vLLM's MLA layer runs (``q_nope`` projected into latent space by W_UK, attention over the
  ``[kv_c, k_pe]`` cache shared by all heads, the latent output projected by W_UV).
* ``mla_prefill``: the non-absorbed form (keys and values expanded per head through kv_b_proj,
  causal attention with the rope key broadcast over the heads).

What goes wrong: the two halves of kv_b_proj swapped (W_UK where W_UV belongs), the rope term
dropped, the scale taken from another head size (``1/sqrt(kv_lora_rank)``, ``1/sqrt(P)``, or the
576-wide absorbed head), the causal mask missing, and the last, partial cache block ignored. The
inputs expose these: logits of a chosen spread (``logit_std``, q scaled for it) with a third of
their variance from the rope term (R/(P+R)), sequence lengths that end inside a block, length-1
sequences (a decode that reads only a partial block), and cache slots past each sequence's length
and in unused blocks filled with latents ``GARBAGE_STD`` times the real spread, so that reading
them dominates the output.

The torch implementations (``native``) are what a model runs without custom kernels: the
projections in the model dtype (``F.linear`` / ``einsum``) and ``scaled_dot_product_attention``
(fp32 softmax inside); the decode gathers the paged cache through the block tables first.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.families.attention import ELEMENT_COST, PagedBlocks, draw_seq_lens
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import mla as ref

GARBAGE_STD = 8.0
"""Latents and rope keys that must never be read are drawn this many times wider than the real ones."""


class MlaDims(CaseBase):
    """Head layout of an MLA layer (defaults: DeepSeek-V2/V3 except the head count) and its logits."""

    num_heads: int = Field(default=16, ge=1, description="Attention heads N (16: DeepSeek-V2-Lite, 128: V3).")
    kv_lora_rank: int = Field(default=512, ge=1, description="Latent width L (kv_c).")
    qk_nope_head_dim: int = Field(default=128, ge=1, description="No-rope query/key head dim P.")
    qk_rope_head_dim: int = Field(default=64, ge=1, description="Rope query/key head dim R (k_pe shared by heads).")
    v_head_dim: int = Field(default=128, ge=1, description="Value head dim V.")
    scale: float | None = Field(default=None, gt=0, description="Softmax scale; None: 1/sqrt(P + R), DeepSeek's.")
    logit_std: float = Field(default=1.0, gt=0, description="Spread of the logits (q is scaled for it).")

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)

    @property
    def q_gain(self) -> float:
        """Factor on N(0, 1) queries so that the logits (keys ~N(0, 1) per element) have ``logit_std``."""
        return self.logit_std / (self.softmax_scale * math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim))

    def head_work(self) -> float:
        """Flops per (query, key) pair over all heads: q·k over P+R (or L+R absorbed) and p·v."""
        return 2.0 * self.num_heads * (self.kv_lora_rank + self.qk_rope_head_dim + self.kv_lora_rank)

    def notes(self) -> dict[str, object]:
        return {"num_heads": self.num_heads, "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
                "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim,
                "scale": self.softmax_scale, "logit_std": self.logit_std}


class MlaPrefillCase(MlaDims):
    """Causal MLA over one sequence of ``num_tokens`` (keys and values expanded per head)."""

    num_tokens: int = Field(ge=1, description="Sequence length T.")

    def work(self) -> float:
        expand = 2.0 * self.num_tokens * self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        pairs = self.num_tokens * (self.num_tokens + 1) / 2
        elements = self.num_tokens * (self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
                                      + self.kv_lora_rank)
        return expand + pairs * self.head_work() + ELEMENT_COST * elements

    def scaled(self, factor: float) -> MlaPrefillCase:
        # Heads first (the layer's widths define the kernel), then the sequence (work ~ T to T²).
        factor = max(factor, 0.0)
        heads = max(1, int(self.num_heads * min(1.0, factor)))
        rest = min(1.0, factor * self.num_heads / heads)
        return self.model_copy(update={"num_heads": heads, "num_tokens": max(1, int(self.num_tokens * math.sqrt(rest)))})


class MlaDecodeCase(PagedBlocks, MlaDims):
    """One query per sequence against a paged latent cache (vLLM's CPU kernel: L + R = 576, block 16)."""

    batch: int = Field(ge=1, description="Sequences B.")
    max_seq_len: int = Field(ge=1, description="Longest sequence S; sequence 0 has this length, sequence 1 (if B > 1) "
                                               "length 1, the others random in [1, S].")

    def work(self) -> float:
        absorb = 2.0 * self.batch * self.num_heads * self.kv_lora_rank * (self.qk_nope_head_dim + self.v_head_dim)
        cache = self.total_blocks * self.block_size * (self.kv_lora_rank + self.qk_rope_head_dim)
        return absorb + self.batch * self.max_seq_len * self.head_work() + ELEMENT_COST * cache

    def scaled(self, factor: float) -> MlaDecodeCase:
        # Fewer sequences, then fewer heads, then shorter ones; widths and block size stay.
        factor = max(factor, 0.0)
        batch = max(1, int(self.batch * min(1.0, factor)))
        rest = min(1.0, factor * self.batch / batch)
        heads = max(1, int(self.num_heads * rest))
        rest = min(1.0, rest * self.num_heads / heads)
        update: dict[str, int | None] = {"batch": batch, "num_heads": heads, "max_seq_len": max(1, int(self.max_seq_len * rest))}
        if self.num_blocks is not None:
            update["num_blocks"] = None  # sized for the old batch; the default fits the new one
        return self.model_copy(update=update)


def _normal(shape: tuple[int, ...], gen: torch.Generator, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _queries_and_weight(case: MlaDims, tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Float32 q_nope [T, N, P], q_pe [T, N, R] and kv_b_proj [N, P+V, L] (k_nope, v ~N(0, 1) from a unit latent)."""
    n, p, r = case.num_heads, case.qk_nope_head_dim, case.qk_rope_head_dim
    q_nope = _normal((tokens, n, p), gen, case.q_gain)
    q_pe = _normal((tokens, n, r), gen, case.q_gain)
    kv_b_proj = _normal((n, p + case.v_head_dim, case.kv_lora_rank), gen, 1.0 / math.sqrt(case.kv_lora_rank))
    return q_nope, q_pe, kv_b_proj


def _prefill_inputs(case: MlaPrefillCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    q_nope, q_pe, kv_b_proj = _queries_and_weight(case, case.num_tokens, gen)
    kv_c = _normal((case.num_tokens, case.kv_lora_rank), gen)  # RMS-normalized latent: unit spread
    k_pe = _normal((case.num_tokens, case.qk_rope_head_dim), gen)
    return OpInputs({"q_nope": q_nope.to(tdt), "q_pe": q_pe.to(tdt), "kv_c": kv_c.to(tdt), "k_pe": k_pe.to(tdt),
                     "kv_b_proj": kv_b_proj.to(tdt), "scale": case.softmax_scale}, notes=case.notes())


def _decode_inputs(case: MlaDecodeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    bs, nb, per_seq = case.block_size, case.total_blocks, case.blocks_per_seq
    q_nope, q_pe, kv_b_proj = _queries_and_weight(case, case.batch, gen)
    seq_lens = draw_seq_lens(case.batch, case.max_seq_len, gen)
    # Garbage everywhere first: unused blocks and the tail of each last block keep it.
    kv_c_cache = _normal((nb, bs, case.kv_lora_rank), gen, GARBAGE_STD)
    k_pe_cache = _normal((nb, bs, case.qk_rope_head_dim), gen, GARBAGE_STD)
    # Distinct blocks in shuffled order; the highest block number is sequence 0's first block.
    order = torch.randperm(nb, generator=gen)
    order = torch.cat((torch.tensor([nb - 1]), order[order != nb - 1]))
    block_tables = torch.empty((case.batch, per_seq), dtype=torch.int64)
    used = 0
    for b in range(case.batch):
        length = int(seq_lens[b])
        need = -(-length // bs)
        block_tables[b, :need] = order[used:used + need]
        used += need
        # Entries past the sequence are valid block numbers that must not be read.
        block_tables[b, need:] = torch.randint(0, nb, (per_seq - need,), generator=gen)
        tok = torch.arange(length)
        blocks = block_tables[b, tok // bs]
        kv_c_cache[blocks, tok % bs] = _normal((length, case.kv_lora_rank), gen)
        k_pe_cache[blocks, tok % bs] = _normal((length, case.qk_rope_head_dim), gen)
    partial = [int(n) % bs for n in seq_lens.tolist()]
    return OpInputs({"q_nope": q_nope.to(tdt), "q_pe": q_pe.to(tdt), "kv_c_cache": kv_c_cache.to(tdt),
                     "k_pe_cache": k_pe_cache.to(tdt), "kv_b_proj": kv_b_proj.to(tdt), "block_tables": block_tables,
                     "seq_lens": seq_lens, "scale": case.softmax_scale},
                    notes={**case.notes(), "seq_lens": seq_lens.tolist()[:16], "block_size": bs, "num_blocks": nb,
                           "sequences_ending_in_a_partial_block": sum(1 for x in partial if x),
                           "garbage_after_seq_len": f"latents x{GARBAGE_STD}"})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                kv_b_proj: torch.Tensor, scale: float) -> torch.Tensor:
    tokens, heads, nope = q_nope.shape
    width = kv_b_proj.shape[1]
    # kv_b_proj as the model's nn.Linear: [N·(P+V), L] weight, output viewed per head.
    kv = F.linear(kv_c, kv_b_proj.reshape(heads * width, -1)).view(tokens, heads, width)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, heads, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, scale=scale)
    return out.transpose(0, 1).contiguous()


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_cache: torch.Tensor, k_pe_cache: torch.Tensor,
               kv_b_proj: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    batch, max_blocks = block_tables.shape
    heads, nope = q_nope.shape[1], q_nope.shape[2]
    slots = max_blocks * kv_c_cache.shape[1]
    # Token i of sequence b at index i: [B, max_blocks, block_size, ·] flattened.
    kv_c = kv_c_cache[block_tables].reshape(batch, slots, -1)
    k_pe = k_pe_cache[block_tables].reshape(batch, slots, -1)
    # Absorb W_UK into the query: one [L + R]-wide key per token, shared by every head (MQA).
    # (N, B, P) x (N, P, L) batched over heads: an einsum here takes seconds in bf16 on some CPUs.
    q_latent = torch.bmm(q_nope.transpose(0, 1), kv_b_proj[:, :nope]).transpose(0, 1)
    q = torch.cat((q_latent, q_pe), dim=-1)[:, :, None, :]  # [B, N, 1, L+R]
    k = torch.cat((kv_c, k_pe), dim=-1)[:, None].expand(-1, heads, -1, -1)
    v = kv_c[:, None].expand(-1, heads, -1, -1)
    visible = torch.arange(slots, device=kv_c.device)[None, :] < seq_lens[:, None]
    latent = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None, None, :], scale=scale)[:, :, 0]
    # Up-project the latent output with W_UV: (N, B, L) x (N, L, V) -> (B, N, V).
    return torch.bmm(latent.transpose(0, 1), kv_b_proj[:, nope:].transpose(1, 2)).transpose(0, 1).contiguous()


OPS = [
    OpDef(
        name="mla_decode", family="mla",
        description="DeepSeek MLA decode, absorbed form: one query per sequence against a paged latent cache "
                    "(kv_c, k_pe), W_UK folded into the query, the latent output up-projected by W_UV.",
        signature=("mla_decode(q_nope: [B, N, P], q_pe: [B, N, R], kv_c_cache: [num_blocks, block_size, L], "
                   "k_pe_cache: [num_blocks, block_size, R], kv_b_proj: [N, P+V, L], block_tables: [B, max_blocks] "
                   "int64, seq_lens: [B] int64, scale: float) -> out: [B, N, V]; kv_b_proj rows per head: first P "
                   "W_UK (k_nope), next V W_UV (v); logit = scale·(q_nope·k_nope + q_pe·k_pe); token i of "
                   "sequence b at block block_tables[b, i // block_size], offset i % block_size"),
        case_model=MlaDecodeCase, make_inputs=_decode_inputs, reference=ref.mla_decode, native=mla_decode,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="mla_prefill", family="mla",
        description="DeepSeek MLA prefill, non-absorbed: k_nope and v from kv_c through kv_b_proj, the rope key "
                    "shared by the heads, causal attention over one sequence.",
        signature=("mla_prefill(q_nope: [T, N, P], q_pe: [T, N, R], kv_c: [T, L], k_pe: [T, R], kv_b_proj: "
                   "[N, P+V, L], scale: float) -> out: [T, N, V]; causal; kv_b_proj rows per head: first P W_UK "
                   "(k_nope), next V W_UV (v); logit = scale·(q_nope·k_nope + q_pe·k_pe)"),
        case_model=MlaPrefillCase, make_inputs=_prefill_inputs, reference=ref.mla_prefill, native=mla_prefill,
        outputs=("out",), tolerance=("reduction",),
    ),
]
