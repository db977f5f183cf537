"""Step 3's Mamba2 ops through vLLM, called as vLLM's MambaMixer2 calls them: A, dt, dt_bias and
D expanded over the head dimension for the decode kernel (A in float32), states held in a cache
of slots addressed by index with slot 0 left as vLLM's null block, and the convolution state
in the layout vLLM allocates (``get_conv_state_layout``: (W-1, D) per slot by default, handed to
the kernels as a transposed view). The adapters only lay the catalog's arguments out that way
and read the results back; the rows of :data:`adaptcheck.frameworks.vllm_ops.VLLM_OPS` name what
each one calls (docs/ops.md, "The vllm provider").

On CPU the decode update and the decode convolution are compiled kernels
(``_C.selective_state_update_cpu``, ``_C.causal_conv1d_update_cpu_vec``), the prefill scan is
``_C.mamba_chunk_scan_fwd_cpu`` behind vLLM's Python wrapper, and the prefill convolution is
vLLM's torch code (``causal_conv1d_fn`` is ``causal_conv1d_fn_cpu``, F.conv1d per sequence):
``_C.causal_conv1d_fwd_cpu``, where a build has it, serves only the GatedDeltaNet layers'
packed weights, never Mamba2.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_MAMBA_OPS = "vllm.model_executor.layers.mamba.ops"


def _torch() -> Any:
    import torch

    return torch


def _null_block() -> int:
    return int(importlib.import_module("vllm.v1.attention.backends.utils").NULL_BLOCK_ID)


def _slots(n: int) -> torch.Tensor:
    """Cache slots 1..n: slot 0 is the null block, which the kernels skip (as vLLM's cache has it)."""
    torch = _torch()
    return torch.arange(1, n + 1, dtype=torch.int32)


def _in_cache(states: torch.Tensor) -> torch.Tensor:
    """A cache of n + 1 slots holding ``states`` (n of them) at slots 1..n; slot 0 holds NaN, so a
    kernel that reads the null block shows it."""
    cache = _torch().full((states.shape[0] + 1, *states.shape[1:]), float("nan"), dtype=states.dtype)
    cache[1:] = states
    return cache


def _conv_cache(states: torch.Tensor) -> torch.Tensor:
    """A conv-state cache in the layout vLLM allocates, as the [slots, D, W-1] view the kernels take."""
    layout = importlib.import_module("vllm.model_executor.layers.mamba.mamba_utils")
    if layout.is_conv_state_dim_first():
        return _in_cache(states.contiguous())
    # (W-1, D) per slot, D innermost; the mixer transposes it to (D, W-1) without a copy.
    return _in_cache(states.transpose(1, 2).contiguous()).transpose(1, 2)


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor | None,
                           dt_bias: torch.Tensor, dt_softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    ops = importlib.import_module("vllm._custom_ops")
    steps, batch, _, head_dim = x.shape
    n = state.shape[-1]
    cache = _in_cache(state)
    slots = _slots(batch)
    # MambaMixer2's decode path: per-head parameters expanded over head_dim, A in float32.
    a = A[:, None, None].expand(-1, head_dim, n).to(torch.float32)
    d = D[:, None].expand(-1, head_dim)
    bias = dt_bias[:, None].expand(-1, head_dim)
    ys = []
    for t in range(steps):
        out = torch.empty_like(x[t])
        # One call per decode step on the same cache: the kernel updates the slots in place.
        ops.selective_state_update_cpu(cache, x[t], dt[t][:, :, None].expand(-1, -1, head_dim), a, B[t], C[t], d,
                                       None if z is None else z[t], bias, bool(dt_softplus), slots, slots,
                                       _null_block(), out, None, None)
        ys.append(out)
    return torch.stack(ys), cache[1:].clone()


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         silu_activation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    conv = importlib.import_module(f"{_MAMBA_OPS}.causal_conv1d")
    view = _conv_cache(conv_state)
    slots = _slots(x.shape[1])
    outs = [conv.causal_conv1d_update(x[t].contiguous(), view, weight, bias, "silu" if silu_activation else None,
                                      conv_state_indices=slots)
            for t in range(x.shape[0])]
    return torch.stack(outs), view[1:].contiguous()


def causal_conv1d_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, conv_states: torch.Tensor,
                      query_start_loc: torch.Tensor, has_initial_state: torch.Tensor,
                      silu_activation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    conv = importlib.import_module(f"{_MAMBA_OPS}.causal_conv1d")
    view = _conv_cache(conv_states)
    # The mixer hands the kernel its [tokens, D] activations transposed: a [D, L] view.
    tokens_first = x.t().contiguous()
    out = conv.causal_conv1d_fn(tokens_first.t(), weight, bias, activation="silu" if silu_activation else None,
                                conv_states=view, has_initial_state=has_initial_state.to(torch.bool),
                                cache_indices=_slots(conv_states.shape[0]),
                                query_start_loc=query_start_loc.to(torch.int32))
    return out, view[1:].contiguous()


def _int32(values: list[int]) -> torch.Tensor:
    torch = _torch()
    return torch.tensor(values, dtype=torch.int32)


def _chunk_metadata(cu_seqlens: list[int], chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu_chunk_seqlens, last_chunk_indices, seq_idx) as vLLM's Mamba2 metadata builds them:
    every sequence cut into chunks of ``chunk`` tokens, no chunk spanning two sequences."""
    bounds: list[int] = [0]
    last: list[int] = []
    seq_idx: list[int] = []
    for s in range(len(cu_seqlens) - 1):
        for start in range(cu_seqlens[s], cu_seqlens[s + 1], chunk):
            bounds.append(min(start + chunk, cu_seqlens[s + 1]))
            seq_idx.append(s)
        last.append(len(bounds) - 2)
    return _int32(bounds), _int32(last), _int32(seq_idx)


def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor, z: torch.Tensor | None, dt_bias: torch.Tensor, initial_states: torch.Tensor,
                   cu_seqlens: torch.Tensor, chunk_size: int, dt_softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    ssd = importlib.import_module(f"{_MAMBA_OPS}.ssd_combined")
    cu = cu_seqlens.to(torch.int32)
    cu_chunks, last, seq_idx = _chunk_metadata(cu.tolist(), int(chunk_size))
    out = torch.empty_like(x)
    final = ssd.mamba_chunk_scan_combined_varlen(
        x, dt, A.to(torch.float32), B, C, chunk_size=int(chunk_size), cu_seqlens=cu, cu_chunk_seqlens=cu_chunks,
        last_chunk_indices=last, seq_idx=seq_idx, out=out, D=D, z=z, dt_bias=dt_bias,
        initial_states=initial_states, dt_softplus=bool(dt_softplus), dt_limit=(0.0, float("inf")),
        state_dtype=initial_states.dtype)
    return out, final


ADAPTERS: dict[str, Callable[..., Any]] = {
    "selective_state_update": selective_state_update,
    "causal_conv1d_update": causal_conv1d_update,
    "causal_conv1d_fwd": causal_conv1d_fwd,
    "ssd_chunk_scan": ssd_chunk_scan,
}
"""Catalog op → adapter; vllm_provider.ADAPTERS takes them in with one ``**`` line."""
