"""The vision-language model's files and the run-time images, without loading any model (fast):
other embedded models keep their spec hashes, the images are deterministic PNGs, the image content
parts and the placeholder widening follow the processor's rules, vLLM's refusal is worded by vLLM."""

from __future__ import annotations

import json
import zlib

import pytest

from adaptcheck.frameworks import multimodal as mm
from adaptcheck.frameworks import synthetic as syn
from adaptcheck.frameworks.synthetic_families import vlm

SPEC_HASHES = {
    "tiny-llama": "72115b90b3b59986",
    "tiny-llama-draft": "84ff482c99cd3f5a",
    "tiny-moe": "2b2a87334e859c57",
    "tiny-qwen2-d80": "f6b883e103039e16",
}
"""The text models' hashes before the vision model was added (main at 33a0bdb)."""


def test_other_models_keep_their_spec_hash() -> None:
    for name, prefix in SPEC_HASHES.items():
        assert syn.EMBEDDED[name].spec_hash().startswith(prefix), name


def test_the_vlm_tokenizer_adds_the_vision_tokens_after_the_shared_vocabulary() -> None:
    from tokenizers import Tokenizer

    spec = syn.EMBEDDED["tiny-qwen2-vl"]
    files = vlm._tokenizer(spec)
    tok = Tokenizer.from_str(files["tokenizer.json"])
    assert tok.get_vocab_size() == spec.vocab_size == 1028
    assert [tok.token_to_id(t) for t in vlm.VISION_TOKENS] == [1024, 1025, 1026, 1027]
    assert files["tokenizer.json"] != syn._tokenizer_files(syn.EMBEDDED["tiny-llama"])["tokenizer.json"]
    # The shared vocabulary is unchanged below 1024, and the vision tokens are never emitted.
    shared = Tokenizer.from_str(syn._tokenizer_json(1024))
    assert all(tok.id_to_token(i) == shared.id_to_token(i) for i in range(1024))
    assert {1024, 1025, 1026, 1027} <= set(syn.suppressed_token_ids(files["tokenizer.json"]))
    assert syn.suppressed_token_ids(syn._tokenizer_json(1024)) == syn.suppressed_token_ids(
        syn._tokenizer_files(syn.EMBEDDED["tiny-llama"])["tokenizer.json"])
    pre = json.loads(files["preprocessor_config.json"])
    assert pre["max_pixels"] == vlm.MAX_PIXELS and pre["image_processor_type"] == "Qwen2VLImageProcessor"


def test_the_mrope_sections_cover_half_the_head() -> None:
    spec = syn.EMBEDDED["tiny-qwen2-vl"]
    assert sum(spec.knob("mrope_section")) == spec.head_dim // 2
    assert spec.hidden_size // spec.num_heads == spec.head_dim  # qwen2 derives head_dim


@pytest.mark.parametrize("name", mm.IMAGE_NAMES)
def test_images_are_deterministic_pngs(name: str) -> None:
    data = mm.png_bytes(name)
    assert data == mm.png_bytes(name) and data.startswith(b"\x89PNG\r\n\x1a\n")
    arr = mm.image_array(name)
    w, h = (int(x) for x in name.split("-")[1].split("x"))
    assert arr.shape == (h, w, 3)
    # The IDAT payload decodes back to the array (filter byte 0 per row).
    start = data.index(b"IDAT") + 4
    raw = zlib.decompress(data[start:data.index(b"IEND") - 8])
    assert raw == b"".join(b"\x00" + arr[r].tobytes() for r in range(h))
    assert mm.data_url(name).startswith("data:image/png;base64,")
    with pytest.raises(ValueError):
        mm.image_array("noise-8x8")


def test_images_become_content_parts_of_the_first_user_message() -> None:
    msgs = mm.openai_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                              ["gradient-112x84"])
    assert msgs[0] == {"role": "system", "content": "s"}
    parts = msgs[1]["content"]
    assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"] == mm.data_url("gradient-112x84")
    assert parts[1] == {"type": "text", "text": "q"}
    with pytest.raises(ValueError):
        mm.openai_messages([{"role": "system", "content": "s"}], ["gradient-112x84"])


def test_placeholders_widen_one_pad_per_merged_patch() -> None:
    assert mm.expand_image_pads([1, 9, 5, 9], 9, [2, 3]) == [1, 9, 9, 5, 9, 9, 9]
    with pytest.raises(ValueError):
        mm.expand_image_pads([1, 9], 9, [2, 3])


def test_a_text_model_is_never_refused_as_multimodal(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert mm.vision_config(folder) is None and mm.vllm_refusal(folder) is None
