"""Mamba family: the Mamba2 state-space layer of hybrid models (Bamba, NemotronH, Granite-4):
the decode state update, the causal depthwise convolution in front of it (decode and prefill)
and the SSD prefill scan.

What goes wrong, and the inputs that expose it:

* the SSM state not carried from one decode step to the next (reset to zero or to the state
  the request started with): ``steps`` > 1 applies the update several times in a row, so the
  second step's output depends on the first step's state;
* dt_bias ignored, softplus skipped (step sizes dt + dt_bias span [-2, 2], where softplus(v)
  and v differ a lot), the D skip connection dropped (D in [0.5, 1.5]), the z gate not applied
  or applied as sigmoid instead of silu (``gate``);
* softplus overflowing where it is computed as log(1 + e^v) in fp16: ``dt_range: threshold``
  puts dt + dt_bias around 20, where kernels switch to softplus(v) = v;
* B/C groups mapped to the wrong heads (``groups`` > 1);
* the convolution state rolled the wrong way or its taps reversed (width 4: a state of three
  samples and random taps, so neither mistake is a symmetry), prefill ignoring a sequence's
  initial state or reading it where there is none (the slots of sequences without one hold
  random values), sequences shorter than the state (its final state keeps initial samples),
  and packed sequences leaking state into each other;
* the chunked SSD scan losing the state across chunk boundaries (sequences longer than
  ``chunk_size``) or ignoring the initial state.

The torch implementations (``native``) are what a model without these kernels runs (the
Mamba2 torch path of transformers): the recurrence in float32 for decode, F.conv1d over the
state and the tokens for the convolution, and the chunked SSD form for prefill
(``mamba_ssd.py``); outputs are cast back to the input dtype, states to the state's dtype.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.families.mamba_ssd import ssd_chunk_scan
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import mamba as ref

DtRange = Literal["normal", "threshold"]


def _narrower(head_dim: int, factor: float) -> int:
    """head_dim shrunk by ``factor`` but not below 8 (nor above what it was)."""
    return min(head_dim, max(8, int(head_dim * min(1.0, factor))))


class _HeadsCase(CaseBase):
    """Shapes shared by the SSM ops: heads H of head_dim P, state size N, G groups of B/C."""

    heads: int = Field(ge=1, description="SSM heads H.")
    head_dim: int = Field(ge=1, description="Head dimension P.")
    state_size: int = Field(ge=1, description="SSM state size N (d_state).")
    groups: int = Field(default=1, ge=1, description="B/C groups G (head h reads group h // (H/G)).")
    gate: bool = Field(default=False, description="Pass a gate z: y · silu(z).")
    dt_softplus: bool = Field(default=True, description="Step size softplus(dt + dt_bias) (Mamba2), else dt + dt_bias.")
    dt_range: DtRange = Field(default="normal", description="normal: dt + dt_bias in [-2, 2]; threshold: around 20,"
                              " where kernels switch softplus to the identity (and fp16 e^v overflows).")
    state_fp32: bool = Field(default=False, description="SSM state in float32 (mamba_ssm_cache_dtype float32) "
                             "instead of the checked dtype.")

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> _HeadsCase:
        if self.heads % self.groups:
            raise ValueError(f"heads {self.heads} not divisible by groups {self.groups}")
        return self


class SsuCase(_HeadsCase):
    """T decode steps of the SSM update on a batch, the state carried from step to step."""

    batch: int = Field(ge=1, description="Requests Bt (one token each per step).")
    steps: int = Field(default=1, ge=1, description="Consecutive decode steps T carrying the state.")

    def work(self) -> float:
        return 8.0 * self.steps * self.batch * self.heads * self.head_dim * self.state_size

    def scaled(self, factor: float) -> SsuCase:
        # Fewer requests, then a narrower head; the steps (what carries the state), the heads,
        # groups and state size (what the kernel indexes by) stay.
        batch = max(1, int(self.batch * min(1.0, factor)))
        return self.model_copy(update={"batch": batch, "head_dim": _narrower(self.head_dim, factor * self.batch / batch)})


class ScanCase(_HeadsCase):
    """Prefill scan of sequences packed along the token axis (vLLM's varlen layout)."""

    seq_lens: list[int] = Field(min_length=1, description="Tokens of each packed sequence.")
    chunk_size: int = Field(default=256, ge=1, description="Chunk length of the chunked SSD form.")
    initial_state: bool = Field(default=True, description="Sequences start from a given state (else zero).")

    def work(self) -> float:
        return 8.0 * sum(self.seq_lens) * self.heads * self.head_dim * self.state_size

    def scaled(self, factor: float) -> ScanCase:
        # A narrower head first, then shorter sequences; a sequence that spans several chunks
        # keeps at least two (chunk_size + 1 tokens): the chunk boundary is the point.
        head_dim = _narrower(self.head_dim, factor)
        rest = min(1.0, factor * self.head_dim / head_dim)
        lens = [max(self.chunk_size + 1 if n > self.chunk_size else 1, int(n * rest)) for n in self.seq_lens]
        return self.model_copy(update={"head_dim": head_dim, "seq_lens": lens})


class ConvCase(CaseBase):
    """Causal depthwise convolution over D channels of width W (Mamba2's conv1d, W = 4)."""

    dim: int = Field(ge=1, description="Channels D (x, B and C of the layer together).")
    width: int = Field(default=4, ge=2, description="Kernel width W (the state keeps W-1 samples).")
    silu: bool = Field(default=True, description="SiLU activation after the convolution.")


class ConvUpdateCase(ConvCase):
    """T decode steps on a batch, the convolution state carried from step to step."""

    batch: int = Field(ge=1, description="Requests Bt.")
    steps: int = Field(default=1, ge=1, description="Consecutive decode steps T.")

    def work(self) -> float:
        return 2.0 * self.steps * self.batch * self.dim * self.width


class ConvFwdCase(ConvCase):
    """Prefill of packed sequences from their initial convolution states."""

    seq_lens: list[int] = Field(min_length=1, description="Tokens of each packed sequence.")
    initial_state: Literal["none", "all", "mixed"] = Field(
        default="mixed", description="Which sequences start from a state (mixed: every other one).")

    def work(self) -> float:
        return 2.0 * sum(self.seq_lens) * self.dim * self.width


# ------------------------------------------------------------------------------ inputs


def _uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def _ssm_params(case: _HeadsCase, lead: tuple[int, ...], dtype: str,
                gen: torch.Generator) -> tuple[dict[str, torch.Tensor | None], dict[str, object]]:
    """x, dt, A, B, C, D, z, dt_bias for tokens shaped ``lead`` (the step sizes kept well apart
    from zero, so a dropped term always moves the output)."""
    tdt = torch_dtype(dtype)
    h, p, n, g = case.heads, case.head_dim, case.state_size, case.groups
    if case.dt_range == "threshold":
        # dt + dt_bias in [16, 24], across the usual switch at 20; a slow decay (|A| small) so the
        # state still carries over from one token to the next.
        dt_bias, dt, a = _uniform((h,), 19.0, 21.0, gen), _uniform((*lead, h), -3.0, 3.0, gen), (0.02, 0.1)
    elif case.dt_softplus:
        dt_bias, dt, a = _uniform((h,), -1.0, 1.0, gen), _uniform((*lead, h), -1.0, 1.0, gen), (0.5, 1.5)
    else:  # the step size is dt + dt_bias itself: keep it positive
        dt_bias, dt, a = _uniform((h,), 0.1, 0.5, gen), _uniform((*lead, h), 0.1, 1.0, gen), (0.5, 1.5)
    args: dict[str, torch.Tensor | None] = {
        "x": torch.randn((*lead, h, p), generator=gen).to(tdt),
        "dt": dt.to(tdt),
        "A": -_uniform((h,), *a, gen),  # float32, as Mamba2 layers hold A
        "B": torch.randn((*lead, g, n), generator=gen).to(tdt),
        # 1/sqrt(N) keeps C · state O(1) whatever the state size.
        "C": (torch.randn((*lead, g, n), generator=gen) / math.sqrt(n)).to(tdt),
        "D": _uniform((h,), 0.5, 1.5, gen).to(tdt),
        "z": torch.randn((*lead, h, p), generator=gen).to(tdt) if case.gate else None,
        "dt_bias": dt_bias.to(tdt),
    }
    assert args["dt"] is not None and args["dt_bias"] is not None
    step = args["dt"].double() + args["dt_bias"].double()
    if case.dt_softplus:
        step = F.softplus(step)
    notes: dict[str, object] = {"step_size_min": float(step.min()), "step_size_max": float(step.max()),
                                "dt_plus_bias_max": float((args["dt"].double() + args["dt_bias"].double()).max())}
    return args, notes


def _ssu_inputs(case: SsuCase, dtype: str, gen: torch.Generator) -> OpInputs:
    args, notes = _ssm_params(case, (case.steps, case.batch), dtype, gen)
    sdt = torch.float32 if case.state_fp32 else torch_dtype(dtype)
    state = (0.5 * torch.randn(case.batch, case.heads, case.head_dim, case.state_size, generator=gen)).to(sdt)
    notes.update({"steps": case.steps, "state_dtype": str(sdt).removeprefix("torch.")})
    return OpInputs({"state": state, **args, "dt_softplus": case.dt_softplus}, notes=notes)


def _cu_seqlens(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _scan_inputs(case: ScanCase, dtype: str, gen: torch.Generator) -> OpInputs:
    total = sum(case.seq_lens)
    args, notes = _ssm_params(case, (total,), dtype, gen)
    sdt = torch.float32 if case.state_fp32 else torch_dtype(dtype)
    shape = (len(case.seq_lens), case.heads, case.head_dim, case.state_size)
    init = (0.5 * torch.randn(shape, generator=gen)) if case.initial_state else torch.zeros(shape)
    notes.update({"chunks": [math.ceil(n / case.chunk_size) for n in case.seq_lens],
                  "state_dtype": str(sdt).removeprefix("torch.")})
    return OpInputs({**args, "initial_states": init.to(sdt), "cu_seqlens": _cu_seqlens(case.seq_lens),
                     "chunk_size": case.chunk_size, "dt_softplus": case.dt_softplus}, notes=notes)


def _conv_weights(case: ConvCase, tdt: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # Random taps (no symmetry, so reversed taps change the output); 1/sqrt(W) keeps it O(1).
    weight = torch.randn(case.dim, case.width, generator=gen) / math.sqrt(case.width)
    return weight.to(tdt), (0.1 * torch.randn(case.dim, generator=gen)).to(tdt)


def _conv_update_inputs(case: ConvUpdateCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    weight, bias = _conv_weights(case, tdt, gen)
    return OpInputs({
        "x": torch.randn(case.steps, case.batch, case.dim, generator=gen).to(tdt),
        "conv_state": torch.randn(case.batch, case.dim, case.width - 1, generator=gen).to(tdt),
        "weight": weight, "bias": bias, "silu_activation": case.silu,
    }, notes={"steps": case.steps})


def _conv_fwd_inputs(case: ConvFwdCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    weight, bias = _conv_weights(case, tdt, gen)
    s = len(case.seq_lens)
    has = {"none": [False] * s, "all": [True] * s, "mixed": [i % 2 == 0 for i in range(s)]}[case.initial_state]
    # Slots of sequences without a state hold random values too: a kernel must not read them.
    states = torch.randn(s, case.dim, case.width - 1, generator=gen).to(tdt)
    return OpInputs({
        "x": torch.randn(case.dim, sum(case.seq_lens), generator=gen).to(tdt),
        "weight": weight, "bias": bias, "conv_states": states, "query_start_loc": _cu_seqlens(case.seq_lens),
        "has_initial_state": torch.tensor(has), "silu_activation": case.silu,
    }, notes={"has_initial_state": has, "shorter_than_state": sum(n < case.width - 1 for n in case.seq_lens)})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def _step_size(dt: torch.Tensor, dt_bias: torch.Tensor, dt_softplus: bool) -> torch.Tensor:
    d = dt.float() + dt_bias.float()
    return F.softplus(d) if dt_softplus else d


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor | None,
                           dt_bias: torch.Tensor, dt_softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rep = x.shape[-2] // B.shape[-2]
    s = state.float()
    ys = []
    for t in range(x.shape[0]):
        step = _step_size(dt[t], dt_bias, dt_softplus)  # [Bt, H]
        bh = B[t].float().repeat_interleave(rep, dim=-2)  # [Bt, H, N]
        ch = C[t].float().repeat_interleave(rep, dim=-2)
        decay = torch.exp(step * A.float())[..., None, None]
        s = decay * s + (step[..., None] * x[t].float())[..., None] * bh[..., None, :]
        y = (s @ ch[..., None]).squeeze(-1) + D.float()[:, None] * x[t].float()
        if z is not None:
            y = y * F.silu(z[t].float())
        # A served model stores the state in its cache dtype after every step.
        s = s.to(state.dtype).float()
        ys.append(y.to(x.dtype))
    return torch.stack(ys), s.to(state.dtype)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         silu_activation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    state = conv_state.clone()
    outs = []
    for t in range(x.shape[0]):
        # Shift the oldest sample out, the new one in at the end, then one dot product per channel.
        window = torch.cat([state, x[t].unsqueeze(-1)], dim=-1)
        out = (window.float() * weight.float()).sum(-1) + bias.float()
        outs.append((F.silu(out) if silu_activation else out).to(x.dtype))
        state = window[..., 1:]
    return torch.stack(outs), state.contiguous()


def causal_conv1d_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, conv_states: torch.Tensor,
                      query_start_loc: torch.Tensor, has_initial_state: torch.Tensor,
                      silu_activation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    keep = weight.shape[1] - 1
    out = torch.empty_like(x)
    final = conv_states.clone()
    bounds = query_start_loc.tolist()
    for s in range(len(bounds) - 1):
        seq = x[:, bounds[s]:bounds[s + 1]]
        init = conv_states[s] if bool(has_initial_state[s]) else torch.zeros_like(conv_states[s])
        full = torch.cat([init, seq], dim=-1)
        y = F.conv1d(full.unsqueeze(0).float(), weight.float().unsqueeze(1), bias.float(), groups=x.shape[0])[0]
        out[:, bounds[s]:bounds[s + 1]] = (F.silu(y) if silu_activation else y).to(x.dtype)
        final[s] = full[:, full.shape[1] - keep:]
    return out, final


_SSM_SIG = ("A: [H] float32, D, dt_bias: [H], B, C: [..., G, N] (head h reads group h // (H/G)), z: [..., H, P] or"
            " None (y · silu(z)); step size softplus(dt + dt_bias) when dt_softplus")

OPS = [
    OpDef(
        name="selective_state_update", family="mamba",
        description="Mamba2 decode: T consecutive SSM state updates (state carried), y = C·state + D·x, gated by z.",
        signature=("selective_state_update(state: [Bt, H, P, N], x: [T, Bt, H, P], dt: [T, Bt, H], A, B, C, D, z,"
                   " dt_bias, dt_softplus: bool) -> (y: [T, Bt, H, P] (x's dtype), state: [Bt, H, P, N] after"
                   f" step T (state's dtype)); {_SSM_SIG}"),
        case_model=SsuCase, make_inputs=_ssu_inputs, reference=ref.selective_state_update,
        native=selective_state_update, outputs=("y", "state"), tolerance=("reduction", "reduction"), in_place=True,
    ),
    OpDef(
        name="causal_conv1d_update", family="mamba",
        description="Mamba2 decode convolution: T steps of a causal depthwise conv over a rolled state, optional SiLU.",
        signature=("causal_conv1d_update(x: [T, Bt, D], conv_state: [Bt, D, W-1] (oldest first), weight: [D, W],"
                   " bias: [D], silu_activation: bool) -> (out: [T, Bt, D], conv_state after step T); tap W-1"
                   " meets the newest sample"),
        case_model=ConvUpdateCase, make_inputs=_conv_update_inputs, reference=ref.causal_conv1d_update,
        native=causal_conv1d_update, outputs=("out", "conv_state"), tolerance=("reduction", "exact"), in_place=True,
    ),
    OpDef(
        name="causal_conv1d_fwd", family="mamba",
        description="Mamba2 prefill convolution over packed sequences from their initial states; final states.",
        signature=("causal_conv1d_fwd(x: [D, L], weight: [D, W], bias: [D], conv_states: [S, D, W-1],"
                   " query_start_loc: [S+1] int32, has_initial_state: [S] bool, silu_activation: bool) ->"
                   " (out: [D, L], conv_states: [S, D, W-1] (the last W-1 samples of state + sequence))"),
        case_model=ConvFwdCase, make_inputs=_conv_fwd_inputs, reference=ref.causal_conv1d_fwd,
        native=causal_conv1d_fwd, outputs=("out", "conv_states"), tolerance=("reduction", "exact"), in_place=True,
    ),
    OpDef(
        name="ssd_chunk_scan", family="mamba",
        description="Mamba2 prefill (SSD) over packed sequences from initial states: outputs and final states.",
        signature=("ssd_chunk_scan(x: [L, H, P], dt: [L, H], A, B, C, D, z, dt_bias, initial_states: [S, H, P, N],"
                   " cu_seqlens: [S+1] int32, chunk_size: int, dt_softplus: bool) -> (out: [L, H, P] (x's dtype),"
                   f" final_states: [S, H, P, N] (initial_states' dtype)); {_SSM_SIG}"),
        case_model=ScanCase, make_inputs=_scan_inputs, reference=ref.ssd_chunk_scan,
        native=ssd_chunk_scan, outputs=("out", "final_states"), tolerance=("reduction", "reduction"),
    ),
]
