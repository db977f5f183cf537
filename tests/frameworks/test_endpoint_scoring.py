"""Teacher-forced scoring through OpenAI-compatible servers: real ``vllm serve`` and
``transformers serve`` on 127.0.0.1 (the session's servers), and the wrong-server proxy
in front of vLLM for servers that reject or ignore the scoring fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptcheck.frameworks.base import (
    FrameworkConfig,
    LoadOptions,
    ScoreRequest,
    ScoringUnsupported,
)
from adaptcheck.frameworks.endpoint_fw import (
    EndpointFramework,
    VllmServeFramework,
    attention_backend_lines,
)
from adaptcheck.frameworks.server import ManagedServer
from adaptcheck.frameworks.vllm_fw import SCORE_MAX_LOGPROBS
from tests.frameworks.test_vllm_scoring import FP32_MAX_DLOGPROB, reference_logprobs
from tests.steps.frameworks.wrong_server import wrong_server

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

Reference = list[tuple[list[int], int, list[list[float]]]]


@pytest.fixture(scope="module")
def reference(served_model: Path) -> Reference:
    return reference_logprobs(served_model)


def endpoint(url: str, model: Path) -> EndpointFramework:
    fw = EndpointFramework(FrameworkConfig(endpoint_url=url, endpoint_reference=True))
    fw.load(LoadOptions(model_path=model, dtype="fp32"), "cpu")
    return fw


def assert_matches(fw: EndpointFramework, reference: Reference, method: str) -> None:
    scored = fw.score([ScoreRequest(token_ids=seq, start=start, top_k=5) for seq, start, _ in reference])
    for (seq, start, rows), s in zip(reference, scored, strict=True):
        assert s.extra["method"] == method
        assert len(s.token_logprobs) == len(s.top_logprobs) == len(seq) - start
        for i, pos in enumerate(range(start, len(seq))):
            row, top = rows[i], s.top_logprobs[i]
            assert seq[pos] in top and 5 <= len(top) <= 6
            assert abs(s.token_logprobs[i] - row[seq[pos]]) < FP32_MAX_DLOGPROB
            assert max(top, key=top.__getitem__) == max(range(len(row)), key=row.__getitem__)


def test_vllm_serve_scores_with_prompt_logprobs(vllm_server: ManagedServer, served_model: Path,
                                                 reference: Reference) -> None:
    fw = endpoint(vllm_server.base_url, served_model)
    try:
        assert_matches(fw, reference, "prompt_logprobs")
        # K above the server's cap (20 by default): lowered to the cap, and said.
        seq, start, _ = reference[0]
        (s,) = fw.score([ScoreRequest(token_ids=seq, start=start, top_k=SCORE_MAX_LOGPROBS + 5)])
        assert s.extra["top_k"] == SCORE_MAX_LOGPROBS and "max_logprobs" in s.extra["notes"][0]
    finally:
        fw.shutdown()  # the client only: this framework did not start the server


def test_echo_is_the_fallback_where_prompt_logprobs_is_refused(vllm_server: ManagedServer, served_model: Path,
                                                                reference: Reference) -> None:
    with wrong_server(vllm_server.base_url, "no_prompt_logprobs") as url:
        fw = endpoint(url, served_model)
        assert_matches(fw, reference, "echo")
        assert fw.client is not None and fw.client.aio.score_method == "echo"


@pytest.mark.parametrize(("mode", "said"), [
    ("rejects_scoring", ("rejects prompt_logprobs (400: Unrecognized request argument supplied: prompt_logprobs) "
                         "and rejects echo (400")),
    ("ignores_scoring", "ignores prompt_logprobs"),
])
def test_a_server_that_cannot_score_says_why(vllm_server: ManagedServer, served_model: Path, reference: Reference,
                                             mode: str, said: str) -> None:
    seq, start, _ = reference[0]
    with wrong_server(vllm_server.base_url, mode) as url:
        fw = endpoint(url, served_model)
        with pytest.raises(ScoringUnsupported, match=r"^the server ") as info:
            fw.score([ScoreRequest(token_ids=seq, start=start)])
        assert said in str(info.value) and "\n" not in str(info.value)
        # Learnt once: the next call answers the same without asking the server again.
        with pytest.raises(ScoringUnsupported, match=re.escape(str(info.value))):
            fw.score([ScoreRequest(token_ids=seq, start=start)])


def test_transformers_serve_cannot_score(transformers_server: ManagedServer, served_model: Path,
                                         reference: Reference) -> None:
    seq, start, _ = reference[0]
    fw = endpoint(transformers_server.base_url, served_model)
    with pytest.raises(ScoringUnsupported) as info:
        fw.score([ScoreRequest(token_ids=seq, start=start)])
    # Measured on transformers 5.19: prompt_logprobs is an unexpected field (422); echo with a
    # token-id prompt is a 400 ("prompt must be a string").
    assert "rejects prompt_logprobs (422: Unexpected fields" in str(info.value)
    assert "rejects echo (400: prompt must be a string" in str(info.value)
    assert fw.implementations() == {}


def test_launched_vllm_reports_what_its_log_says(vllm_server: ManagedServer, tmp_path: Path) -> None:
    fw = VllmServeFramework()
    fw.server = vllm_server  # borrowed: never shut down here
    try:
        impls = fw.implementations()
    finally:
        fw.server = None
    assert impls["layers"] == "not visible through the HTTP API"
    assert "CPU_ATTN" in impls["attention"]  # vLLM on CPU names no backend in its log
    log = tmp_path / "vllm.log"
    log.write_text("INFO [cuda.py:446] Using FLASH_ATTN backend.\nINFO Using LBHNC KV cache layout.\n"
                   "INFO Using backend TORCH_SDPA for vit attention\nINFO Using FLASH_ATTN backend.\n")
    assert attention_backend_lines(log) == ["FLASH_ATTN", "TORCH_SDPA for vit attention"]


def test_launched_vllm_gets_max_logprobs_unless_the_user_set_it(tmp_path: Path) -> None:
    fw = VllmServeFramework()
    assert fw._server_args(LoadOptions(model_path=tmp_path))[-2:] == ["--max-logprobs", str(SCORE_MAX_LOGPROBS)]
    mine = LoadOptions(model_path=tmp_path, extra={"server_args": ["--max-logprobs=5"]})
    assert fw._server_args(mine) == ["--max-logprobs=5"]
