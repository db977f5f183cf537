"""Reading servers' answers: base URLs and the API key, error bodies made one line, connection
failures named, score alternatives, and the stream accumulator that folds server-sent events
into a :class:`~adaptcheck.openai_client.records.CompletionResult`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from adaptcheck.openai_client.errors import EndpointStatusError
from adaptcheck.openai_client.records import CompletionResult
from adaptcheck.openai_client.wire import CompletionChunk, Logprobs, Usage
from adaptcheck.openai_client.wire import finite as finite

API_KEY_ENV_VARS = ("ADAPTCHECK_API_KEY", "OPENAI_API_KEY")
"""Where the API key is read from, first set wins. There is deliberately no parameter: a key
on a command line ends up in shell history and process listings."""

_TOKEN_ID_KEY = re.compile(r"^token_id:(-?\d+)$")
MAX_SERVER_MESSAGE = 300
"""Characters of a server's error message kept in an exception (one line for the report)."""


def normalize_base_url(url: str) -> str:
    """``http://host:port``, ``http://host:port/`` or ``…/v1`` → ``http://host:port/v1``.

    A bare ``host:port`` gets ``http://``. The OpenAI routes live under ``/v1``; ``/health``
    and ``/metrics`` under the root, which is this without ``/v1``.
    """
    url = url.strip()
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", url):
        url = "http://" + url
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return url


