"""The synthetic models: deterministic bytes, loadable by transformers, probes that hold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from adaptcheck.base.errors import UnknownNameError
from adaptcheck.frameworks import synthetic
from adaptcheck.frameworks.synthetic import (
    BOS_ID,
    EMBEDDED,
    EOS_ID,
    METADATA_FILE,
    PAD_ID,
    embedded_names,
    ensure_model,
    model_dir,
    synthetic_info,
)

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

VARIANTS = ["tiny_llama", "tiny_qwen2_d80", "tiny_moe"]


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def load(folder: Path, dtype: torch.dtype) -> Any:
    kwargs: dict[str, Any] = {"dtype": dtype}
    if json.loads((folder / "config.json").read_text()).get("num_local_experts"):
        kwargs["experts_implementation"] = "eager"  # grouped_mm has no float64 kernel
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), **kwargs).eval()


def greedy(model: Any, tok: Any, prompt: str, max_new_tokens: int, **kw: Any) -> list[int]:
    """transformers' own generate (not adaptcheck's reference loop): an independent witness."""
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, **kw)
    return [int(t) for t in out[0, ids.shape[1]:]]


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


def test_same_seed_gives_byte_identical_files(tiny_llama: Path, tmp_path: Path) -> None:
    # In a fresh process (with another hash seed): tokenizer training and weight drawing
    # must not depend on anything cached in this one.
    code = "import sys; from pathlib import Path; from adaptcheck.frameworks.synthetic import ensure_model; " \
           "print(ensure_model('tiny-llama', root=Path(sys.argv[1])))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600, check=True)
    again = Path(done.stdout.strip().splitlines()[-1])
    assert again.parent == tmp_path
    assert again != tiny_llama
    first, second = file_hashes(tiny_llama), file_hashes(again)
    assert set(first) == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json", METADATA_FILE}
    assert first == second


def test_other_seed_gives_other_weights_same_tokenizer(tiny_llama: Path, tmp_path: Path) -> None:
    other = ensure_model("tiny-llama", seed=1, root=tmp_path)
    a, b = file_hashes(tiny_llama), file_hashes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer.json"] == b["tokenizer.json"]
    assert synthetic_info(other)["seed"] == 1  # type: ignore[index]
    assert "seed1" in other.name


def test_loads_with_auto_classes_and_shapes_match_the_spec(variant: Path) -> None:
    meta = synthetic_info(variant)
    assert meta is not None
    spec = EMBEDDED[meta["name"]]
    config = transformers.AutoConfig.from_pretrained(str(variant))
    assert config.architectures == [spec.architecture]
    assert config.tie_word_embeddings is False
    assert config.max_position_embeddings >= 2048
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert head_dim == spec.head_dim == meta["head_dim"]
    assert head_dim >= 32 and head_dim % 16 == 0  # vLLM's CPU attention supports these

    model = load(variant, torch.float32)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (spec.num_heads * spec.head_dim, spec.hidden_size)
    assert attn.k_proj.weight.shape == (spec.num_kv_heads * spec.head_dim, spec.hidden_size)
    assert (attn.q_proj.bias is not None) == (spec.model_type == "qwen2")
    assert sum(p.numel() for p in model.parameters()) == meta["num_params"]
    # Untied, and the LM head is not the embedding (the model relies on that).
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)

    tok = transformers.AutoTokenizer.from_pretrained(str(variant))
    assert len(tok) == config.vocab_size == spec.vocab_size
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert tok("The morning train").input_ids[0] == BOS_ID


TEXTS = ["The morning train 12345 left.", "  two  spaces\nnew line\n\n", "don't WON'T it's",
         "caf\u00e9 cafe\u0301 \u65e5\u672c", "a1b2c3 3.14159", "<|im_start|>user\nhi<|im_end|>\n"]


def test_transformers_tokenizes_exactly_like_tokenizer_json(variant: Path) -> None:
    """What adaptcheck's probes use (``tokenizers``) and what frameworks use must agree.

    transformers 5 rebuilds a qwen2 tokenizer with its own pipeline: this catches any drift.
    """
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(variant / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(str(variant))
    assert len(auto) == raw.get_vocab_size()
    for text in TEXTS:
        ids = raw.encode(text).ids
        assert auto(text).input_ids == ids, text
        assert auto.decode(ids, skip_special_tokens=True) == raw.decode(ids, skip_special_tokens=True)


def test_moe_variant_is_a_real_moe(tiny_moe: Path) -> None:
    config = json.loads((tiny_moe / "config.json").read_text())
    assert config["num_local_experts"] == 8 and config["num_experts_per_tok"] == 2
    from safetensors import safe_open

    with safe_open(str(tiny_moe / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    # Checkpoint naming (one tensor per expert), as real Mixtral checkpoints and vLLM have it.
    assert "model.layers.0.block_sparse_moe.experts.7.w2.weight" in keys
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys


def test_chat_template_renders_chatml(tiny_llama: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_llama))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|bos|><|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1
    assert ids.count(EOS_ID) == 2  # <|im_end|> is the EOS and one token


def test_eos_comes_at_the_recorded_step_float64(variant: Path) -> None:
    meta = synthetic_info(variant)
    assert meta is not None
    k = meta["eos_step"]
    assert 1 <= k <= 7
    tok = transformers.AutoTokenizer.from_pretrained(str(variant))
    out = greedy(load(variant, torch.float64), tok, meta["eos_probe_prompt"], 16)
    assert out == meta["eos_probe_token_ids"]
    assert len(out) == k + 1 and out[k] == EOS_ID and EOS_ID not in out[:k]


def test_bf16_follows_float64_to_the_eos(variant: Path) -> None:
    """The confidence the init buys: a bf16 run reaches the same EOS at the same step."""
    meta = synthetic_info(variant)
    assert meta is not None and meta["eos_probe_min_logprob_gap"] > 0.5
    tok = transformers.AutoTokenizer.from_pretrained(str(variant))
    assert greedy(load(variant, torch.bfloat16), tok, meta["eos_probe_prompt"], 16) == meta["eos_probe_token_ids"]


def test_stop_probe_string_appears_where_recorded(variant: Path) -> None:
    meta = synthetic_info(variant)
    assert meta is not None
    probe = meta["stop_probe"]
    tok = transformers.AutoTokenizer.from_pretrained(str(variant))
    model = load(variant, torch.float64)
    out = greedy(model, tok, probe["prompt"], probe["max_tokens"])
    text = tok.decode(out, skip_special_tokens=True)
    assert text == probe["greedy_text"]
    assert text.find(probe["stop"]) == len(probe["text_before_stop"])
    assert text.startswith(probe["text_before_stop"])
    # And transformers honours it: generation ends right after the stop string.
    stopped = greedy(model, tok, probe["prompt"], probe["max_tokens"], stop_strings=[probe["stop"]], tokenizer=tok)
    assert len(stopped) == probe["stop_token_index"] + 1
    assert tok.decode(stopped, skip_special_tokens=True).rstrip().endswith(probe["stop"])


def test_generated_text_is_printable_and_free_of_special_tokens(variant: Path) -> None:
    meta = synthetic_info(variant)
    assert meta is not None
    ids = meta["stop_probe"]["greedy_token_ids"]
    assert not {PAD_ID, BOS_ID, 3} & set(ids)
    assert all(c == "\n" or (c.isascii() and c.isprintable()) for c in meta["stop_probe"]["greedy_text"])


def test_second_call_reuses_the_folder(tiny_llama: Path, synthetic_root: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_llama.iterdir()}

    def no_write(*args: object) -> None:
        raise AssertionError("the cached model was written again")

    monkeypatch.setattr(synthetic, "_write_model", no_write)
    assert ensure_model("tiny-llama", root=synthetic_root) == tiny_llama
    assert {p.name: p.stat().st_mtime_ns for p in tiny_llama.iterdir()} == before


def fake_writer(source: Path) -> Any:
    """A stand-in for the generator that copies a finished model (fast)."""
    def write(spec: object, seed: int, out: Path) -> None:
        for f in source.iterdir():
            shutil.copy2(f, out / f.name)
    return write


def test_leftover_temporaries_are_ignored_and_old_ones_removed(tiny_llama: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    final = model_dir("tiny-llama", root=tmp_path)
    young = tmp_path / f".{final.name}.tmp-4242-aaaaaaaa"
    old = tmp_path / f".{final.name}.tmp-4343-bbbbbbbb"
    for leftover in (young, old):
        leftover.mkdir()
        (leftover / "config.json").write_text("{}")  # a half-written model
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    monkeypatch.setattr(synthetic, "_write_model", fake_writer(tiny_llama))

    assert ensure_model("tiny-llama", root=tmp_path) == final
    assert file_hashes(final) == file_hashes(tiny_llama)
    assert young.is_dir()  # may belong to a writer still running
    assert not old.exists()  # an interrupted write, long dead
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, young.name])


def test_interrupted_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(spec: object, seed: int, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "_write_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_model("tiny-llama", root=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert not synthetic.is_complete(model_dir("tiny-llama", root=tmp_path))


def test_losing_a_publishing_race_keeps_the_winner(tiny_llama: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    final = model_dir("tiny-llama", root=tmp_path)
    copy = fake_writer(tiny_llama)

    def racing(spec: object, seed: int, out: Path) -> None:
        copy(spec, seed, out)
        final.mkdir()  # another process publishes while we are still writing
        copy(spec, seed, final)
        (final / "winner").write_text("")

    monkeypatch.setattr(synthetic, "_write_model", racing)
    assert ensure_model("tiny-llama", root=tmp_path) == final
    assert (final / "winner").exists()
    assert [p.name for p in tmp_path.iterdir()] == [final.name]  # our temporary is gone


def test_concurrent_writers_in_two_processes(tiny_llama: Path, tmp_path: Path) -> None:
    code = "import sys; from pathlib import Path; from adaptcheck.frameworks.synthetic import ensure_model; " \
           "print(ensure_model('tiny-llama', root=Path(sys.argv[1])))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    paths = {Path(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs}
    assert [p.returncode for p in procs] == [0, 0]
    assert len(paths) == 1
    (final,) = paths
    assert [p.name for p in tmp_path.iterdir()] == [final.name]  # no temporaries left
    assert file_hashes(final) == file_hashes(tiny_llama)


def test_missing_writer_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptcheck.frameworks.base import FrameworkUnavailable

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(FrameworkUnavailable, match="needs tokenizers: pip install tokenizers"):
        ensure_model("tiny-llama", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'tiny-llama'"):
        ensure_model("tiny-lama")
    assert embedded_names() == sorted(EMBEDDED)
    assert {"tiny-llama", "tiny-qwen2-d80", "tiny-moe"} <= set(embedded_names())


def test_synthetic_info_is_none_for_other_folders(tmp_path: Path, tiny_llama: Path) -> None:
    assert synthetic_info(tmp_path) is None
    (tmp_path / METADATA_FILE).write_text("not json")
    assert synthetic_info(tmp_path) is None
    info = synthetic_info(tiny_llama)
    assert info is not None and info["created_by"] == "adaptcheck" and info["name"] == "tiny-llama"
    assert info["generator_version"] == synthetic.GENERATOR_VERSION
