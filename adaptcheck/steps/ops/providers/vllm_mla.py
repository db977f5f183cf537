"""Step 3's MLA ops on vLLM: ``mla_decode`` through the CPU MLA decode kernel
(``_C.mla_decode_kvcache``, what vLLM's CPU_MLA backend calls), with the query absorption and the
value up-projection done as vLLM's MLA layer does them around it (docs/ops.md, "The vllm provider").

vLLM's ``MLAAttention`` splits ``kv_b_proj`` into ``W_UK_T [N, P, L]`` and ``W_UV [N, L, V]``
once, after loading; per decode step it multiplies ``q_nope`` by ``W_UK_T`` (a batched matmul in
the model dtype), concatenates ``q_pe``, hands ``[B, N, L+R]`` to the backend, and multiplies the
backend's latent output ``[B, N, L]`` by ``W_UV``. The CPU_MLA backend's cache is one
``[num_blocks, block_size, L+R]`` tensor, each slot ``[kv_c | k_pe]`` (its ``do_kv_cache_update``
writes it so), and its kernel takes int32 block tables and sequence lengths. The adapter does the
same steps; only the kernel call is vLLM's compiled code, the matmuls are torch's (as in vLLM).

``mla_prefill`` has no adapter: vLLM's CPU MLA prefill is torch code (adaptcheck.frameworks.vllm_ops).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from adaptcheck.frameworks.vllm_ops import CPU_MLA_BLOCK_SIZE, CPU_MLA_HEAD_SIZE

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    import torch

    return torch


def _c() -> Any:
    """``torch.ops._C`` with vLLM's library loaded (importing vllm._custom_ops registers it)."""
    importlib.import_module("vllm._custom_ops")
    return _torch().ops._C


def pack_latent_cache(kv_c_cache: torch.Tensor, k_pe_cache: torch.Tensor) -> torch.Tensor:
    """CPU_MLA's cache ``[num_blocks, block_size, L+R]``: each slot the latent, then the rope key."""
    return _torch().cat((kv_c_cache, k_pe_cache), dim=-1).contiguous()


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_cache: torch.Tensor, k_pe_cache: torch.Tensor,
               kv_b_proj: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    torch = _torch()
    batch, heads, nope = q_nope.shape
    lora, rope, block_size = kv_c_cache.shape[-1], q_pe.shape[-1], kv_c_cache.shape[1]
    # The kernel refuses other shapes with a bare "Unsupported block size"; say what vLLM supports.
    if lora + rope != CPU_MLA_HEAD_SIZE or block_size != CPU_MLA_BLOCK_SIZE:
        raise ValueError(f"vLLM's CPU_MLA decode kernel supports kv_lora_rank + rope = {CPU_MLA_HEAD_SIZE} and "
                         f"block size {CPU_MLA_BLOCK_SIZE} only (got {lora} + {rope}, block size {block_size})")
    # MLAAttention's split: W_UK_T [N, P, L] and W_UV [N, L, V] out of kv_b_proj [N, P+V, L].
    w_uk_t = kv_b_proj[:, :nope]
    w_uv = kv_b_proj[:, nope:].transpose(1, 2)
    ql_nope = torch.bmm(q_nope.transpose(0, 1), w_uk_t).transpose(0, 1)  # [B, N, L]
    query = torch.cat((ql_nope, q_pe), dim=-1).contiguous()
    latent = torch.zeros((batch, heads, lora), dtype=q_nope.dtype, device=q_nope.device)
    _c().mla_decode_kvcache(latent, query, pack_latent_cache(kv_c_cache, k_pe_cache), float(scale),
                            block_tables.to(torch.int32), seq_lens.to(torch.int32))
    # MLAAttention._v_up_proj: (N, B, L) x (N, L, V) -> (B, N, V).
    return torch.bmm(latent.transpose(0, 1), w_uv).transpose(0, 1).contiguous()


ADAPTERS: dict[str, Any] = {"mla_decode": mla_decode}
"""Catalog op → adapter, merged into the vLLM provider's ADAPTERS."""