def api_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The API key from ``ADAPTCHECK_API_KEY`` or ``OPENAI_API_KEY`` (None when neither is set)."""
    env = os.environ if environ is None else environ
    for name in API_KEY_ENV_VARS:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def one_line(text: str, limit: int = MAX_SERVER_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_error_message(body: bytes | str) -> str:
    """The human part of an error body, whatever the server's shape, on one short line.

    OpenAI / vLLM: ``{"error": {"message": …}}``; older vLLM: ``{"object": "error",
    "message": …}``; FastAPI (transformers): ``{"detail": "…"}`` or a list of
    ``{"loc", "msg"}``; anything else: the text itself.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        return one_line(text) or "(empty body)"
    msg: Any = data
    if isinstance(data, dict):
        if "error" in data:
            err = data["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
        elif "detail" in data:
            detail = data["detail"]
            if isinstance(detail, list):
                parts = []
                for item in detail:
                    if isinstance(item, dict):
                        loc = ".".join(str(p) for p in item.get("loc", []))
                        parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
                    else:
                        parts.append(str(item))
                msg = "; ".join(parts)
            else:
                msg = detail
        elif "message" in data:
            msg = data["message"]
    return one_line(msg if isinstance(msg, str) else json.dumps(msg)) or "(empty body)"


def connect_failure(exc: BaseException) -> str | None:
    """The OS-level reason under an httpx connect error ("connection refused" …), if any.

    httpx words it "All connection attempts failed"; the errno sits in the chained OSError.
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno is not None:
            if isinstance(seen, ConnectionRefusedError):
                return "connection refused"
            return (seen.strerror or str(seen)).lower()
        if isinstance(seen, OSError) and "refused" in str(seen).lower():
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    return None


def token_id(key: str) -> int | None:
    m = _TOKEN_ID_KEY.match(key)
    return int(m.group(1)) if m else None


MAX_SCORE_ALTERNATIVES = 1024
"""Most alternatives one scored position may carry (K is at most a few tens; more is a
malformed answer, not something to hold in memory)."""
_LOGPROBS_CAP = re.compile(r"max(?:imum)?(?: allowed)?\D{0,8}(\d{1,6})", re.IGNORECASE)


class NotScored(Exception):
    """A scoring method the server does not offer (internal: the next method is tried)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refusal(exc: EndpointStatusError) -> bool:
    """An answer that means "not this request" (a client error), not a broken server."""
    return exc.status in (400, 404, 405, 422, 501)


def logprobs_cap(message: str) -> int | None:
    """The server's logprobs cap named in a refusal ("… greater than max allowed: 20"), if any."""
    if "logprob" not in message.lower():
        return None
    m = _LOGPROBS_CAP.search(message)
    return int(m.group(1)) if m else None


def int_key(key: object) -> int | None:
    """A token id from a JSON key: ``"123"`` or ``"token_id:123"``."""
    text = str(key).strip()
    if text.lstrip("-").isdigit() and len(text) <= 12:
        return int(text)
    return token_id(text)


def first_choice(data: Mapping[str, JsonValue]) -> Mapping[str, JsonValue] | None:
    """Answer 0 of a scoring answer (read as plain JSON: its logprob maps are keyed by token)."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return None
    return next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)


class Accumulator:
    """Collects text, ids and logprobs across one answer (non-stream: one 'chunk')."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.ids_given = False
        self.prompt_token_ids: list[int] | None = None
        self.token_logprobs: list[float] = []
        self.top: list[dict[str, float]] = []
        self.logprob_tokens: list[str] = []
        self.logprobs_given = False
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.fingerprint: str | None = None

    def add(self, data: Mapping[str, object], *, chat: bool, stream: bool) -> tuple[str, int | None, str | None]:
        """Fold one response object in; returns (text added, tokens added or None, finish_reason).

        Raises ``pydantic.ValidationError`` when the object is not an answer's shape."""
        chunk = CompletionChunk.model_validate(data)
        self.model = chunk.model or self.model
        self.response_id = chunk.id or self.response_id
        self.fingerprint = chunk.system_fingerprint or self.fingerprint
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chat and chunk.prompt_token_ids is not None:
            self.prompt_token_ids = chunk.prompt_token_ids
        choice = chunk.first()
        if choice is None:
            return "", None, None
        if chat:
            part = choice.delta if stream else choice.message
            text = (part.content if part is not None else None) or ""
        else:
            text = choice.text or ""
        self.text.append(text)
        n_tokens: int | None = None
        if choice.token_ids is not None:
            self.ids_given = True
            self.token_ids.extend(choice.token_ids)
            n_tokens = len(choice.token_ids)
        if not chat and choice.prompt_token_ids is not None:
            self.prompt_token_ids = choice.prompt_token_ids
        if choice.logprobs is not None:
            n_lp = self._add_logprobs(choice.logprobs, chat=chat)
            if n_tokens is None:
                n_tokens = n_lp
        finish = None if choice.finish_reason is None else str(choice.finish_reason)
        if finish is not None:
            self.finish_reason = finish
        if choice.stop_reason is not None:
            self.stop_reason = choice.stop_reason
        return text, n_tokens, finish

    def _add_logprobs(self, lp: Logprobs, *, chat: bool) -> int:
        if chat:
            content = lp.content or []
            for entry in content:
                self.logprobs_given = True
                self.logprob_tokens.append(entry.token)
                self.token_logprobs.append(entry.logprob)
                self.top.append({t.token: t.logprob for t in entry.top_logprobs or []})
            return len(content)
        tokens = lp.tokens or []
        self.logprobs_given = self.logprobs_given or bool(tokens)
        self.logprob_tokens.extend(tokens)
        self.token_logprobs.extend(lp.token_logprobs or [])
        for top in lp.top_logprobs or []:
            self.top.append(dict(top or {}))
        return len(tokens)

    def result(self, **kw: Any) -> CompletionResult:
        token_ids: list[int] | None = self.token_ids if self.ids_given else None
        top_ids: list[dict[int, float]] | None = None
        top_text: list[dict[str, float]] | None = None
        if self.logprobs_given:
            parsed_tokens = [token_id(t) for t in self.logprob_tokens]
            if token_ids is None and parsed_tokens and all(t is not None for t in parsed_tokens):
                token_ids = [t for t in parsed_tokens if t is not None]
            parsed_top = [{token_id(k): v for k, v in pos.items()} for pos in self.top]
            if all(k is not None for pos in parsed_top for k in pos):
                top_ids = [{k: v for k, v in pos.items() if k is not None} for pos in parsed_top]
            else:
                top_text = self.top
        usage = self.usage or Usage()
        return CompletionResult(
            text="".join(self.text),
            finish_reason=self.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            token_ids=token_ids,
            prompt_token_ids=self.prompt_token_ids,
            token_logprobs=self.token_logprobs if self.logprobs_given else None,
            top_logprobs=top_ids,
            top_logprobs_text=top_text,
            stop_reason=self.stop_reason,
            model=self.model,
            response_id=self.response_id,
            system_fingerprint=self.fingerprint,
            **kw,
        )
