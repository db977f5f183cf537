"""Vision-language defects planted in the real transformers path of ``embedded:tiny-qwen2-vl``, for
the multimodal step-4 test and benchmark: the ladder names them as
``framework: "tests.steps.frameworks.planted_vlm:NAME"``.

Each switches its defect on only while the adapter under test generates or scores (the float64
reference and the CPU control run the same modules healthy), through the loaded model's own
modules: a decoder whose M-RoPE hands the time and height position streams to each other's
frequency bands, and a projector whose output is lost (the image features reach the decoder as zeros).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.steps.frameworks.planted import _Planted


def _modules(model: Any, cls_suffix: str) -> list[Any]:
    found = [m for m in model.modules() if type(m).__name__.endswith(cls_suffix)]
    if not found:
        raise RuntimeError(f"the loaded model has no *{cls_suffix} module to plant the defect in")
    return found


class SwappedMropeSections(_Planted):
    """The decoder's M-RoPE with the time and height sections swapped: the rotary bands of the time
    section turn by the height positions and the height bands by the time positions (the position
    streams permuted as they enter the text model's rotary embedding).

    Text positions are equal in all three streams, so only the image tokens, and what attends to
    them, move. (Swapping the section *sizes* instead, [8, 12, 12] → [12, 8, 12], moved the float64
    answers by a KL of only 4e-4 on the image prompts, near the bf16 control's 3e-4: the four bands
    that change hands turn slowly. Swapping the streams moves the fast time bands: KL 2e-2.)
    """

    display_name = "planted: M-RoPE time/height sections swapped"

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        rotary = [m for m in _modules(self.model, "RotaryEmbedding") if hasattr(m, "mrope_section")]
        if not rotary:
            raise RuntimeError("the loaded model has no M-RoPE rotary embedding (mrope_section)")

        def swapped(pos: Any) -> Any:
            # (3, batch, positions): time, height, width. A text-only call may pass one stream to
            # broadcast; equal streams have nothing to swap.
            return pos[[1, 0, 2]] if pos.dim() == 3 and pos.shape[0] == 3 else pos

        def swap(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if "position_ids" in kwargs:
                kwargs["position_ids"] = swapped(kwargs["position_ids"])
                return args, kwargs
            return (args[0], swapped(args[1]), *args[2:]), kwargs

        hooks = [m.register_forward_pre_hook(swap, with_kwargs=True) for m in rotary]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()


class ZeroedImageFeatures(_Planted):
    """The patch merger's (projector's) output replaced by zeros: the decoder sees the image
    placeholders' positions but none of the picture."""

    display_name = "planted: image features zeroed (projector output dropped)"

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        import torch

        def zeroed(_module: Any, _inputs: Any, output: Any) -> Any:
            return torch.zeros_like(output)

        hooks = [m.register_forward_hook(zeroed) for m in _modules(self.model, "PatchMerger")]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
