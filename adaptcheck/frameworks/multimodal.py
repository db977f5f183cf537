"""Images for multimodal requests: deterministic pictures made at run time (no files shipped),
their PNG bytes and ``data:`` URLs for the OpenAI image content parts, the chat messages that carry
them, and what a framework needs to know about a vision-language model folder (docs/families.md).

An image is named, never passed around as pixels: a request (``GenRequest.images``) and its
cache keys stay small JSON, and every framework decodes the same PNG bytes into the same pixels.
Names are ``KIND-WxH`` with KIND ``gradient`` (smooth colour ramps) or ``checker`` (a
checkerboard of 14-pixel squares, one per vision patch, in two colours).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcheck.base.errors import exception_line
from adaptcheck.frameworks.modelfiles import read_config

if TYPE_CHECKING:
    import numpy as np

IMAGE_NAMES = ("gradient-112x84", "checker-84x112")
"""The images of a multimodal prompt set, in order: two sizes, landscape and portrait, so the
height and width position streams of M-RoPE differ (a transposed one changes the answer)."""

_NAME = re.compile(r"^(gradient|checker)-(\d+)x(\d+)$")


def image_array(name: str) -> np.ndarray:
    """The image ``name`` as a height x width x 3 uint8 array (deterministic)."""
    import numpy as np

    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"unknown image {name!r}: expected gradient-WxH or checker-WxH")
    kind, w, h = m.group(1), int(m.group(2)), int(m.group(3))
    y, x = np.mgrid[0:h, 0:w]
    if kind == "gradient":
        rgb = (x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(w + h - 2, 1))
    else:
        on = ((x // 14) + (y // 14)) % 2 == 1
        rgb = (np.where(on, 230, 20), np.where(on, 40, 200), np.where(on, 90, 160))
    return np.stack(rgb, axis=-1).astype(np.uint8)


def png_bytes(name: str) -> bytes:
    """The image ``name`` as PNG bytes, written here (RGB, 8 bit, no filter): byte-identical on every
    machine and with or without Pillow."""
    arr = image_array(name)
    h, w, _ = arr.shape
    raw = b"".join(b"\x00" + arr[row].tobytes() for row in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def data_url(name: str) -> str:
    """``data:image/png;base64,…`` of the image: what an OpenAI ``image_url`` content part carries."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(name)).decode("ascii")


def pil_image(name: str) -> Any:
    """The image as a Pillow RGB image, decoded from its PNG bytes (what a server decodes too)."""
    import io

    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(name))).convert("RGB")


def openai_messages(messages: list[dict[str, str]], images: list[str]) -> list[dict[str, Any]]:
    """``messages`` with ``images`` as OpenAI ``image_url`` content parts, placed before the text
    of the first user message (the convention of every multimodal request here)."""
    out: list[dict[str, Any]] = []
    placed = False
    for msg in messages:
        if msg.get("role") == "user" and not placed and images:
            parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(n)}} for n in images]
            parts.append({"type": "text", "text": msg.get("content", "")})
            out.append({"role": msg["role"], "content": parts})
            placed = True
        else:
            out.append(dict(msg))
    if images and not placed:
        raise ValueError("a request with images needs a user message to carry them")
    return out


def vision_config(path: Path) -> dict[str, Any] | None:
    """The ``vision_config`` of a model folder's config.json, None for a text-only model."""
    config = read_config(path)
    vision = config.get("vision_config") if config is not None else None
    return vision if isinstance(vision, dict) else None


def architecture(path: Path) -> str | None:
    """``architectures[0]`` of the folder's config.json."""
    config = read_config(path)
    archs = config.get("architectures") if config is not None else None
    return str(archs[0]) if isinstance(archs, list) and archs else None


def vllm_refusal(path: Path) -> str | None:
    """Why vLLM cannot run this vision-language folder here, in vLLM's own words, or None.

    vLLM inspects a model class by importing its module; a multimodal module imports its
    processor's dependencies (Qwen2-VL's needs torchvision through transformers' image processor).
    Importing it here, before an engine starts, gives the same exception vLLM's registry logs,
    in seconds rather than after a failed start-up, and a host without them gets "not applicable
    here" with that reason rather than an error.
    """
    arch = architecture(path)
    if vision_config(path) is None or arch is None:
        return None
    import importlib

    try:
        from vllm.model_executor.models import registry
    except Exception as exc:  # noqa: BLE001 - vLLM's absence is the availability check's business
        return f"vLLM's model registry does not import: {type(exc).__name__}: {exc}"
    entry = getattr(registry, "_MULTIMODAL_MODELS", {}).get(arch)
    if entry is None:
        return None  # not a registry entry this check knows how to probe: let the engine say
    module = f"vllm.model_executor.models.{entry[0]}"
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised is vLLM's reason
        return (f"vLLM cannot inspect {arch} on this host: importing {module} raised "
                f"{type(exc).__name__}: {exc}")
    return None


def expand_image_pads(ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """``ids`` with its i-th lone image pad token widened to ``counts[i]`` pads: what a Qwen2-VL
    processor does to a rendered prompt (one pad per merged patch of each image)."""
    out: list[int] = []
    seen = 0
    for t in ids:
        if t == pad_id:
            if seen >= len(counts):
                raise ValueError(f"the prompt has more image placeholders than the {len(counts)} images given")
            out.extend([pad_id] * counts[seen])
            seen += 1
        else:
            out.append(t)
    if seen != len(counts):
        raise ValueError(f"the prompt has {seen} image placeholders for {len(counts)} images")
    return out


class ImageInputs:
    """A vision-language model folder's image processor and placeholder token, as transformers
    runs them: pixels and grids for named images, and a rendered prompt's pads widened to match.

    transformers 5's ``AutoProcessor`` for Qwen2-VL also builds a video processor, which needs
    torchvision; where that fails the image processor and the tokenizer are used directly, with
    the processor's own expansion rule (:func:`expand_image_pads`), and :attr:`how` says which.
    """

    def __init__(self, path: Path, tokenizer: Any) -> None:
        from transformers import AutoImageProcessor

        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        self.pad_id = int(config["image_token_id"])
        self.merge = int((config.get("vision_config") or {}).get("spatial_merge_size", 2))
        self.tokenizer = tokenizer
        self.processor: Any = None
        try:
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(str(path))
            self.how = "AutoProcessor"
        except Exception as exc:  # noqa: BLE001 - the image processor alone still serves the images
            self.image_processor = AutoImageProcessor.from_pretrained(str(path))
            self.how = (f"{type(self.image_processor).__name__} + tokenizer (AutoProcessor failed: "
                        f"{exception_line(exc)})")
        else:
            self.image_processor = self.processor.image_processor

    def pixels(self, images: list[str]) -> dict[str, Any]:
        """``pixel_values`` and ``image_grid_thw`` (torch tensors) of the named images."""
        out = self.image_processor(images=[pil_image(n) for n in images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def prompt_ids(self, messages: list[dict[str, str]], images: list[str]) -> list[int]:
        """The chat prompt with ``images``, rendered by the model's template and tokenized with the
        pads widened, as the processor gives them."""
        text = self.tokenizer.apply_chat_template(openai_messages(messages, images), add_generation_prompt=True,
                                                  tokenize=False)
        if self.processor is not None:
            enc = self.processor(text=[text], images=[pil_image(n) for n in images], add_special_tokens=False)
            return [int(t) for t in enc["input_ids"][0]]
        grids = self.pixels(images)["image_grid_thw"]
        counts = [int(g.prod()) // (self.merge * self.merge) for g in grids]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return expand_image_pads([int(t) for t in ids], self.pad_id, counts)
