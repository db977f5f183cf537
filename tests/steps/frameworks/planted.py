"""Kernel defects planted in the model's real execution path, for step-4 tests.

Each adapter is the real transformers adapter whose ``generate``/``score`` run with one
defect switched on, through torch's dispatcher (``torch.library`` kernels registered for
the CPU key) or torch's public module hooks — the layers a vendor kernel or extension
plugs into. Ladders name them as ``framework: "tests.steps.frameworks.planted:NAME"``.

Why scoped to the adapter's calls: on a CPU-only machine the "device" is the CPU, the same
silicon whose torch kernels are the healthy control. A defect registered for the whole
process would break the control too and hide itself; switching it on only while the
device adapter computes is what a broken accelerator kernel looks like (the CPU kernels
stay correct). The float64 reference is never affected either way.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from adaptcheck.frameworks.base import Generation, GenRequest, Scored, ScoreRequest
from adaptcheck.frameworks.transformers_fw import TransformersFramework


class _Planted(TransformersFramework):
    """Runs ``generate`` and ``score`` inside :meth:`defect`."""

    def defect(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        with self.defect():
            return super().generate(requests)

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        with self.defect():
            return super().score(requests)


@contextlib.contextmanager
def _aten_cpu_kernel(op: str, fn: Any) -> Iterator[None]:
    """``fn`` replaces aten ``op``'s CPU kernel until the block ends (the original returns)."""
    lib = torch.library.Library("aten", "IMPL")
    with _quiet_override():
        lib.impl(op, fn, "CPU")
    try:
        yield
    finally:
        lib._destroy()


@contextlib.contextmanager
def _quiet_override() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": on purpose
        yield


# ---- an activation with a large bf16 error ---------------------------------------------

def _hard_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU with a piecewise-linear sigmoid (what hardswish computes) for bf16: a fast-path
    approximation whose error (up to ~0.14, typically ~0.07) is ~50x the bf16 op tolerance."""
    if x.dtype != torch.bfloat16:
        xf = x.float()
        return (xf * torch.sigmoid(xf)).to(x.dtype)
    xf = x.float()
    return (xf * torch.clamp(xf / 6 + 0.5, 0, 1)).to(x.dtype)


class BadSiluBf16(_Planted):
    display_name = "planted: bf16 SiLU approximated piecewise-linearly"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        return _aten_cpu_kernel("silu", _hard_silu)


# ---- an RMSNorm that drops its eps -------------------------------------------------------

class RmsNormNoEps(_Planted):
    """Every *RMSNorm module's output recomputed as w * x / rms(x), without eps (a fused norm
    kernel that forgets it); through torch's global module forward hook."""

    display_name = "planted: RMSNorm without eps"

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not type(module).__name__.endswith("RMSNorm") or not args:
                return None
            x = args[0].float()
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
            return (module.weight.float() * y).to(output.dtype)

        handle = torch.nn.modules.module.register_module_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()


# ---- attention that ignores its scale for head_dim 80 ------------------------------------

def _flash_cpu_wrong_scale(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                           is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                           scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU fused attention that, for head_dim 80, pads to a 128-wide tile and takes its scale
    from the padded width (1/sqrt(128)) instead of the scale it was given. float64 (the
    reference's dtype, which no device kernel serves) keeps the given scale, so the defect can
    also be planted process-wide under a reproducer script."""
    d = query.shape[-1]
    given = scale if scale is not None else 1 / math.sqrt(d)
    used = 1 / math.sqrt(128) if d == 80 and query.dtype != torch.float64 else given
    q, k, v = query.float(), key.float(), value.float()
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each KV head serves several query heads
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * used
    if is_causal:
        lq, lk = s.shape[-2], s.shape[-1]
        causal = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        s = s.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v
    return out.to(query.dtype), lse


class AttentionScaleD80(_Planted):
    display_name = "planted: attention ignores its scale for head_dim 80"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        return _aten_cpu_kernel("_scaled_dot_product_flash_attention_for_cpu", _flash_cpu_wrong_scale)


# ---- a GEMM whose result depends on the batch size ---------------------------------------

def _bf16_chunked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, chunk: int = 16) -> torch.Tensor:
    """x @ w.T with the K dimension split in chunks whose partial sums are rounded to bf16
    and accumulated in bf16 (a split-K path with a low-precision accumulator)."""
    acc: torch.Tensor | None = None
    for k0 in range(0, x.shape[-1], chunk):
        part = (x[..., k0:k0 + chunk].float() @ weight[:, k0:k0 + chunk].float().T).to(torch.bfloat16)
        acc = part if acc is None else (acc + part)
    assert acc is not None
    out = acc.float() + (bias.float() if bias is not None else 0.0)
    return out.to(x.dtype)


class BatchDependentGemm(_Planted):
    """Linear layers take a different kernel when more than one sequence is in the batch, and
    that kernel accumulates in bf16: alone is right, batched is not (greedy tokens mostly
    survive, probabilities move)."""

    display_name = "planted: batched GEMM accumulates in bf16"
    MAX_OUT_FEATURES = 8192

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not isinstance(module, torch.nn.Linear) or not args:
                return None
            x = args[0]
            if x.dim() < 3 or x.shape[0] < 2 or x.dtype != torch.bfloat16:
                return None
            if module.out_features > self.MAX_OUT_FEATURES:
                # The vocabulary projection of a real model (49,152 rows for SmolLM2): chunked, it
                # costs minutes per batch on 2 cores; the 30 decoder layers' projections carry the
                # defect without it (the embedded models' 1,024-row head keeps it).
                return None
            return _bf16_chunked(x, module.weight, module.bias)

        handle = torch.nn.modules.module.register_module_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()


# ---- a rotary table that wraps after 24 positions -----------------------------------------

class RopeTableTooShort(_Planted):
    """The rotary embedding's cos/sin table holds 24 positions and the index wraps (position
    p gets the angles of p mod 24): right for short contexts, wrong from position 24 on — a
    defect that only positions late in a sequence show (the embedded models' short prompts
    are 8-22 tokens, so their first generated position is still right)."""

    display_name = "planted: rotary table wraps after 24 positions"
    WRAP = 24

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            if pos is None:
                return None
            # Everything else as the model passed it (Gemma 3's rotary also takes the layer type).
            if "position_ids" in kwargs:
                return module.forward(*args, **{**kwargs, "position_ids": pos % self.WRAP})
            return module.forward(args[0], pos % self.WRAP, *args[2:], **kwargs)

        handles = [m.register_forward_hook(hook, with_kwargs=True) for _, m in self.model.named_modules()
                   if type(m).__name__.endswith("RotaryEmbedding")]
        assert handles, "the model has no rotary embedding module"
        try:
            yield
        finally:
            for h in handles:
                h.remove()
