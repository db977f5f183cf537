"""Step 3's vision family through vLLM's own layers, called as its Qwen2-VL / Qwen3-VL models call
them: ``MMEncoderAttention`` (the ViT attention, with the backend vLLM picks for the platform and
the cu_seqlens / max_seqlen / sequence_lengths metadata its models prepare), ``Conv3dLayer`` (the
PatchEmbed projection, with the model's reshape of the flattened patches), ``MRotaryEmbedding``
(built by ``get_rope`` from ``mrope_section`` / ``mrope_interleaved`` as the language model's
config gives them) and the ViT's 2-D RoPE (``get_rope`` with ``partial_rotary_factor`` 0.5, the
model's cos/sin gather and ``ApplyRotaryEmb``).

Each layer dispatches as vLLM's ``CustomOp`` does on the platform: on CPU ``MMEncoderAttention``
runs ``forward_cpu`` (torch SDPA per image), the others their ``forward_native`` (vLLM defines no
CPU kernel for them), on CUDA the flash-attention / Triton paths. vLLM's model files themselves
are not imported: ``vllm.model_executor.models.qwen2_vl`` needs torchvision, which vLLM's CPU
install removes; the few lines of glue those models add around the layers are restated here.

The layers need a current vLLM config while they are built (``CustomOp`` reads the compilation
config to choose its forward); a default ``VllmConfig`` is used, which on CPU selects the same
forwards a served model gets. Angles come from the op's ``cos_sin_cache``: it replaces the
layer's own cache buffer (same formula, float32) and is cast to the model dtype where vLLM casts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    import torch

    return torch


@contextmanager
def _building(dtype: torch.dtype) -> Iterator[None]:
    """A current vLLM config and ``dtype`` as the default dtype, as during model initialization."""
    torch = _torch()
    from vllm.config import set_current_vllm_config

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with set_current_vllm_config(_default_config()):
            yield
    finally:
        torch.set_default_dtype(previous)


@functools.cache
def _default_config() -> Any:
    from vllm.config import VllmConfig

    return VllmConfig()


# ------------------------------------------------------------------------------ encoder_attention


@functools.lru_cache(maxsize=8)
def _encoder_layer(num_heads: int, head_size: int, scale: float, num_kv_heads: int, dtype: torch.dtype,
                   device: str) -> Any:
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    with _building(dtype), _torch().device(device):
        return MMEncoderAttention(num_heads=num_heads, head_size=head_size, scale=scale, num_kv_heads=num_kv_heads,
                                  prefix="adaptcheck.step3.vision.attn")


def encoder_backend(dtype: torch.dtype, head_size: int = 80) -> str:
    """The ViT attention backend vLLM picks here (e.g. 'TORCH_SDPA' on CPU)."""
    from vllm.platforms import current_platform

    layer = _encoder_layer(4, head_size, head_size ** -0.5, 4, dtype, str(current_platform.device_type))
    return str(layer.attn_backend.name)


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      scale: float) -> torch.Tensor:
    import numpy as np
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    torch = _torch()
    t, hq, d = q.shape
    layer = _encoder_layer(hq, d, float(scale), k.shape[1], q.dtype, str(q.device))
    backend = layer.attn_backend
    # The metadata Qwen3-VL's vision tower prepares once per forward, from cu_seqlens on the host.
    cu = cu_seqlens.cpu().numpy().astype(np.int32)
    max_seqlen = torch.tensor(MMEncoderAttention.compute_max_seqlen(backend, cu), dtype=torch.int32)
    lengths = MMEncoderAttention.maybe_compute_seq_lens(backend, cu, q.device)
    cu_dev = MMEncoderAttention.maybe_recompute_cu_seqlens(backend, cu, hq * d, 1, q.device)
    # [batch 1, tokens, heads, head_size], as Qwen2VisionAttention hands q, k, v to the layer.
    out = layer(query=q[None], key=k[None], value=v[None], cu_seqlens=cu_dev, max_seqlen=max_seqlen,
                sequence_lengths=lengths)
    return out.reshape(t, hq, d)


# ------------------------------------------------------------------------------ patch_embed


@functools.lru_cache(maxsize=8)
def _conv3d(in_channels: int, embed_dim: int, kernel: tuple[int, int, int], bias: bool, dtype: torch.dtype,
            device: str) -> Any:
    from vllm.model_executor.layers.conv import Conv3dLayer

    with _building(dtype), _torch().device(device):
        return Conv3dLayer(in_channels, embed_dim, kernel_size=kernel, stride=kernel, bias=bias)


def patch_embed(pixel_values: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    torch = _torch()
    e, c, t, p, _ = weight.shape
    layer = _conv3d(c, e, (t, p, p), bias is not None, weight.dtype, str(weight.device))
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
        n = pixel_values.shape[0]
        # Qwen2VisionPatchEmbed.forward: each row viewed as [C, T, P, P], the layer, then [N, E].
        return layer(pixel_values.view(n, -1, t, p, p)).view(n, e)


# ------------------------------------------------------------------------------ mrope


def _mrope_layer(head_size: int, rotary_dim: int, max_position: int, section: tuple[int, ...], interleaved: bool,
                 dtype: torch.dtype, device: str) -> Any:
    from vllm.model_executor.layers.rotary_embedding import get_rope

    params: dict[str, Any] = {"rope_type": "default", "mrope_section": list(section)}
    if interleaved:
        params["mrope_interleaved"] = True
    if rotary_dim != head_size:
        params["partial_rotary_factor"] = rotary_dim / head_size
    with _building(dtype), _torch().device(device):
        # get_rope memoizes its layers: one per configuration, as a model shares it across layers.
        return get_rope(head_size=head_size, max_position=max_position, is_neox_style=True,
                        rope_parameters=params, dtype=dtype, mrope_positions_factor=1)


def mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
          head_size: int, mrope_section: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    section = tuple(int(s) for s in mrope_section.tolist())
    layer = _mrope_layer(int(head_size), cos_sin_cache.shape[1], cos_sin_cache.shape[0], section, bool(interleaved),
                         query.dtype, str(query.device))
    layer_cls = type(layer).__name__
    if layer_cls not in ("MRotaryEmbedding", "MRotaryEmbeddingInterleaved"):
        raise TypeError(f"get_rope built {layer_cls} for an mrope_section, not an M-RoPE layer")
    # The layer's buffer, in the model dtype as get_rope stores it; its forward casts to the query's dtype.
    layer.cos_sin_cache = cos_sin_cache.to(query.dtype)
    return layer(positions, query, key)


# ------------------------------------------------------------------------------ vision_rope_2d


def vision_rope_2d(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                   cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.common import ApplyRotaryEmb

    d = q.shape[2]
    rows = cos_sin_cache.shape[0]
    with _building(q.dtype), torch.device(str(q.device)):
        # Qwen2VisionTransformer: a neox RoPE over half the head (D/4 frequencies), cache in the model dtype.
        rope = get_rope(head_size=d, max_position=rows, is_neox_style=True,
                        rope_parameters={"partial_rotary_factor": 0.5})
        apply = ApplyRotaryEmb(enforce_enable=True)
    rope.cos_sin_cache = cos_sin_cache.to(rope.cos_sin_cache.dtype)
    # rot_pos_emb: the (row, column) pair of each patch picks two cache rows, flattened to [N, D/2].
    cos, sin = rope.get_cos_sin(rows)
    cos_c, sin_c = cos[pos_ids].flatten(1), sin[pos_ids].flatten(1)
    # Qwen2VisionAttention: q and k rotated together as a [2, N, H, D] batch.
    rotated = apply(torch.stack((q, k)), cos_c, sin_c)
    return rotated[0], rotated[1]


ADAPTERS: dict[str, Callable[..., Any]] = {
    "encoder_attention": encoder_attention,
    "patch_embed": patch_embed,
    "mrope": mrope,
    "vision_rope_2d": vision_rope_2d,
}
"""Catalog op → adapter; merged into vllm_provider.ADAPTERS."""
