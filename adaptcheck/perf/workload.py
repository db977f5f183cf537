"""The serving workload: prompts of exact token lengths, fixed output lengths, mixed shapes, seeds.

Responsible for *what* the load generator sends, decided before any clock starts:

- a prompt of exactly ``input_tokens`` tokens as the server will count them (special
  tokens the tokenizer adds, such as BOS, included — vLLM's random dataset counts the
  same way), made of random token ids, decoded, re-encoded and adjusted until the
  re-encoded length is right (a BPE may merge neighbours into fewer tokens, or split a
  decoded byte sequence into more);
- a different random seed for every request, derived from (workload seed, level, run,
  phase, index): no two requests share a prefix, so a prefix cache cannot serve a repeat
  and make the second run look faster than the first;
- mixed lengths by smooth weighted round-robin: each run sees the same proportions, in
  the same interleaved order, whatever its length;
- the output length is ``max_tokens``, made fixed by ``ignore_eos`` (the client drops or
  emulates it where a server does not accept it).

Without a local tokenizer (an endpoint of unknown weights) the prompt is plain words,
adjusted to the exact length by the server's own count where it has ``/tokenize`` (vLLM,
SGLang: :func:`server_token_counter`), else of about the right length (its real length is
then taken from the server's ``usage``).

A chat-only endpoint (no ``/v1/completions``) gets the prompt as one user message: the
length that counts is then that of the templated conversation, so the chat template's own
tokens are taken off the content (local tokenizer: ``apply_chat_template``; server:
``/tokenize`` with ``messages``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from adaptcheck.openai_client.errors import EndpointError
from adaptcheck.openai_client.sync import OpenAIClient

POOL_TARGET = 2000
"""Token ids sampled for the prompt pool: plenty for random text, cheap for 150k vocabularies."""
MAX_ADJUST_ROUNDS = 12
_WORDS_TEXT = ("time year people way day man thing woman life child world school state family student group "
          "country problem hand part place case week company system program question work government "
          "number night point home water room mother area money story fact month lot right study book "
          "eye job word business issue side kind head house service friend father power hour game line")


class TokenCounter(Protocol):
    """The server's count of a prompt's tokens (special tokens / chat template included); None: cannot say."""

    def __call__(self, text: str, *, chat: bool) -> int | None: ...


class _ServerCounter:
    """:class:`TokenCounter` through the server's ``/tokenize``."""

    def __init__(self, client: OpenAIClient) -> None:
        self.client = client

    def __call__(self, text: str, *, chat: bool) -> int | None:
        try:
            if chat:
                return self.client.tokenize(messages=[{"role": "user", "content": text}])
            return self.client.tokenize(text)
        except EndpointError:
            return None  # a failed count: the prompt stays approximate, usage says how long it was


def server_token_counter(base_url: str, model: str | None = None) -> TokenCounter | None:
    """A counter through ``base_url``'s ``/tokenize`` when the server has one (asked once, now), else None."""
    client = OpenAIClient(base_url, model=model, timeout_s=30.0)
    try:
        if client.tokenize("Hello") is None:
            return None
    except EndpointError:
        return None
    return _ServerCounter(client)


