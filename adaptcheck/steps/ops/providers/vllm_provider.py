"""vLLM's custom ops as a provider (STUB: being written)."""

from __future__ import annotations

from adaptcheck.steps.ops.providers.base import OpProvider


class VllmProvider(OpProvider):
    name = "vllm"

    def available(self) -> tuple[bool, str]:
        return False, "not implemented yet"
