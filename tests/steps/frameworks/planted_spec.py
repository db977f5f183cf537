"""Speculative-decoding defects planted in vLLM's real path, for ``framework.spec_decode``'s tests.

Each adapter is the real in-process vLLM adapter whose ``generate`` runs with one defect switched
on: a verifier that accepts every draft token (vLLM's rejection sampler told that the target
agrees with each draft), and a drafter that never proposes anything (the n-gram proposer returns
no drafts). In-process vLLM runs its engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set by the adapter), so a module attribute patched here is what the engine calls. Scoped to
``generate`` like the kernel defects of :mod:`tests.steps.frameworks.planted`: the plain instance
has no drafts to verify either way, and ``score`` (the teacher-forced rows) stays healthy. Ladders
name them as ``framework: "tests.steps.frameworks.planted_spec:NAME"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from adaptcheck.frameworks.base import Generation, GenRequest
from adaptcheck.frameworks.vllm_fw import VllmFramework


@contextlib.contextmanager
def _patched(module: Any, attr: str, value: Any) -> Iterator[None]:
    old = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, old)


class _PlantedVllm(VllmFramework):
    """Runs ``generate`` inside :meth:`defect`."""

    def defect(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        with self.defect():
            return super().generate(requests)


class AcceptAllDrafts(_PlantedVllm):
    """The verifier accepts every draft token: the target logits it sees are raised at each draft
    token above their maximum, so vLLM's own greedy kernel finds the target "agreeing" everywhere.
    The returned logprobs still come from the untouched logits; only the choice is wrong."""

    display_name = "planted: speculative verifier accepts every draft token"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        from vllm.v1.sample import rejection_sampler as rs

        real = rs.rejection_sample

        def accept_all(draft_token_ids: Any, num_draft_tokens: Any, max_spec_len: Any, cu_num_draft_tokens: Any,
                       draft_probs: Any, target_logits: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            if draft_token_ids.numel():
                target_logits = target_logits.clone()
                rows = torch.arange(draft_token_ids.shape[0], device=target_logits.device)
                ids = draft_token_ids.long().clamp(min=0)
                target_logits[rows, ids] = target_logits.max(dim=-1).values + 1.0
            return real(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                        target_logits, *args, **kwargs)

        return _patched(rs, "rejection_sample", accept_all)


class NeverDrafts(_PlantedVllm):
    """The n-gram drafter proposes nothing, ever: speculation is configured, the answers are the
    plain run's, and only the "feature active" row can tell."""

    display_name = "planted: n-gram drafter never drafts"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        def propose(self: Any, num_speculative_tokens: int, sampled_token_ids: list[list[int]],
                    *args: Any, **kwargs: Any) -> list[list[int]]:
            return [[] for _ in sampled_token_ids]

        return _patched(NgramProposer, "propose", propose)
