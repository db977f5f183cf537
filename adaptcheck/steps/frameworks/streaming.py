"""Layer streaming: transformers' own model on the CPU, its decoder layers' weights read from the
model folder's safetensors one layer at a time, so the float64 reference of a model larger than
host memory still runs (docs/reference-at-scale.md).

The model is built by transformers on the ``meta`` device from its config, as ``from_pretrained``
builds it; the parts every forward needs (embeddings, final norm, lm_head, rotary tables, a vision
tower) are loaded once with transformers' own loader, and each decoder layer's tensors are loaded
by a forward pre-hook on that layer, through the same loader (key renamings, fused MoE experts,
the dtype cast), and dropped back to ``meta`` by a forward hook after it. transformers' forward
(masks, RoPE, KV cache, generate) runs unchanged, so the streamed numbers are the in-memory
numbers bit for bit (tests/steps/frameworks/test_streamed_reference.py holds them equal).

It leans on transformers 5's loading internals (``core_model_loading``); with another version,
or a folder without safetensors, :class:`StreamUnsupported` says why and the reference decides
without streaming (:mod:`adaptcheck.steps.frameworks.reference_plan`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptcheck.base.dtypes import framework_dtype
from adaptcheck.frameworks.base import FrameworkConfig, FrameworkError, LoadOptions
from adaptcheck.frameworks.transformers_fw import TransformersFramework, _moe_kwargs

_ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                  "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class StreamUnsupported(Exception):
    """This model cannot be streamed here; the message says why, in one line."""


class CheckpointIndex:
    """Every tensor of a folder's safetensors files by name, read lazily (``model.safetensors.index.json``
    shards honoured). Files are read with ``pread``, not mapped: mapped pages would count in the
    process's resident memory until the file is closed, and the point is to hold one layer."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise StreamUnsupported(f"{folder} has no *.safetensors weights to stream")
        self._handles: dict[str, Any] = {}
        self.file_of: dict[str, str] = {}
        for name in files:
            try:
                handle = safe_open(str(folder / name), framework="pt", backend="pread")
            except TypeError:  # a safetensors without the pread backend: mapped, as transformers reads
                handle = safe_open(str(folder / name), framework="pt")
            self._handles[name] = handle
            self.file_of.update(dict.fromkeys(handle.keys(), name))

    def slice(self, key: str) -> Any:
        """A lazy slice of ``key`` (read when transformers' loader materialises it)."""
        return self._handles[self.file_of[key]].get_slice(key)

    def stored_bytes(self, key: str) -> int:
        """Bytes of ``key`` on disk (its shape times its stored element size)."""
        s = self.slice(key)
        return functools.reduce(lambda a, b: a * b, s.get_shape(), 1) * _ELEMENT_BYTES.get(s.get_dtype(), 2)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)
        self._handles.clear()


@dataclass
class MetaModel:
    """A transformers model on ``meta``, its loader's settings and its checkpoint split by layer."""

    model: Any
    load_config: Any
    prefix: str
    """Module path of the decoder layers' ModuleList, e.g. ``model.layers``."""
    layers: Any
    layer_keys: list[list[str]]
    """Checkpoint tensor names of each layer (what its pre-hook loads)."""
    resident_keys: list[str]
    """Checkpoint tensor names outside the layers (loaded once)."""
    layer_merged: list[int] = field(default_factory=list)
    """Elements per layer of the tensors a converter builds from several (fused MoE experts):
    the loader holds their parts and the merged copy at once."""


def _layer_list(model: Any) -> tuple[str, Any]:
    """The decoder layers: the ModuleList holding the most parameters (a vision tower's blocks
    are a smaller list, and stay resident)."""
    import torch

    best: tuple[int, str, Any] | None = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            count = sum(p.numel() for p in module.parameters())
            if best is None or count > best[0]:
                best = (count, name, module)
    if best is None or best[0] == 0:
        raise StreamUnsupported(f"{type(model).__name__} has no list of decoder layers to stream")
    return best[1], best[2]


