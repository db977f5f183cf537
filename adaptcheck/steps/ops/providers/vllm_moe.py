"""vLLM adapters for the MoE ops DeepSeek's layers use (grouped top-k routing, MoE with shared
experts): each runs the code a served DeepSeek-V2/V3 runs on this platform, reached the way
vLLM's own layers reach it; the table row of each op is in adaptcheck.frameworks.vllm_ops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adaptcheck.steps.ops.families.moe_routing import by_expert_id

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    import torch

    return torch


def grouped_topk(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor | None, topk: int,
                 num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
                 routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The router vLLM's FusedMoE layer builds for DeepSeek (use_grouped_topk) on this platform.

    create_fused_moe_router is what the layer calls; on CPU it returns CPURouter, whose
    grouped branch is cpu_router._grouped_topk (torch code). The layer passes the router
    logits as both hidden states and logits (DeepseekV2MoE.forward does the same).
    """
    from vllm.model_executor.layers.fused_moe.router.router_factory import create_fused_moe_router

    router = create_fused_moe_router(
        top_k=int(topk), global_num_experts=router_logits.shape[-1], renormalize=bool(renormalize),
        use_grouped_topk=True, num_expert_group=int(num_expert_group), topk_group=int(topk_group),
        scoring_func=str(scoring_func), routed_scaling_factor=float(routed_scaling_factor),
        e_score_correction_bias=e_score_correction_bias)
    weights, ids = router.select_experts(hidden_states=router_logits, router_logits=router_logits)
    # vLLM's top-k runs with sorted=False: any order within a row is correct, the op lists ids ascending.
    return by_expert_id(weights, ids)


def _moe_isa(dtype: torch.dtype) -> str:
    """The ISA vLLM's CPU experts pick: AMX for bf16 where the tiles exist, else the portable 'vec'."""
    torch = _torch()
    from vllm.platforms import current_platform
    from vllm.platforms.interface import CpuArchEnum

    if (dtype == torch.bfloat16 and current_platform.get_cpu_architecture() == CpuArchEnum.X86
            and torch.cpu._is_amx_tile_supported()):
        return "amx"
    return "vec"


def cpu_routed_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                       w2: torch.Tensor) -> torch.Tensor:
    """Σ_k weight · expert(x) through _C.cpu_fused_moe, with vLLM's CPU weight preparation."""
    torch = _torch()
    ops = importlib.import_module("vllm._custom_ops")
    e, two_i, h = w13.shape
    inter = two_i // 2
    if h % 32:
        raise ValueError(f"vLLM's CPU MoE kernels need hidden % 32 == 0 (hidden={h})")
    # As CPUUnquantizedExperts does: intermediate padded with zeros to a multiple of 32 (padded
    # gate/up rows give silu(0)·0 = 0, padded w2 columns are zero).
    padded = -(-inter // 32) * 32
    if padded != inter:
        w13p = w13.new_zeros(e, 2 * padded, h)
        w13p[:, :inter] = w13[:, :inter]
        w13p[:, padded:padded + inter] = w13[:, inter:]
        w2p = w2.new_zeros(e, h, padded)
        w2p[:, :, :inter] = w2
        w13, w2 = w13p, w2p
    isa = _moe_isa(x.dtype)
    out = torch.empty_like(x)
    # The kernel reads the routing as contiguous float32 / int32 buffers (CPURouter's contract).
    ops.cpu_fused_moe(out, x.contiguous(), ops.cpu_prepack_moe_weight(w13.contiguous(), isa),
                      ops.cpu_prepack_moe_weight(w2.contiguous(), isa), None, None,
                      topk_weights.float().contiguous(), topk_ids.to(torch.int32).contiguous(), "silu", isa)
    return out


def _vllm_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """An unquantized linear layer as vLLM runs one: UnquantizedLinearMethod's weight processing
    (on CPU: dispatch_cpu_unquantized_gemm picks oneDNN, the SGL kernel or torch) and its apply."""
    torch = _torch()
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    method = UnquantizedLinearMethod()
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
    method.process_weights_after_loading(layer)
    return lambda x: method.apply(layer, x)


def shared_expert_mlp(x: torch.Tensor, shared_w13: torch.Tensor, shared_w2: torch.Tensor) -> torch.Tensor:
    """DeepseekV2MLP's forward on this platform: gate_up linear, _C.silu_and_mul, down linear."""
    torch = _torch()
    importlib.import_module("vllm._custom_ops")  # registers torch.ops._C
    gate_up = _vllm_linear(shared_w13)(x.contiguous())
    act = torch.empty((x.shape[0], shared_w13.shape[0] // 2), dtype=x.dtype, device=x.device)
    torch.ops._C.silu_and_mul(act, gate_up.contiguous())
    return _vllm_linear(shared_w2)(act)


def fused_moe_shared(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                     w2: torch.Tensor, shared_w13: torch.Tensor, shared_w2: torch.Tensor) -> torch.Tensor:
    routed = cpu_routed_experts(x, topk_weights, topk_ids, w13, w2)
    shared = shared_expert_mlp(x, shared_w13, shared_w2)
    # MoERunner adds the two in the model dtype (shared_output + fused_output).
    return shared + routed


ADAPTERS: dict[str, Callable[..., Any]] = {
    "grouped_topk": grouped_topk,
    "fused_moe_shared": fused_moe_shared,
}
"""Catalog op → adapter; vllm_provider.ADAPTERS includes these."""
