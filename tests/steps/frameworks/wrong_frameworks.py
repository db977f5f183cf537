"""Deliberately wrong frameworks: the real transformers adapter with one defect each.

Ladders in the tests name them as ``framework: "tests.steps.frameworks.wrong_frameworks:NAME"``
(the registry accepts ``module:Class``). Each must be caught by the step-4 check that owns
the defect, while the unmodified adapter passes the same check.
"""

from __future__ import annotations

from adaptcheck.frameworks.base import Generation, GenRequest
from adaptcheck.frameworks.transformers_fw import TransformersFramework


def _unlikely(top: dict[int, float] | None, vocab: int, avoid: int) -> int:
    """A token outside the recorded top-N (so no tolerance rule can excuse it)."""
    taken = set(top or {}) | {avoid}
    t = (max(taken) * 7 + 13) % vocab
    while t in taken or t < 8:  # stay clear of the special tokens
        t = (t + 1) % vocab
    return t


class WrongTokens(TransformersFramework):
    """Answers correctly for three tokens, then emits a token the model would never pick."""

    display_name = "wrong: corrupts the 4th token"

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        out = super().generate(requests)
        for g in out:
            if g.token_ids and len(g.token_ids) > 3:
                top = g.top_logprobs[3] if g.top_logprobs else None
                g.token_ids[3] = _unlikely(top, int(self.model.config.vocab_size), g.token_ids[3])
                if g.top_logprobs:
                    g.top_logprobs[3] = {g.token_ids[3]: -0.01}
                g.text = self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        return out


class IgnoresMaxTokens(TransformersFramework):
    """Generates three tokens more than asked (ignoring EOS), as a server that drops max_tokens."""

    display_name = "wrong: ignores max_tokens"

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        longer = [GenRequest(prompt=r.prompt, prompt_ids=r.prompt_ids, messages=r.messages, max_tokens=r.max_tokens + 3,
                             stop=r.stop, ignore_eos=True, logprobs=r.logprobs) for r in requests]
        return super().generate(longer)


class BatchCrossTalk(TransformersFramework):
    """Alone it is correct; in a batch, request 1 gets request 0's answer (a KV/slot mix-up)."""

    display_name = "wrong: batch cross-talk"

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        out = super().generate(requests)
        if len(out) > 1 and requests[0].prompt != requests[1].prompt:
            out[1] = out[0]
        return out


class IgnoresStop(TransformersFramework):
    """Never stops at stop strings."""

    display_name = "wrong: ignores stop strings"

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        return super().generate([GenRequest(prompt=r.prompt, prompt_ids=r.prompt_ids, messages=r.messages,
                                            max_tokens=r.max_tokens, ignore_eos=r.ignore_eos, logprobs=r.logprobs)
                                 for r in requests])
