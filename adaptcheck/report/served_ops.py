"""Which step-3 vLLM-provider kernels the model served in step 4 did not run here (its layer
ran ``forward_native``), from step 4's ``teacher_forced.implementations`` and the op ↔ layer
table :data:`adaptcheck.frameworks.vllm_ops.VLLM_OPS` (docs/ops.md, "Kernels the served model
did not use").
"""

from __future__ import annotations

import json
import re

from pydantic import JsonValue

from adaptcheck.base.schemas.ops_evidence import ServedOpsRef
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.frameworks.vllm_ops import custom_op_layers

STEP = 4
VLLM_PROVIDER = "vllm"
NATIVE = "forward_native"
NOT_USED_TEXT = "not used by the served model here (vLLM ran forward_native)"


def _text(key: str, value: JsonValue) -> str:
    return f"{key}: " + (value if isinstance(value, str) else json.dumps(value, default=str))


def _word(name: str, text: str) -> bool:
    """``name`` in ``text`` as a whole identifier: RMSNorm is not GemmaRMSNorm, _C::gelu not _C::gelu_tanh."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def _native(text: str, kernel: str) -> bool:
    """The layer ran plain torch: vLLM's description says forward_native (or that only torch
    ops ran, as x86's SiluAndMul.forward_cpu does by calling forward_native), and never names
    the kernel (``_C::rms_norm``, or ``_C.rms_norm`` as another writer may spell it)."""
    if _word(kernel, text) or _word(kernel.replace("::", "."), text):
        return False
    return NATIVE in text or ("torch ops" in text and "custom kernel" not in text)


def unused_ops(results: RunResults) -> dict[str, str]:
    """Step-3 op (catalog name, vLLM provider) -> the evidence that the served model did not
    run its kernel here ('RMSNorm: forward_cpu -> forward_native: torch ops (…); per
    framework.vllm.reference'), behind :data:`NOT_USED_TEXT`.

    An implementations entry counts when it names the class (its key, or a whole word of its
    description) and says the layer ran forward_native; every step-4 check's entry is read.
    """
    # Op -> (CustomOp class, the kernel its platform path runs); ops outside any such layer
    # (attention, KV-cache writes, MoE, quantization, sampling) have no forward_native to fall to.
    layers = custom_op_layers()
    evidence: dict[str, dict[str, list[str]]] = {}  # op -> description -> checks
    for c in results.checks:
        if c.step != STEP:
            continue
        served = c.evidence(ServedOpsRef)
        if served is None or served.teacher_forced is None:
            continue
        for key, value in served.teacher_forced.implementations.items():
            text = _text(key, value)
            for op, (cls, kernel) in layers.items():
                if _word(cls, text) and _native(text, kernel):
                    checks = evidence.setdefault(op, {}).setdefault(text, [])
                    if c.id not in checks:
                        checks.append(c.id)
    return {op: "; ".join(f"{text}; per {', '.join(ids)}" for text, ids in by_text.items())
            for op, by_text in evidence.items()}
