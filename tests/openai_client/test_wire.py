"""Server answers validated into wire.py's models and folded by the Accumulator: no server needed.

The payloads are the shapes vLLM and transformers serve send (completions, chat, stream events);
the lenient cases are what the client read before the models existed (non-object choices
skipped, a usage that is no object ignored, a missing logprob read as NaN).
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from adaptcheck.openai_client.client import AsyncOpenAIClient
from adaptcheck.openai_client.errors import EndpointProtocolError
from adaptcheck.openai_client.parsing import Accumulator
from adaptcheck.openai_client.records import Capabilities
from adaptcheck.openai_client.wire import CompletionChunk, finite

VLLM_COMPLETION = {
    "id": "cmpl-1", "object": "text_completion", "model": "tiny", "system_fingerprint": "vllm-0.32.0",
    "choices": [{"index": 0, "text": " the", "token_ids": [5, 6], "prompt_token_ids": [1, 2],
                 "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.1, None],
                              "top_logprobs": [{"token_id:5": -0.1, "token_id:9": -2.5}, {"token_id:6": -0.2}]},
                 "finish_reason": "length", "stop_reason": None}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
}
CHAT_ANSWER = {
    "id": "chat-1", "model": "tiny", "prompt_token_ids": [3, 4],
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"},
                 "logprobs": {"content": [{"token": "a", "logprob": -0.5,
                                           "top_logprobs": [{"token": "a", "logprob": -0.5},
                                                            {"token": "b", "logprob": "-inf"}]}]},
                 "finish_reason": "stop", "stop_reason": 7}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def test_a_completion_is_read_field_by_field() -> None:
    acc = Accumulator()
    assert acc.add(VLLM_COMPLETION, chat=False, stream=False) == (" the", 2, "length")
    r = acc.result()
    assert (r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens) == (" the", "length", 2, 2)
    assert r.token_ids == [5, 6] and r.prompt_token_ids == [1, 2]
    assert r.token_logprobs is not None and r.token_logprobs[0] == -0.1 and math.isnan(r.token_logprobs[1])
    assert r.top_logprobs == [{5: -0.1, 9: -2.5}, {6: -0.2}] and r.top_logprobs_text is None
    assert (r.model, r.response_id, r.system_fingerprint, r.stop_reason) == ("tiny", "cmpl-1", "vllm-0.32.0", None)


def test_a_chat_answer_keeps_text_keyed_logprobs() -> None:
    acc = Accumulator()
    assert acc.add(CHAT_ANSWER, chat=True, stream=False) == ("yo", 1, "stop")
    r = acc.result()
    assert r.prompt_token_ids == [3, 4] and r.stop_reason == 7 and r.token_ids is None
    assert r.top_logprobs is None and r.top_logprobs_text == [{"a": -0.5, "b": -math.inf}]


def test_stream_events_fold_into_one_answer() -> None:
    acc = Accumulator()
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
              {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
    assert [acc.add(e, chat=True, stream=True) for e in events] == [
        ("", None, None), ("Hel", None, None), ("lo", None, "stop"), ("", None, None)]
    r = acc.result()
    assert (r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens) == ("Hello", "stop", 4, 2)


def test_what_the_client_skipped_before_is_still_skipped() -> None:
    chunk = CompletionChunk.model_validate(
        {"choices": [{"index": 1, "text": "no"}, "junk", {"text": "yes"}], "usage": "not an object",
         "prompt_token_ids": "not a list"})
    first = chunk.first()
    assert first is not None and first.text == "yes"
    assert chunk.usage is None and chunk.prompt_token_ids is None
    assert CompletionChunk.model_validate({"choices": {"0": {}}}).first() is None
    assert math.isnan(finite(None)) and math.isnan(finite({})) and finite("-inf") == -math.inf and finite(True) == 1.0


def test_an_answer_of_another_shape_is_a_protocol_error() -> None:
    with pytest.raises(ValidationError):
        Accumulator().add({"choices": [{"index": 0, "text": 5}]}, chat=False, stream=False)
    client = AsyncOpenAIClient("http://127.0.0.1:9", model="m")
    with pytest.raises(EndpointProtocolError, match=r"malformed answer \(choices\.0\.message"):
        client._fold(Accumulator(), {"choices": [{"index": 0, "message": "text"}]}, "http://127.0.0.1:9/v1",
                     chat=True, stream=False)


def test_capabilities_as_facts_keep_the_field_order() -> None:
    caps = Capabilities(completions=True, chat=False, rejected_fields=frozenset({"seed", "ignore_eos"}),
                        token_ids=True, logprobs=True, stream_done_marker=False, stream_usage=True,
                        ignore_eos="emulated", metrics=False, system_fingerprint=None)
    facts = caps.facts()
    assert list(facts) == list(vars(caps))
    assert facts["rejected_fields"] == ["ignore_eos", "seed"] and facts["ignore_eos"] == "emulated"
