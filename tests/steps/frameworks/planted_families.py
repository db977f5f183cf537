"""Defects planted in the DeepSeek-V3 family's own layers, for step-4 tests.

Like :mod:`tests.steps.frameworks.planted`: the real transformers adapter, whose ``generate``
and ``score`` run with one defect switched on in the model's execution path (torch's module
hooks, or a buffer of the adapter's own model swapped for the duration) — never the float64
reference's model, which is a separate instance. Each is a mistake a DeepSeek kernel or port
can make and that the family's extras alone expose:

- :class:`RoutingBiasIgnored`: the router picks experts by the sigmoid scores alone, without
  the ``e_score_correction_bias`` (a grouped top-k kernel that has no bias input);
- :class:`SharedExpertDropped`: the shared expert's output is never added (a fused MoE path
  that only runs the routed experts);
- :class:`MlaQueryRopeDropped`: the rotary part of every query head is zero (an MLA kernel that
  scores only the latent ``q_nope · k_nope`` part);
- :class:`MlaKvHalvesSwapped`: the up-projection of the latent is split with its key and value
  halves the wrong way round (qk_nope_head_dim == v_head_dim, so the shapes still fit).

Ladders name them as ``framework: "tests.steps.frameworks.planted_families:NAME"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch

from tests.steps.frameworks.planted import _Planted


def _modules(model: torch.nn.Module, suffix: str) -> list[torch.nn.Module]:
    found = [m for name, m in model.named_modules() if name.endswith(suffix)]
    assert found, f"the model has no module named *{suffix}"
    return found


@contextlib.contextmanager
def _output_hooks(modules: list[torch.nn.Module], hook: Any) -> Iterator[None]:
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class RoutingBiasIgnored(_Planted):
    display_name = "planted: DeepSeek router ignores its score-correction bias"

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        biases = [cast(torch.Tensor, g.e_score_correction_bias) for g in _modules(self.model, "mlp.gate")]
        saved = [b.detach().clone() for b in biases]
        with torch.no_grad():
            for b in biases:
                b.zero_()
        try:
            yield
        finally:
            with torch.no_grad():
                for b, value in zip(biases, saved, strict=True):
                    b.copy_(value)


class SharedExpertDropped(_Planted):
    display_name = "planted: DeepSeek MoE drops the shared expert"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        return _output_hooks(_modules(self.model, "mlp.shared_experts"),
                             lambda _m, _a, out: torch.zeros_like(out))


def _per_head(out: torch.Tensor, width: int) -> torch.Tensor:
    return out.view(*out.shape[:-1], -1, width)


class MlaQueryRopeDropped(_Planted):
    display_name = "planted: MLA scores without the rotary part of the query"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        cfg = self.model.config
        nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim

        def hook(_m: torch.nn.Module, _a: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
            q = _per_head(out, nope + rope).clone()
            q[..., nope:] = 0
            return q.view(out.shape)

        name = "self_attn.q_b_proj" if cfg.q_lora_rank is not None else "self_attn.q_proj"
        return _output_hooks(_modules(self.model, name), hook)


class MlaKvHalvesSwapped(_Planted):
    display_name = "planted: MLA latent up-projection with key and value halves swapped"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        cfg = self.model.config
        nope, vd = cfg.qk_nope_head_dim, cfg.v_head_dim
        assert nope == vd, "the halves can only be swapped when they are the same width"

        def hook(_m: torch.nn.Module, _a: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
            kv = _per_head(out, nope + vd)
            return torch.cat([kv[..., nope:], kv[..., :nope]], dim=-1).reshape(out.shape)

        return _output_hooks(_modules(self.model, "self_attn.kv_b_proj"), hook)
