"""Teacher-forced scoring and layer implementations of the real vLLM, in process.

One vLLM load (fp32, eager, prefix caching on) is shared by the module; the float64
transformers reference of the same token sequences is computed before it, so nothing
vLLM sets up in the process can touch the reference.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptcheck.frameworks.base import FrameworkError, LoadOptions, ScoreRequest
from adaptcheck.frameworks.vllm_fw import SCORE_MAX_LOGPROBS, VllmFramework

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
              pytest.mark.slow]  # real processes or servers: outside the fast lane

PROMPTS = ["The history of the printing press", "Once upon a time in a small village", "def fibonacci(n):"]
CONTINUATION = 24
"""Greedy float64 tokens appended to each prompt: the scored positions."""
FP32_MAX_DLOGPROB = 1e-3
"""fp32 vLLM vs float64 on CPU measured 1e-5 here; 100x margin, still far below a real defect (>0.05)."""


def reference_logprobs(model_path: Path) -> list[tuple[list[int], int, list[list[float]]]]:
    """(sequence, start, float64 log-softmax rows for positions start..len-1) per prompt."""
    import torch
    from transformers import AutoTokenizer

    from adaptcheck.frameworks.synthetic import load_reference

    tok = AutoTokenizer.from_pretrained(str(model_path))
    ref = load_reference(model_path)
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            seq = ref.generate(torch.tensor([ids]), max_new_tokens=CONTINUATION, min_new_tokens=CONTINUATION,
                               do_sample=False, pad_token_id=0)[0].tolist()
            rows = torch.log_softmax(ref(torch.tensor([seq])).logits[0].double(), dim=-1)
            out.append((seq, len(ids), rows[len(ids) - 1: len(seq) - 1].tolist()))
    return out


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> list[tuple[list[int], int, list[list[float]]]]:
    return reference_logprobs(tiny_llama)


@pytest.fixture(scope="module")
def vllm_fp32(tiny_llama: Path, reference: list[tuple[list[int], int, list[list[float]]]]) -> Iterator[VllmFramework]:
    fw = VllmFramework()
    fw.load(LoadOptions(model_path=tiny_llama, dtype="fp32", max_model_len=512, enable_prefix_caching=True,
                        compile=False), "cpu")
    try:
        yield fw
    finally:
        fw.shutdown()


def test_scores_agree_with_the_float64_reference(vllm_fp32: VllmFramework,
                                                 reference: list[tuple[list[int], int, list[list[float]]]]) -> None:
    scored = vllm_fp32.score([ScoreRequest(token_ids=seq, start=start, top_k=10) for seq, start, _ in reference])
    assert len(scored) == len(reference)
    worst = 0.0
    for (seq, start, rows), s in zip(reference, scored, strict=True):
        assert len(s.token_logprobs) == len(s.top_logprobs) == len(seq) - start
        for i, pos in enumerate(range(start, len(seq))):
            row, top = rows[i], s.top_logprobs[i]
            assert seq[pos] in top and top[seq[pos]] == s.token_logprobs[i]
            assert 10 <= len(top) <= 11  # top-10, plus the scored token when it is not among them
            worst = max(worst, abs(s.token_logprobs[i] - row[seq[pos]]))
            assert max(top, key=top.__getitem__) == max(range(len(row)), key=row.__getitem__)
            assert all(abs(lp - row[t]) < FP32_MAX_DLOGPROB for t, lp in top.items())
        assert s.extra["top_k"] == 10 and "top_k_clamped" not in s.extra
    assert worst < FP32_MAX_DLOGPROB


def test_top_k_above_the_cap_is_clamped_and_said(vllm_fp32: VllmFramework,
                                                  reference: list[tuple[list[int], int, list[list[float]]]]) -> None:
    seq, start, _ = reference[0]
    (s,) = vllm_fp32.score([ScoreRequest(token_ids=seq, start=start, top_k=SCORE_MAX_LOGPROBS + 30)])
    assert s.extra["top_k"] == SCORE_MAX_LOGPROBS and str(SCORE_MAX_LOGPROBS + 30) in s.extra["top_k_clamped"]
    assert all(SCORE_MAX_LOGPROBS <= len(top) <= SCORE_MAX_LOGPROBS + 1 for top in s.top_logprobs)
    assert vllm_fp32.describe()["max_logprobs"] == SCORE_MAX_LOGPROBS


def test_a_sequence_without_context_is_refused(vllm_fp32: VllmFramework) -> None:
    with pytest.raises(FrameworkError, match="start must be"):
        vllm_fp32.score([ScoreRequest(token_ids=[1, 2, 3], start=0)])


def test_scored_requests_skip_the_prefix_cache(vllm_fp32: VllmFramework,
                                               reference: list[tuple[list[int], int, list[list[float]]]]) -> None:
    """What score()'s docstring says: prompt logprobs never come from cached KV blocks."""
    from vllm import SamplingParams

    long = (reference[0][0] * 20)[:300]
    plain = SamplingParams(temperature=0.0, max_tokens=1)
    vllm_fp32.llm.generate([{"prompt_token_ids": long}], plain, use_tqdm=False)
    again = vllm_fp32.llm.generate([{"prompt_token_ids": long}], plain, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0  # the cache works for a plain request …
    (s,) = vllm_fp32.score([ScoreRequest(token_ids=long, start=1)])
    assert s.extra["cached_tokens"] == 0  # … and is not read for a scored one
    assert len(s.token_logprobs) == len(long) - 1


def test_implementations_name_what_each_layer_ran(vllm_fp32: VllmFramework) -> None:
    impls = vllm_fp32.implementations()
    assert "error" not in impls, impls
    # On this CPU, RMSNorm's platform method falls back to torch ops; the trace shows them.
    assert impls["RMSNorm"].startswith("forward_cpu -> forward_native") and "aten::" in impls["RMSNorm"]
    assert impls["SiluAndMul"].startswith("forward_") and "aten::silu" in impls["SiluAndMul"]
    assert "CPUAttentionBackend" in impls["Attention"]
    assert vllm_fp32.describe()["implementations"] == impls
    # The trace wrappers are gone: the model's layers run their own forward again.
    from adaptcheck.frameworks import vllm_impl

    leftovers = vllm_fp32.llm.apply_model(
        lambda model: [n for n, m in model.named_modules() if hasattr(m, vllm_impl.TRACE_ATTR) or "forward" in m.__dict__])
    assert leftovers == [[]]


def test_implementations_never_raise() -> None:
    fw = VllmFramework()
    fw.llm = object()  # no apply_model: what a vendor's incompatible LLM class would look like
    impls = fw._find_implementations()
    assert set(impls) == {"error"} and "AttributeError" in impls["error"]
