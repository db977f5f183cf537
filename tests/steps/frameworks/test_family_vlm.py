"""Step 4 on the embedded vision-language model (``embedded:tiny-qwen2-vl``), one small ladder through
the real CLI (slow): load, reference with images in the prompts, and concurrent on transformers; load
and reference on vLLM in process and ``vllm serve`` (image content parts), each certified or n/a with
vLLM's own reason; the two planted defects (M-RoPE sections swapped, image features zeroed) fail the
reference check. Fast tests: the multimodal prompt set and the rows that read images.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from adaptcheck.steps.frameworks.params import TeacherSize
from adaptcheck.steps.frameworks.prompts import image_prompts
from tests.conftest import run_checks

MODEL = "embedded:tiny-qwen2-vl"
SIZE: dict[str, Any] = {"prompts": 2, "long_prompt_tokens": 0, "chat": False, "max_tokens": 12, "images": 2}
"""Two text prompts and two image prompts (one per image size): every check shares this teacher."""
PLANTED = ("SwappedMropeSections", "ZeroedImageFeatures")


def test_a_text_only_teacher_has_no_images() -> None:
    assert TeacherSize().images == 0 and image_prompts(0) == []
    pairs = image_prompts(3)
    assert [img for _, img in pairs] == ["gradient-112x84", "checker-84x112", "gradient-112x84"]


class _TwiceFramework:
    """generate() answers from a counter: the second pass over the same requests can differ."""

    def __init__(self, drift: bool) -> None:
        self.calls, self.drift = 0, drift

    def generate(self, reqs: list[Any]) -> list[Any]:
        from adaptcheck.frameworks.base import Generation

        self.calls += 1
        pads = 12 + (self.calls if self.drift else 0)  # a processor whose widening changes between passes
        return [Generation(token_ids=[5, 6], text="", finish_reason="length", prompt_ids=[1] + [1026] * pads)
                for _ in reqs]


@pytest.mark.parametrize(("drift", "ok"), [(False, True), (True, False)])
def test_the_images_row_needs_identical_inputs_twice(drift: bool, ok: bool) -> None:
    from adaptcheck.frameworks.base import GenRequest
    from adaptcheck.steps.frameworks.kinds.reference import _images_deterministic_row

    req = GenRequest(messages=[{"role": "user", "content": "q"}], images=["gradient-112x84"])
    row = _images_deterministic_row(_TwiceFramework(drift), [req])  # type: ignore[arg-type]
    assert row.ok is ok and ("prompt ids differ" in row.detail) is not ok


def _check(cid: str, kind: str, framework: str, **params: Any) -> dict[str, Any]:
    size = SIZE if kind == "framework.reference" else ({"teacher": SIZE} if kind == "framework.concurrent" else {})
    return {"id": cid, "step": 4, "kind": kind, "params": {"framework": framework, "model": MODEL, "dtype": "bf16",
                                                             **size, **params}}


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    checks = [_check("vlm.tf.load", "framework.load", "transformers"),
              _check("vlm.tf.reference", "framework.reference", "transformers"),
              _check("vlm.tf.concurrent", "framework.concurrent", "transformers", batch=2, max_tokens=8,
                     stream=False)]
    checks += [_check(f"vlm.planted.{name}", "framework.reference", f"tests.steps.frameworks.planted_vlm:{name}",
                      greedy=False) for name in PLANTED]
    if importlib.util.find_spec("vllm") is not None:
        checks += [_check("vlm.vllm.reference", "framework.reference", "vllm", compile=False),
                   _check("vlm.serve.reference", "framework.reference", "vllm_serve", compile=False)]
    return run_checks(tmp_path_factory.mktemp("vlm"), checks, model=MODEL, timeout=1200)


@pytest.mark.slow
def test_healthy_transformers_passes_with_images(vlm_run: dict[str, dict[str, Any]]) -> None:
    for cid in ("vlm.tf.load", "vlm.tf.reference", "vlm.tf.concurrent"):
        assert vlm_run[cid]["status"] == "pass", (cid, vlm_run[cid].get("message"))
    rows = vlm_run["vlm.tf.reference"]["details"]["subchecks"]
    assert any("deterministic" in r["name"] and r["ok"] for r in rows), rows


@pytest.mark.slow
@pytest.mark.parametrize("name", PLANTED)
def test_each_planted_defect_fails_the_reference(vlm_run: dict[str, dict[str, Any]], name: str) -> None:
    c = vlm_run[f"vlm.planted.{name}"]
    assert c["status"] == "fail", c.get("message")
    tf = next(r for r in c["details"]["subchecks"] if r["name"].startswith("teacher-forced"))
    assert tf["ok"] is False, tf


@pytest.mark.slow
def test_vllm_is_certified_or_na_in_its_own_words(vlm_run: dict[str, dict[str, Any]]) -> None:
    """Where vLLM cannot import its Qwen2-VL module (this CPU venv has no torchvision), both rows
    are n/a with that exception; where it can, they pass. Never a pass without running."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    for cid in ("vlm.vllm.reference", "vlm.serve.reference"):
        c = vlm_run[cid]
        if c["status"] == "skip":
            assert c.get("applicable") is False, c
            assert "vLLM cannot inspect Qwen2VLForConditionalGeneration on this host: importing " \
                   "vllm.model_executor.models.qwen2_vl raised" in c["message"], c["message"]
        else:
            assert c["status"] == "pass", (cid, c.get("message"))