def build_meta(folder: Path, dtype: str, index: CheckpointIndex, attn_implementation: str | None = None) -> MetaModel:
    """The model as ``from_pretrained(folder, dtype=...)`` builds it, every tensor on ``meta``."""
    import torch

    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
        from transformers.modeling_utils import LoadStateDictConfig, _get_dtype
        from transformers.models.auto.auto_factory import _get_model_class
        from transformers.utils.generic import ContextManagers
    except ImportError as exc:
        raise StreamUnsupported(f"layer streaming needs transformers 5's loader ({exc})") from None
    from adaptcheck.frameworks import multimodal

    config = AutoConfig.from_pretrained(str(folder))
    if getattr(config, "quantization_config", None) is not None:
        raise StreamUnsupported("a quantized checkpoint is dequantized by its loader, not streamed")
    experts = _moe_kwargs(folder).get("experts_implementation")
    if experts:
        config._experts_implementation = experts
    if attn_implementation:
        config._attn_implementation = attn_implementation
    auto = AutoModelForImageTextToText if multimodal.vision_config(folder) is not None else AutoModelForCausalLM
    cls = _get_model_class(config, auto._model_mapping)
    # The steps of from_pretrained that shape the model (transformers 5.x, modeling_utils).
    config, torch_dtype = _get_dtype(getattr(torch, framework_dtype(dtype)), [str(folder / f) for f in
                                     sorted(set(index.file_of.values()))], config, None, None, True, None)
    config.name_or_path = str(folder)
    with ContextManagers(cls.get_init_context(torch_dtype, False, False, False)):
        model = cls(copy.deepcopy(config))
    # WeightTransforms: renamings and converters (transformers' own annotation is narrower).
    conversions: Any = get_model_conversion_mapping(model, None, None)
    load_config = LoadStateDictConfig(pretrained_model_name_or_path=str(folder), dtype=torch_dtype,
                                      dtype_plan=model._get_dtype_plan(torch_dtype), weight_mapping=conversions)
    prefix, layers = _layer_list(model)
    meta_sd = model.state_dict()
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
    layer_keys: list[list[str]] = [[] for _ in layers]
    merged: list[set[str]] = [set() for _ in layers]
    resident: list[str] = []
    for key in sorted(index.file_of):
        # The model's name for a checkpoint tensor, as transformers' loader computes it.
        target, converter = rename_source_key(key, renamings, converters, model.base_model_prefix, meta_sd)
        if target not in meta_sd and key in meta_sd:
            target, converter = rename_source_key(key, [], [], model.base_model_prefix, meta_sd)
        if target not in meta_sd:
            continue  # a tensor the model does not use (e.g. DeepSeek's MTP layer): the loader drops it too
        m = pattern.match(target)
        if m and int(m[1]) < len(layers):
            layer_keys[int(m[1])].append(key)
            if converter is not None:
                merged[int(m[1])].add(target)
        else:
            resident.append(key)
    return MetaModel(model=model, load_config=load_config, prefix=prefix, layers=layers, layer_keys=layer_keys,
                     resident_keys=resident, layer_merged=[sum(meta_sd[t].numel() for t in ts) for ts in merged])


def _weights(module: Any) -> Iterator[tuple[Any, str, Any]]:
    """(owner, name, tensor) of every parameter and persistent buffer: what the checkpoint holds."""
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                yield mod, name, p
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                yield mod, name, b


def weight_count(module: Any) -> int:
    """Elements of ``module``'s weights, materialised or not (a shared tensor counted once)."""
    return sum({id(t): t.numel() for _mod, _name, t in _weights(module)}.values())


def tensor_bytes(module: Any) -> int:
    """Bytes of ``module``'s materialised weights (a tensor shared by two names counted once)."""
    seen: dict[int, int] = {}
    for _mod, _name, t in _weights(module):
        if not t.is_meta:
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


