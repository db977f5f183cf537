"""A synchronous face of :class:`~adaptcheck.openai_client.client.AsyncOpenAIClient` for callers that are not async.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import JsonValue

from adaptcheck.openai_client.client import AsyncOpenAIClient
from adaptcheck.openai_client.records import Capabilities, CompletionResult, ScoreResult

T = TypeVar("T")


class OpenAIClient:
    """Synchronous face of :class:`AsyncOpenAIClient` (same arguments, same methods).

    Each call runs on a fresh event loop (and a fresh connection): simple and safe for
    correctness checks; the load generator should use the async client. Called from a
    thread that already runs an event loop, the call is run on a helper thread.
    """

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        self._aio = AsyncOpenAIClient(base_url, **kwargs)

    def __repr__(self) -> str:
        return repr(self._aio).replace("AsyncOpenAIClient", "OpenAIClient", 1)

    @property
    def aio(self) -> AsyncOpenAIClient:
        """The async client underneath (shares what was learnt: model, rejected fields)."""
        return self._aio

    @property
    def base_url(self) -> str:
        return self._aio.base_url

    @property
    def model(self) -> str | None:
        return self._aio.model

    @property
    def rejected_fields(self) -> set[str]:
        return self._aio.rejected_fields

    def _run(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        async def go() -> T:
            try:
                return await factory()
            finally:
                await self._aio.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(go())
        values: list[T] = []
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                values.append(asyncio.run(go()))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)

        thread = threading.Thread(target=worker, name="adaptcheck-openai-sync")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return values[0]

    def models(self) -> list[str]:
        return self._run(self._aio.models)

    def wait_ready(self, timeout_s: float, alive: Callable[[], bool] | None = None,
                   interval_s: float = 0.25) -> float:
        return self._run(lambda: self._aio.wait_ready(timeout_s, alive, interval_s))

    def completion(self, prompt: str | list[int], **kwargs: Any) -> CompletionResult:
        return self._run(lambda: self._aio.completion(prompt, **kwargs))

    def chat(self, messages: Sequence[Mapping[str, JsonValue]], **kwargs: Any) -> CompletionResult:
        return self._run(lambda: self._aio.chat(messages, **kwargs))

    def metrics_text(self) -> str | None:
        return self._run(self._aio.metrics_text)

    def metrics(self) -> dict[str, float] | None:
        return self._run(self._aio.metrics)

    def probe_capabilities(self, prompt: str = "Hello") -> Capabilities:
        return self._run(lambda: self._aio.probe_capabilities(prompt))

    def score(self, prompt_ids: Sequence[int], **kwargs: Any) -> ScoreResult:
        return self._run(lambda: self._aio.score(prompt_ids, **kwargs))

    def tokenize(self, text: str | None = None, **kwargs: Any) -> int | None:
        return self._run(lambda: self._aio.tokenize(text, **kwargs))
