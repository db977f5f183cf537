"""Vision family (encoder_attention, patch_embed, mrope, vision_rope_2d): the torch provider and
correct rewrites pass across seeds, the planted defects (tests/steps/ops/vision_defects.py) fail;
one test runs vLLM's own layers (skipped without vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.vision import MropeCase, VisionRopeCase, mrope_positions, vision_positions
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from tests.steps.ops import vision_defects as d

ALL = ["fp32", "bf16", "fp16"]
ATTN = [{"name": "three_images", "num_q_heads": 2, "num_kv_heads": 2, "head_size": 80, "image_tokens": [24, 4, 9]},
        {"name": "gqa_one_token_image", "num_q_heads": 4, "num_kv_heads": 2, "head_size": 72,
         "image_tokens": [1, 16], "logit_std": 4.0}]
PATCH = [{"name": "odd_image", "num_patches": 7, "embed_dim": 64},
         {"name": "video_bias_p16", "num_patches": 5, "embed_dim": 48, "video": True, "bias": True,
          "patch_size": 16}]
MROPE = [{"name": "image", "num_q_heads": 2, "num_kv_heads": 1, "grid_thw": [1, 4, 6]},
         {"name": "video_partial", "num_q_heads": 2, "num_kv_heads": 1, "head_size": 128, "rotary_dim": 64,
          "mrope_section": [8, 12, 12], "grid_thw": [2, 2, 4], "temporal_stride": 2, "start": 300}]
MROPE_INTERLEAVED = [{"name": "qwen3", "num_q_heads": 2, "num_kv_heads": 1, "mrope_section": [24, 20, 20],
                      "interleaved": True, "grid_thw": [1, 4, 6]}]
VROPE = [{"name": "two_images", "grids": [[1, 4, 6], [2, 2, 4]], "num_heads": 2}]
CASES = {"encoder_attention": ATTN, "patch_embed": PATCH, "mrope": MROPE + MROPE_INTERLEAVED,
         "vision_rope_2d": VROPE}


def _run(provider: OpProvider, op: str, dtypes: list[str], cases: Sequence[Mapping[str, object]],
         seed: int = 0) -> dict[str, Status]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, provider=provider.name, dtypes=dtypes, cases=list(cases), budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(provider).run(ctx, params)}


def _fn(op: str, fn: Callable[..., Any]) -> OpProvider:
    return DictProvider("under_test", {op: fn})


@pytest.mark.parametrize("seed", range(5))
def test_torch_provider_passes_across_seeds(seed: int) -> None:
    dtypes = ALL if seed == 0 else ["fp32", "bf16"]  # fp16 once: its path is the bf16 one
    for op, cases in CASES.items():
        assert set(_run(_fn(op, get_op(op).native), op, dtypes, cases, seed).values()) == {Status.PASS}, op


def test_correct_rewrites_pass() -> None:
    assert set(_run(_fn("encoder_attention", d.attention_per_image_loop), "encoder_attention", ["fp32", "bf16"],
                    ATTN).values()) == {Status.PASS}
    assert set(_run(_fn("patch_embed", d.patch_as_linear), "patch_embed", ["fp32", "bf16"],
                    PATCH).values()) == {Status.PASS}


@pytest.mark.parametrize(("op", "wrong", "cases"), [
    ("encoder_attention", d.attention_causal, ATTN[:1]),
    ("encoder_attention", d.attention_across_images, ATTN[:1]),
    ("patch_embed", d.patch_frame_major, PATCH[:1]),   # repeated frames: still caught
    ("patch_embed", d.patch_frame_major, PATCH[1:]),
    ("mrope", d.mrope_hw_swapped, MROPE[:1]),
    ("mrope", d.mrope_temporal_only, MROPE[:1]),
    ("mrope", d.mrope_chunked_always, MROPE_INTERLEAVED),
    ("vision_rope_2d", d.vision_rope_hw_swapped, VROPE),
], ids=lambda v: getattr(v, "__name__", None))
def test_planted_defects_fail_in_every_dtype(op: str, wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run(_fn(op, wrong), op, ALL, cases) == dict.fromkeys(ALL, Status.FAIL)


def test_mrope_positions_follow_a_prompt_with_an_image_in_the_middle() -> None:
    case = MropeCase.model_validate({"name": "p", "num_q_heads": 1, "num_kv_heads": 1, "text_before": 2,
                                     "grid_thw": [2, 2, 3], "temporal_stride": 4, "text_after": 2, "start": 10})
    pos = mrope_positions(case)
    assert pos[:, :2].tolist() == [[10, 11]] * 3                       # text: three equal rows
    assert pos[:, 2:5].tolist() == [[12, 12, 12], [12, 12, 12], [12, 13, 14]]  # frame 0, row 0
    assert pos[0, 8:14].tolist() == [16] * 6                           # frame 1: temporal += stride
    assert pos[:, -2:].tolist() == [[17, 18]] * 3                      # text after the image's largest position
    with pytest.raises(ValueError, match="add up"):
        MropeCase.model_validate({"name": "bad", "num_q_heads": 1, "num_kv_heads": 1, "mrope_section": [16, 24, 16]})


def test_vision_positions_are_ordered_by_merge_window() -> None:
    case = VisionRopeCase.model_validate({"name": "w", "grids": [[1, 2, 4]], "num_heads": 1})
    assert vision_positions(case).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]


def test_cases_shrink_but_keep_their_point() -> None:
    from adaptcheck.steps.ops.families.vision import EncoderAttentionCase, PatchEmbedCase

    attn = EncoderAttentionCase.model_validate(ATTN[0] | {"num_q_heads": 16, "num_kv_heads": 16})
    small = attn.scaled(0.01)
    assert len(small.image_tokens) == 3 and small.work() < attn.work()
    patch = PatchEmbedCase.model_validate({"name": "p", "num_patches": 1025, "embed_dim": 1280}).scaled(0.1)
    assert patch.num_patches % 2 == 1 and patch.patch_size == 14


@pytest.mark.slow
def test_vllm_layers_pass_and_defects_around_them_fail() -> None:
    pytest.importorskip("vllm")
    from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

    provider = VllmProvider()
    assert provider.available()[0]
    assert {"encoder_attention", "patch_embed", "mrope", "vision_rope_2d"} <= set(provider.ops())
    for op, cases in CASES.items():
        assert set(_run(provider, op, ["fp32", "bf16"], cases).values()) == {Status.PASS}, op
    planted: list[tuple[str, Callable[..., Any], list[dict[str, Any]]]] = [
        ("encoder_attention", d.vllm_attention_across_images, ATTN[:1]),
        ("patch_embed", d.vllm_patch_frame_major, PATCH[1:]),
        ("mrope", d.vllm_mrope_text_positions, MROPE[:1]),
        ("mrope", d.vllm_mrope_hw_swapped, MROPE[:1])]
    for op, wrong, cases in planted:
        assert _run(_fn(op, wrong), op, ["fp32", "bf16"], cases) == dict.fromkeys(["fp32", "bf16"], Status.FAIL), \
            wrong.__name__
    from adaptcheck.steps.ops.providers import vllm_vision

    assert vllm_vision.encoder_backend(torch.bfloat16) == "TORCH_SDPA"  # vLLM's ViT backend on CPU