@contextlib.contextmanager
def _quiet_loader() -> Iterator[None]:
    """transformers' loader draws a progress bar per call: one per layer per forward here."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _load(meta: MetaModel, index: CheckpointIndex, keys: list[str], what: str) -> Any:
    """``keys`` through transformers' own loader into the model; the loader's report."""
    import torch
    from transformers.core_model_loading import convert_and_load_state_dict_in_model

    # inference_mode(False): a pre-hook runs inside the caller's inference mode, and a weight
    # made there is an inference tensor that cannot become a Parameter.
    with torch.inference_mode(False), _quiet_loader():
        info, _ = convert_and_load_state_dict_in_model(model=meta.model, state_dict={k: index.slice(k) for k in keys},
                                                       load_config=meta.load_config)
    if info.mismatched_keys or info.conversion_errors:
        bad = sorted(str(k) for k in info.mismatched_keys) + sorted(info.conversion_errors)
        raise FrameworkError(f"streaming {what}: the checkpoint's tensors do not fit the model: {bad[:3]}")
    return info


@dataclass
class StreamStats:
    """What streaming cost: loads, bytes read and converted, time, weights held."""

    layers: int
    held_layers: int
    """Layers held at once: the first ``held_layers - 1`` stay loaded, the rest pass through one slot."""
    resident_bytes: int = 0
    loads: int = 0
    bytes_read: int = 0
    """Checkpoint bytes read for layer loads (stored dtype)."""
    bytes_converted: int = 0
    """Bytes of the layers' weights as loaded (reference dtype)."""
    load_s: float = 0.0
    """Reading and converting layers."""
    forward_s: float = 0.0
    """Inside the layers' forwards (loads excluded)."""
    layer_calls: int = 0
    held_bytes: int = 0
    peak_bytes: int = 0
    per_layer_bytes: dict[int, int] = field(default_factory=dict)