def prompt_factory(base_url: str, tokenizer: Any | None, model: str | None = None) -> PromptFactory:
    """The factory for a server: its local tokenizer, else its ``/tokenize`` where it has one."""
    return PromptFactory(tokenizer, None if tokenizer is not None else server_token_counter(base_url, model))


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the workload uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class Shape:
    """One request shape: input and output lengths in tokens, and its share of a mix."""

    input_tokens: int
    output_tokens: int
    weight: float = 1.0


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready to send."""

    index: int
    prompt: str
    input_tokens: int | None
    """Prompt length as the local tokenizer counts it (None without one)."""
    output_tokens: int
    """max_tokens (the fixed output length with ignore_eos)."""
    seed: int
    length_error: int = 0
    """Re-encoded length − target, when adjusting could not hit it exactly (rare)."""


def request_seed(base: int, level: int, run: int, phase: str, index: int) -> int:
    """Deterministic, distinct per request: same inputs → same prompt, any other input → another."""
    return random.Random(f"{base}:{level}:{run}:{phase}:{index}").randrange(2**62)


class PromptFactory:
    """Builds prompts of an exact token length from random token ids (see module doc)."""

    def __init__(self, tokenizer: Any | None, counter: TokenCounter | None = None) -> None:
        self.tokenizer = tokenizer
        self.counter = counter if tokenizer is None else None  # the local tokenizer is exact and free
        self.chat = False
        self.num_special = 0
        self._pool: list[int] = []
        if tokenizer is not None:
            self.num_special = int(getattr(tokenizer, "num_special_tokens_to_add", lambda: 0)())
            self._pool = self._build_pool(tokenizer)

    @property
    def lengths(self) -> str:
        """How exact the prompt lengths are (for the scenario's workload facts)."""
        if self.tokenizer is not None:
            return "exact (local tokenizer" + (", chat template included)" if self.chat else ")")
        if self.counter is not None:
            return "exact (server /tokenize" + (", chat template included)" if self.chat else ")")
        return "approximate (no local tokenizer, no server /tokenize)"

    def use_chat(self) -> None:
        """Prompts go out as one user message (a chat-only endpoint): count the template's tokens too."""
        if self.chat:
            return
        self.chat = True
        if self.tokenizer is not None:
            probe = " hello world"
            try:
                templated = self.tokenizer.apply_chat_template([{"role": "user", "content": probe}],
                                                               add_generation_prompt=True, tokenize=True)
                if isinstance(templated, dict) or hasattr(templated, "keys"):  # a BatchEncoding
                    templated = templated["input_ids"]
                self.num_special = len(templated) - len(self.tokenizer.encode(probe, add_special_tokens=False))
            except Exception:  # noqa: BLE001 - no chat template: the server's usage says how long it was
                self.num_special = 0

    @staticmethod
    def _build_pool(tok: Any) -> list[int]:
        """Ids that round-trip alone and start a word: sequences of them re-encode (nearly)
        to themselves, so adjusting converges in a round or two."""
        special = set(getattr(tok, "all_special_ids", []) or [])
        size = len(tok)
        rng = random.Random(0)
        candidates = [i for i in rng.sample(range(size), min(size, POOL_TARGET * 3)) if i not in special]
        pool = []
        for i in candidates:
            text = tok.decode([i])
            if (len(text) >= 2 and text[0] == " " and text[1:].isalpha() and text.isascii()
                    and tok.encode(text, add_special_tokens=False) == [i]):
                pool.append(i)
                if len(pool) >= POOL_TARGET:
                    break
        # An unusual vocabulary (no word-start tokens): any non-special id, adjusted by re-encoding.
        return sorted(pool) if len(pool) >= 50 else [i for i in candidates if i not in special]

    def prompt(self, n_tokens: int, seed: int) -> tuple[str, int | None, int]:
        """(text, its length in tokens as the server counts it or None, length error)."""
        rng = random.Random(seed)
        if self.tokenizer is None:
            # About 1.3 tokens per English word in common BPE vocabularies; the server's usage says.
            vocabulary = _WORDS_TEXT.split()
            words = [rng.choice(vocabulary) for _ in range(max(1, round(n_tokens / 1.3)))]
            if self.counter is not None:
                return self._counted(words, n_tokens, rng, vocabulary)
            return " ".join(words), None, 0
        tok = self.tokenizer
        target = max(1, n_tokens - self.num_special)
        ids = [rng.choice(self._pool) for _ in range(target)]
        text = ""
        encoded: list[int] = []
        for _ in range(MAX_ADJUST_ROUNDS):
            text = tok.decode(ids, skip_special_tokens=False)
            encoded = tok.encode(text, add_special_tokens=False)
            if len(encoded) == target:
                break
            ids = encoded[:target] if len(encoded) > target else encoded + [
                rng.choice(self._pool) for _ in range(target - len(encoded))]
        actual = len(encoded) + self.num_special
        return text, actual, actual - max(n_tokens, self.num_special + 1)

    def _counted(self, words: list[str], n_tokens: int, rng: random.Random,
                 vocabulary: list[str]) -> tuple[str, int | None, int]:
        """Words adjusted until the server counts ``n_tokens``: cut in proportion while too long,
        then grown by whole words while a word surely fits (at the most tokens a word took so
        far), then by single letters (a token each in common vocabularies) up to the length."""
        assert self.counter is not None
        best: tuple[str, int] | None = None
        count: int | None = None
        for _ in range(3 * MAX_ADJUST_ROUNDS):
            text = " ".join(words)
            count = self.counter(text, chat=self.chat)
            if count is None:
                return text, None, 0
            if best is None or abs(count - n_tokens) < abs(best[1] - n_tokens) or (
                    abs(count - n_tokens) == abs(best[1] - n_tokens) and count < best[1]):
                best = (text, count)
            if count == n_tokens:
                break
            if count > n_tokens:
                if len(words) == 1:
                    break  # one word is already too long (a chat template longer than asked)
                words = words[:max(1, min(len(words) - 1, len(words) * n_tokens // count))]
                continue
            per_word = max(1, -(-count // len(words)))  # ceil: a pessimistic tokens-per-word
            more = (n_tokens - count) // per_word
            words += [rng.choice(vocabulary) for _ in range(more)] if more > 1 else [rng.choice("aio")]
        assert best is not None
        return best[0], best[1], best[1] - n_tokens


class Workload:
    """Which request is sent as number ``index`` of a (level, run, phase) stream."""

    def __init__(self, shapes: Sequence[Shape], factory: PromptFactory, seed: int = 0) -> None:
        if not shapes:
            raise ValueError("a workload needs at least one request shape")
        if any(s.input_tokens < 1 or s.output_tokens < 1 or s.weight <= 0 for s in shapes):
            raise ValueError("request shapes need input_tokens ≥ 1, output_tokens ≥ 1 and weight > 0")
        self.shapes = list(shapes)
        self.factory = factory
        self.seed = seed
        self._cache: dict[tuple[int, int, str, int], PreparedRequest] = {}
        self._order: list[int] = []
        self._credit = [0.0] * len(self.shapes)

    def shape(self, index: int) -> Shape:
        """Smooth weighted round-robin: proportional to the weights and interleaved, the same in every run."""
        if len(self.shapes) == 1:
            return self.shapes[0]
        total = sum(s.weight for s in self.shapes)
        while len(self._order) <= index:  # extended as far as asked, once
            self._credit = [c + s.weight for c, s in zip(self._credit, self.shapes, strict=True)]
            pick = max(range(len(self._credit)), key=lambda k: self._credit[k])
            self._credit[pick] -= total
            self._order.append(pick)
        return self.shapes[self._order[index]]

    def request(self, level: int, run: int, phase: str, index: int) -> PreparedRequest:
        """Request ``index`` of the stream (built once, then cached)."""
        key = (level, run, phase, index)
        if key not in self._cache:
            shape = self.shape(index)
            seed = request_seed(self.seed, level, run, phase, index)
            text, n_in, err = self.factory.prompt(shape.input_tokens, seed)
            self._cache[key] = PreparedRequest(index=index, prompt=text, input_tokens=n_in,
                                               output_tokens=shape.output_tokens, seed=seed, length_error=err)
        return self._cache[key]

    def prepare(self, level: int, run: int, phase: str, count: int) -> list[PreparedRequest]:
        """The first ``count`` requests of a stream, built now (before the measured window)."""
        return [self.request(level, run, phase, i) for i in range(count)]

    def forget(self, level: int, run: int) -> None:
        """Drop a finished run's prompts (a long stability run builds many)."""
        self._cache = {k: v for k, v in self._cache.items() if k[:2] != (level, run)}
