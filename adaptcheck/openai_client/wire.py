"""The shapes of what OpenAI-compatible servers answer, as the client reads them: an answer or a
stream event is validated into :class:`CompletionChunk` (as lenient as servers are varied: what a
server leaves out or sends in another shape is absent, never an error) before it is folded into a
``CompletionResult`` (docs/endpoints.md, "How answers are read").
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue


def finite(value: object) -> float:
    """A logprob as a float; NaN for anything that is not a number.

    vLLM may send -inf / NaN as JSON-invalid tokens; json.loads maps them to floats anyway.
    """
    if isinstance(value, (int, float, str)):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _list_or_none(value: object) -> object:
    return value if isinstance(value, list) else None


def _dict_or_none(value: object) -> object:
    return value if isinstance(value, dict) else None


def _dicts(value: object) -> object:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


Logprob = Annotated[float, BeforeValidator(finite)]
"""A logprob as sent: a number, or NaN when it is none."""
Text = Annotated[str, BeforeValidator(str)]
"""A token as text, whatever JSON value it was sent as."""
IdList = Annotated[list[int] | None, BeforeValidator(_list_or_none)]
"""Token ids where the server sent a list; None otherwise."""


class _Wire(BaseModel):
    """Fields the client does not read are ignored."""

    model_config = ConfigDict(extra="ignore")


class Usage(_Wire):
    """``usage``: token counts as the server reports them."""

    prompt_tokens: int | None = Field(default=None, description="Tokens of the prompt.")
    completion_tokens: int | None = Field(default=None, description="Tokens generated.")


class TopLogprob(_Wire):
    """Chat API: one alternative at a position."""

    token: Text = Field(default="", description="The alternative token (vLLM: 'token_id:N').")
    logprob: Logprob = Field(default=math.nan, description="Its logprob.")


class TokenLogprob(_Wire):
    """Chat API: one generated position of ``logprobs.content``."""

    token: Text = Field(default="", description="The generated token (vLLM: 'token_id:N').")
    logprob: Logprob = Field(default=math.nan, description="Its logprob.")
    top_logprobs: list[TopLogprob] | None = Field(default=None, description="The top-N alternatives.")


class Logprobs(_Wire):
    """``choices[].logprobs``: chat's ``content`` list, or the completions API's parallel lists."""

    content: list[TokenLogprob] | None = Field(default=None, description="Chat API: one entry per position.")
    tokens: list[Text] | None = Field(default=None, description="Completions API: the tokens.")
    token_logprobs: list[Logprob] | None = Field(default=None, description="Completions API: their logprobs.")
    top_logprobs: list[dict[str, Logprob] | None] | None = Field(
        default=None, description="Completions API: per position, token -> logprob of the top-N.")


class Message(_Wire):
    """Chat API: ``message`` (an answer) or ``delta`` (a stream event)."""

    content: str | None = Field(default=None, description="The text (None in role-only and final events).")


class Choice(_Wire):
    """One entry of ``choices``."""

    index: JsonValue = Field(default=0, description="Which answer of several; the client reads answer 0.")
    text: str | None = Field(default=None, description="Completions API: the text.")
    message: Message | None = Field(default=None, description="Chat API, whole answer.")
    delta: Message | None = Field(default=None, description="Chat API, stream event.")
    token_ids: IdList = Field(default=None, description="vLLM: generated token ids.")
    prompt_token_ids: IdList = Field(default=None, description="vLLM, completions API: the prompt's token ids.")
    logprobs: Annotated[Logprobs | None, BeforeValidator(_dict_or_none)] = Field(
        default=None, description="Logprobs, when asked for and given.")
    finish_reason: JsonValue = Field(default=None, description="'stop', 'length' or the server's word.")
    stop_reason: str | int | None = Field(default=None, description="vLLM: the stop string or token id that ended it.")


class CompletionChunk(_Wire):
    """One answer (``/v1/completions``, ``/v1/chat/completions``) or one event of its stream."""

    model: str | None = Field(default=None, description="The model name the server answered with.")
    id: str | None = Field(default=None, description="The response id.")
    system_fingerprint: str | None = Field(default=None, description="The server's build (vLLM).")
    usage: Annotated[Usage | None, BeforeValidator(_dict_or_none)] = Field(
        default=None, description="Token counts (streams: the last event, with include_usage).")
    prompt_token_ids: IdList = Field(default=None, description="vLLM, chat API: the prompt's token ids.")
    choices: Annotated[list[Choice], BeforeValidator(_dicts)] = Field(
        default_factory=list, description="The answers (the entries that are objects).")

    def first(self) -> Choice | None:
        """Answer 0 (the only one the client asks for)."""
        return next((c for c in self.choices if c.index == 0), None)