class LayerStreamer:
    """Forward hooks that load a layer before it runs and drop it after, holding at most
    ``held_layers`` layers (plus the resident parts).

    Why not an LRU: every forward visits the layers in the same order, and an LRU smaller than
    the model evicts exactly the layer needed next (no hit ever). Keeping the first
    ``held_layers - 1`` loaded and passing the others through one slot is the best a cache of
    that size can do on a cyclic scan; ``held_layers >= layers`` keeps everything, which is the
    in-memory path's speed after the first forward."""

    def __init__(self, meta: MetaModel, index: CheckpointIndex, held_layers: int) -> None:
        self.meta, self.index = meta, index
        n = len(meta.layers)
        self.stats = StreamStats(layers=n, held_layers=max(1, min(held_layers, n)))
        self._keep = set(range(self.stats.held_layers - 1 if self.stats.held_layers < n else n))
        self._loaded: set[int] = set()
        self._t0 = 0.0
        self._hooks: list[Any] = []
        self._stored = [sum(index.stored_bytes(k) for k in keys) for keys in meta.layer_keys]
        for i, layer in enumerate(meta.layers):
            self._hooks.append(layer.register_forward_pre_hook(functools.partial(self._before, i)))
            self._hooks.append(layer.register_forward_hook(functools.partial(self._after, i), always_call=True))

    def load_resident(self) -> None:
        """The parts outside the layers, once, finished as ``from_pretrained`` finishes a model
        (non-persistent buffers such as the rotary tables computed, tied weights tied)."""
        info = _load(self.meta, self.index, self.meta.resident_keys, "the resident weights")
        # The layers are loaded as they run: not missing (from_pretrained would allocate and
        # initialise them here), and marked initialised so nothing initialises their meta tensors.
        info.missing_keys = {k for k in info.missing_keys if not k.startswith(self.meta.prefix + ".")}
        for _mod, _name, t in _weights(self.meta.layers):
            t._is_hf_initialized = True
        type(self.meta.model)._finalize_model_loading(self.meta.model, self.meta.load_config, info)
        self.meta.model.eval()
        self.stats.resident_bytes = tensor_bytes(self.meta.model)
        self._account()

    def _before(self, i: int, _module: Any, _args: Any) -> None:
        if i not in self._loaded:
            start = time.perf_counter()
            _load(self.meta, self.index, self.meta.layer_keys[i], f"layer {i}")
            missing = [f"{type(m).__name__}.{n}" for m, n, t in _weights(self.meta.layers[i]) if t.is_meta]
            if missing:
                raise FrameworkError(f"streaming layer {i}: the checkpoint has no {', '.join(missing[:3])}")
            self._loaded.add(i)
            self.stats.loads += 1
            self.stats.bytes_read += self._stored[i]
            self.stats.per_layer_bytes[i] = tensor_bytes(self.meta.layers[i])
            self.stats.bytes_converted += self.stats.per_layer_bytes[i]
            self.stats.load_s += time.perf_counter() - start
            self._account()
        self._t0 = time.perf_counter()

    def _after(self, i: int, _module: Any, _args: Any, _output: Any) -> None:
        self.stats.forward_s += time.perf_counter() - self._t0
        self.stats.layer_calls += 1
        if i not in self._keep:
            self.drop(i)

    def drop(self, i: int) -> None:
        """Layer ``i``'s weights back to ``meta`` (non-persistent buffers stay: they are not in
        the checkpoint, and were computed once)."""
        import torch

        for mod, name, t in list(_weights(self.meta.layers[i])):
            if not t.is_meta:
                empty = torch.empty_like(t, device="meta")
                if name in mod._parameters:
                    mod._parameters[name] = torch.nn.Parameter(empty, requires_grad=False)
                else:
                    mod._buffers[name] = empty
        self._loaded.discard(i)
        self._account()

    def _account(self) -> None:
        self.stats.held_bytes = self.stats.resident_bytes + sum(self.stats.per_layer_bytes.get(i, 0)
                                                                for i in self._loaded)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.held_bytes)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for i in list(self._loaded):
            self.drop(i)
        self.index.close()


class StreamedTransformers(TransformersFramework):
    """The transformers adapter on the CPU with its decoder layers streamed (:class:`LayerStreamer`);
    generate, score and every hook of localisation work as on the in-memory adapter."""

    def __init__(self, held_layers: int, config: FrameworkConfig | None = None) -> None:
        super().__init__(config)
        self.held_layers = held_layers
        self.streamer: LayerStreamer | None = None

    def load(self, opts: LoadOptions, device: str) -> float:
        if device != "cpu":
            raise FrameworkError("layer streaming runs on the CPU only")
        from transformers import AutoTokenizer, GenerationConfig

        from adaptcheck.frameworks import multimodal

        start = time.perf_counter()
        index = CheckpointIndex(opts.model_path)
        try:
            meta = build_meta(opts.model_path, opts.dtype, index, str(opts.extra.get("attn_implementation") or "")
                              or None)
            self.streamer = LayerStreamer(meta, index, self.held_layers)
            self.streamer.load_resident()
        except BaseException:
            index.close()
            raise
        self.model = meta.model
        with contextlib.suppress(OSError):  # from_pretrained reads generation_config.json the same way
            self.model.generation_config = GenerationConfig.from_pretrained(str(opts.model_path))
        self.tokenizer = AutoTokenizer.from_pretrained(str(opts.model_path))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        vision = multimodal.vision_config(opts.model_path) is not None
        self.images = multimodal.ImageInputs(opts.model_path, self.tokenizer) if vision else None
        self.device, self.dtype, self._opts = device, opts.dtype, opts
        return time.perf_counter() - start

    def shutdown(self) -> None:
        if self.streamer is not None:
            self.streamer.close()
            self.streamer = None
        super().shutdown()
