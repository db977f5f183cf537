"""Planted Mamba2 defects, each a wrapper around a correct implementation of the op (the torch
provider's function or the vLLM adapter), so the same defect can be planted on either side:
tests/steps/ops/test_mamba.py and benchmarks/family_mamba_ops.py use them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Fn = Callable[..., Any]


# ------------------------------------------------------------------ selective_state_update


def ssu_state_not_carried(base: Fn, *, zero: bool = False) -> Fn:
    """Every decode step starts again from the request's first state (or from zero)."""
    def op(state: torch.Tensor, x: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ys, last = [], state
        for t in range(x.shape[0]):
            step_kw = {k: (v[t:t + 1] if k in ("dt", "B", "C", "z") and v is not None else v) for k, v in kw.items()}
            start = torch.zeros_like(state) if zero else state.clone()
            y, last = base(state=start, x=x[t:t + 1], **step_kw)
            ys.append(y)
        return torch.cat(ys), last
    return op


def with_args(base: Fn, **override: Any) -> Fn:
    """The op called with some arguments replaced: dt_bias zero (ignored), dt_softplus False
    (softplus skipped), D zero (skip connection dropped), z None (gate not applied)."""
    def op(**kw: Any) -> Any:
        for name, value in override.items():
            kw[name] = value(kw[name]) if callable(value) else value
        return base(**kw)
    return op


def sigmoid_gate(base: Fn, out_index: int = 0) -> Fn:
    """The gate applied as sigmoid(z) instead of silu(z)."""
    def op(**kw: Any) -> tuple[torch.Tensor, ...]:
        z = kw.pop("z")
        outs = list(base(z=None, **kw))
        outs[out_index] = (outs[out_index].float() * torch.sigmoid(z.float())).to(outs[out_index].dtype)
        return tuple(outs)
    return op


# ------------------------------------------------------------------ causal convolution


def conv_rolled_wrong_way(base: Fn) -> Fn:
    """The decode state shifted towards the newest end: the new sample lands first and the
    newest old one is dropped (torch.roll with the wrong sign)."""
    def op(x: torch.Tensor, conv_state: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        outs, state = [], conv_state.clone()
        for t in range(x.shape[0]):
            out, _ = base(x=x[t:t + 1], conv_state=state.clone(), **kw)
            outs.append(out)
            state = torch.cat([x[t].unsqueeze(-1), state[..., :-1]], dim=-1)
        return torch.cat(outs), state
    return op


def conv_update_not_carried(base: Fn) -> Fn:
    """Every decode step reads the request's first convolution state."""
    def op(x: torch.Tensor, conv_state: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        results = [base(x=x[t:t + 1], conv_state=conv_state.clone(), **kw) for t in range(x.shape[0])]
        return torch.cat([r[0] for r in results]), results[-1][1]
    return op


def taps_reversed(base: Fn) -> Fn:
    """The convolution's taps in reverse order (weight[:, W-1] applied to the oldest sample)."""
    return with_args(base, weight=lambda w: w.flip(-1).contiguous())


def conv_fwd_final_state_reversed(base: Fn) -> Fn:
    """The prefill's final state written in reverse sample order."""
    def op(**kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, states = base(**kw)
        return out, states.flip(-1)
    return op


# ------------------------------------------------------------------ ssd_chunk_scan


def ssd_state_not_passed_between_chunks(base: Fn) -> Fn:
    """Every chunk of a sequence starts from the sequence's initial state, not from where the
    previous chunk ended."""
    def op(*, initial_states: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int, **kw: Any) -> Any:
        bounds, owner = [0], []
        cu = cu_seqlens.tolist()
        for s in range(len(cu) - 1):
            for start in range(cu[s], cu[s + 1], chunk_size):
                bounds.append(min(start + chunk_size, cu[s + 1]))
                owner.append(s)
        out, final = base(initial_states=initial_states[owner].contiguous(), chunk_size=chunk_size,
                          cu_seqlens=torch.tensor(bounds, dtype=cu_seqlens.dtype), **kw)
        last = [max(i for i, o in enumerate(owner) if o == s) for s in range(len(cu) - 1)]
        return out, final[last]
    return op


def _zero(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t)


def _never(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t, dtype=torch.bool)


SSU_DEFECTS: dict[str, Callable[[Fn], Fn]] = {
    "state reset to the first state each step": ssu_state_not_carried,
    "state reset to zero each step": lambda f: ssu_state_not_carried(f, zero=True),
    "dt_bias ignored": lambda f: with_args(f, dt_bias=_zero),
    "softplus skipped": lambda f: with_args(f, dt_softplus=False),
    "D skip connection dropped": lambda f: with_args(f, D=_zero),
    "z gate not applied": lambda f: with_args(f, z=None),
    "z gate as sigmoid": sigmoid_gate,
}
CONV_UPDATE_DEFECTS: dict[str, Callable[[Fn], Fn]] = {
    "conv state rolled the wrong way": conv_rolled_wrong_way,
    "conv state not carried": conv_update_not_carried,
    "conv taps reversed": taps_reversed,
}
CONV_FWD_DEFECTS: dict[str, Callable[[Fn], Fn]] = {
    "conv taps reversed": taps_reversed,
    "initial state ignored": lambda f: with_args(f, has_initial_state=_never),
    "final state reversed": conv_fwd_final_state_reversed,
}
SSD_DEFECTS: dict[str, Callable[[Fn], Fn]] = {
    "dt_bias ignored": lambda f: with_args(f, dt_bias=_zero),
    "softplus skipped": lambda f: with_args(f, dt_softplus=False),
    "D skip connection dropped": lambda f: with_args(f, D=_zero),
    "z gate as sigmoid": sigmoid_gate,
    "initial state ignored": lambda f: with_args(f, initial_states=_zero),
    "state not passed between chunks": ssd_state_not_passed_between_chunks,
}
DEFECTS: dict[str, dict[str, Callable[[Fn], Fn]]] = {
    "selective_state_update": SSU_DEFECTS, "causal_conv1d_update": CONV_UPDATE_DEFECTS,
    "causal_conv1d_fwd": CONV_FWD_DEFECTS, "ssd_chunk_scan": SSD_DEFECTS,
}
"""Op → defect name → wrapper planting it."""
