"""Which implementation each layer type of a vLLM model really runs, found inside the worker
(docs/frameworks.md, "Which kernels vLLM ran").
"""

from __future__ import annotations

from typing import Any

TRACE_ATTR = "_adaptcheck_op_trace"
"""Attribute set on a traced module: (its own ``forward`` if it had one, the ops it ran)."""
MAX_ATEN_NAMES = 4
"""Distinct torch op names shown for a layer that ran only torch ops (the report is one line)."""
_QUIET_ATEN = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::slice", "aten::select", "aten::t",
    "aten::transpose", "aten::expand", "aten::empty", "aten::empty_like", "aten::copy_", "aten::detach",
    "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::split", "aten::split_with_sizes",
    "aten::contiguous", "aten::clone", "aten::_to_copy", "aten::to", "aten::permute", "aten::index",
    "aten::flatten", "aten::narrow", "aten::empty_strided", "aten::lift_fresh", "aten::zeros", "aten::fill_",
})
"""Layout and allocation ops: they say nothing about which arithmetic kernel ran."""


def _resolve(fn: Any) -> tuple[str, bool]:
    """(method name, wrapped by torch.compile) of a ``CustomOp._forward_method``."""
    compiled = False
    target = fn
    for _ in range(4):
        inner = getattr(target, "_torchdynamo_orig_callable", None) or getattr(target, "__wrapped__", None)
        if inner is None or inner is target:
            break
        compiled = compiled or hasattr(target, "_torchdynamo_orig_callable") or "compile" in repr(target).lower()
        target = inner
    name = getattr(getattr(target, "__func__", target), "__name__", None)
    return (name if isinstance(name, str) else type(target).__name__), compiled


def _static_method(op: Any) -> str:
    """What ``op._forward_method`` is, without running it: ``forward_cpu``, ``forward_native`` …

    A platform method the class does not override is CustomOp's default, which (except
    ``forward_cuda``/``forward_hip``) is ``forward_native``: said as ``forward_cpu -> forward_native``.
    """
    from vllm.model_executor.custom_op import CustomOp

    name, compiled = _resolve(getattr(op, "_forward_method", None))
    desc = name
    if name.startswith("forward_") and name not in ("forward_native", "forward_cuda", "forward_hip"):
        own = getattr(type(op), name, None)
        if own is not None and own is getattr(CustomOp, name, None):
            desc = f"{name} -> forward_native"
    return desc + (" (torch.compile)" if compiled else "")


def _kind(module: Any) -> str | None:
    """'custom_op', 'linear' (a layer with a ``quant_method``) or 'attention'; None for others."""
    from vllm.model_executor.custom_op import CustomOp

    if isinstance(module, CustomOp):
        return "custom_op"
    if hasattr(module, "impl") and hasattr(module, "attn_backend"):
        return "attention"
    if getattr(module, "quant_method", None) is not None and hasattr(module, "weight"):
        return "linear"
    if type(module).__name__ == "LogitsProcessor":
        return "logits"  # runs the LM head's GEMM (ParallelLMHead itself is never called)
    return None


def static_walk(model: Any) -> dict[str, str]:
    """Per layer type: how it is set up to run (method, quantisation method, attention backend).

    Attention is keyed by its layer class; its kernels are not traced (vLLM calls them
    through one opaque ``vllm::unified_attention*`` op), the backend class says which ran.
    """
    facts: dict[str, set[str]] = {}
    for _, module in model.named_modules():
        kind = _kind(module)
        if kind is None:
            continue
        key = type(module).__name__
        if kind == "custom_op":
            desc = _static_method(module)
        elif kind == "attention":
            backend = getattr(module, "attn_backend", None)
            backend_name = getattr(backend, "__name__", None) or type(backend).__name__
            desc = f"{backend_name} (impl {type(module.impl).__name__})"
        elif kind == "logits":
            desc = "LM head GEMM"
        else:
            desc = type(module.quant_method).__name__
        facts.setdefault(key, set()).add(desc)
    return {k: " | ".join(sorted(v)) for k, v in facts.items()}


def _recorder(seen: dict[str, int]) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        """Counts every op the dispatcher runs while active (and runs it unchanged)."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            schema = getattr(func, "_schema", None)
            name = str(getattr(schema, "name", None) or func)
            seen[name] = seen.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return OpRecorder


def install_trace(model: Any) -> int:
    """Wrap the ``forward`` of every custom-op and linear layer to record the ops it runs.

    Returns how many layers were wrapped. Pair with :func:`collect_trace`, which removes
    the wrappers whatever happened in between.
    """
    count = 0
    for _, module in model.named_modules():
        if _kind(module) not in ("custom_op", "linear", "logits") or hasattr(module, TRACE_ATTR):
            continue
        seen: dict[str, int] = {}
        own = module.__dict__.get("forward")
        original = module.forward
        recorder = _recorder(seen)

        def traced(*args: Any, __original: Any = original, __recorder: Any = recorder, **kwargs: Any) -> Any:
            with __recorder():
                return __original(*args, **kwargs)

        setattr(module, TRACE_ATTR, (own, seen))
        module.forward = traced
        count += 1
    return count


def _describe_ops(seen: dict[str, int]) -> str:
    custom = sorted(n for n in seen if not n.startswith(("aten::", "prims::")))
    if custom:
        return "custom kernel " + ", ".join(custom)
    aten = sorted(n for n in seen if n not in _QUIET_ATEN)
    shown = ", ".join(aten[:MAX_ATEN_NAMES]) + (" …" if len(aten) > MAX_ATEN_NAMES else "")
    return f"torch ops ({shown})" if shown else "torch ops"


def collect_trace(model: Any) -> dict[str, str]:
    """Remove the wrappers of :func:`install_trace`; per layer type, what its layers ran.

    A layer type whose layers ran nothing while traced (not reached by the request) is left out.
    """
    observed: dict[str, dict[str, int]] = {}
    for _, module in model.named_modules():
        state = module.__dict__.get(TRACE_ATTR)
        if state is None:
            continue
        own, seen = state
        delattr(module, TRACE_ATTR)
        if own is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = own
        if seen:  # layers of one type together (RMSNorm with and without a residual …)
            merged = observed.setdefault(type(module).__name__, {})
            for name, n in seen.items():
                merged[name] = merged.get(name, 0) + n
    return {k: _describe_ops(v) for k, v in observed.items()}


def merge(static: dict[str, str], observed: dict[str, str] | None) -> dict[str, str]:
    """One line per layer type: the method it is set up with, and what it ran when observed."""
    out: dict[str, str] = {}
    for key, desc in static.items():
        seen = (observed or {}).get(key)
        if seen:
            out[key] = f"{desc}: {seen}"
        elif observed is None and "Backend" not in desc:  # attention is never traced
            out[key] = f"{desc}; ops not traced (compiled model)"
        else:
            out[key] = desc
    return out
