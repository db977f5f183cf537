"""The weights audit: a model folder whose checkpoint does not cover its config is refused.

Each broken folder is a copy of an embedded model with one thing changed (more layers in
config.json, a tensor renamed or reshaped, tokens added past the vocabulary); the audit must
refuse it naming the tensors, agree with transformers' own load report
(``from_pretrained(..., output_loading_info=True)``) on what is missing, unexpected and
mismatched, and pass the untouched folder.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.frameworks import weights_audit
from adaptcheck.frameworks.weights_audit import (
    ROW_MISMATCHED,
    ROW_MISSING,
    ROW_TOKENIZER,
    ROW_UNEXPECTED,
    ROW_WEIGHTS,
    WeightsAudit,
    audit_cached,
    audit_model_folder,
    compare_keys,
    summarise_keys,
)

# ------------------------------------------------------------------------- helpers --


def copy_model(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def edit_tensors(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite model.safetensors after ``edit`` changed the dict of tensors in place."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def drop_tensors(tensors: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        del tensors[name]


def rows(audit: WeightsAudit) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in audit.rows}


def transformers_report(folder: Path) -> tuple[set[str], set[str], set[str]]:
    """(missing, unexpected, mismatched names) as transformers' loader reports them."""
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(str(folder), output_loading_info=True,
                                                       ignore_mismatched_sizes=True)
    info: dict[str, Any] = loaded[1]
    mismatched = {m[0] if isinstance(m, tuple) else m for m in info["mismatched_keys"]}
    return set(info["missing_keys"]), set(info["unexpected_keys"]), mismatched


def audit_report(folder: Path) -> tuple[set[str], set[str], set[str]]:
    """The same three sets from the audit's own comparison."""
    ckpt = weights_audit.read_checkpoint(folder)
    exp = weights_audit.expected_model(folder)
    rep = compare_keys(exp.shapes, ckpt.shapes, base_model_prefix=exp.base_model_prefix, rename=exp.rename,
                       fuse=exp.fuse, expand=exp.expand, tied=exp.tied, ignore_missing=exp.ignore_missing,
                       ignore_unexpected=exp.ignore_unexpected)
    return set(rep.missing), set(rep.unexpected), {m[0] for m in rep.mismatched}


def assert_agrees_with_transformers(folder: Path) -> tuple[set[str], set[str], set[str]]:
    ours, theirs = audit_report(folder), transformers_report(folder)
    for what, a, b in zip(("missing", "unexpected", "mismatched"), ours, theirs, strict=True):
        assert a == b, f"{what}: audit {sorted(a)[:6]} vs transformers {sorted(b)[:6]}"
    return ours


# ----------------------------------------------------------- untouched folders pass --


@pytest.mark.parametrize("variant", ["tiny_llama", "tiny_qwen2_d80", "tiny_moe"])
def test_an_untouched_embedded_model_passes_and_agrees_with_transformers(variant: str,
                                                                        request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(variant)
    audit = audit_model_folder(folder)
    assert not audit.refused, audit.rows
    assert all(r["ok"] is True for r in audit.rows), audit.rows
    assert set(rows(audit)) == {ROW_MISSING, ROW_UNEXPECTED, ROW_MISMATCHED, ROW_TOKENIZER}
    assert assert_agrees_with_transformers(folder) == (set(), set(), set())


# --------------------------------------------------------------- broken folders fail --


def test_more_layers_in_config_than_in_the_checkpoint_is_missing_by_layer(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "deeper")
    edit_config(folder, num_hidden_layers=12)  # the checkpoint holds 2
    audit = audit_model_folder(folder)
    assert audit.refused
    detail = rows(audit)[ROW_MISSING]["detail"]
    assert rows(audit)[ROW_MISSING]["ok"] is False
    assert detail.startswith("10 layers' weights MISSING from the checkpoint: model.layers.2.*, model.layers.3.*"), detail
    assert "… model.layers.11.* (90 keys)" in detail, detail
    assert audit.message.startswith("model folder refused: 10 layers' weights MISSING") and "\n" not in audit.message
    missing, unexpected, mismatched = assert_agrees_with_transformers(folder)
    assert len(missing) == 90 and not unexpected and not mismatched


def test_a_renamed_tensor_is_missing_and_unexpected(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "renamed")

    def rename(t: dict[str, Any]) -> None:
        t["model.layers.1.mlp.upp_proj.weight"] = t.pop("model.layers.1.mlp.up_proj.weight")
    edit_tensors(folder, rename)
    audit = audit_model_folder(folder)
    by = rows(audit)
    assert by[ROW_MISSING]["ok"] is False and by[ROW_UNEXPECTED]["ok"] is False
    assert "1 tensor MISSING from the checkpoint: model.layers.1.mlp.up_proj.weight" in by[ROW_MISSING]["detail"]
    assert "1 tensor UNEXPECTED in the checkpoint" in by[ROW_UNEXPECTED]["detail"]
    assert "model.layers.1.mlp.upp_proj.weight" in by[ROW_UNEXPECTED]["detail"]
    assert audit.message.endswith("(+1 more)"), audit.message
    assert assert_agrees_with_transformers(folder) == ({"model.layers.1.mlp.up_proj.weight"},
                                                        {"model.layers.1.mlp.upp_proj.weight"}, set())


def test_a_deleted_tensor_is_missing(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "deleted")
    edit_tensors(folder, functools.partial(drop_tensors, names=("model.norm.weight",)))
    audit = audit_model_folder(folder)
    assert audit.refused and "model.norm.weight" in rows(audit)[ROW_MISSING]["detail"]
    assert assert_agrees_with_transformers(folder) == ({"model.norm.weight"}, set(), set())


def test_a_tensor_of_another_shape_is_mismatched(tiny_llama: Path, tmp_path: Path) -> None:
    import torch

    folder = copy_model(tiny_llama, tmp_path / "reshaped")

    def reshape(t: dict[str, Any]) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(500, 256, dtype=torch.bfloat16)
    edit_tensors(folder, reshape)
    audit = audit_model_folder(folder)
    row = rows(audit)[ROW_MISMATCHED]
    assert row["ok"] is False
    assert "model.layers.0.mlp.up_proj.weight [500, 256] in the checkpoint, [512, 256] by config.json" in row["detail"]
    assert "do not match config.json" in row["detail"]  # the phrase step 4's earlier message used
    assert rows(audit)[ROW_MISSING]["ok"] is True  # mismatched is not missing (transformers' terms)
    assert assert_agrees_with_transformers(folder) == (set(), set(), {"model.layers.0.mlp.up_proj.weight"})


def test_a_config_width_the_weights_do_not_have_is_mismatched_everywhere(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "wider")
    edit_config(folder, intermediate_size=640)
    audit = audit_model_folder(folder)
    detail = rows(audit)[ROW_MISMATCHED]["detail"]
    assert detail.startswith("6 tensors MISMATCHED (shapes that do not match config.json)") and "(6 keys)" in detail, detail
    assert len(assert_agrees_with_transformers(folder)[2]) == 6


def test_a_missing_moe_expert_is_caught_through_the_fused_layout(tiny_moe: Path, tmp_path: Path) -> None:
    # transformers 5 fuses one tensor per expert into one per layer: the audit computes the
    # fused shape from the parts, as the loader does, and finds it one expert short.
    folder = copy_model(tiny_moe, tmp_path / "seven-experts")

    def drop(t: dict[str, Any]) -> None:
        for w in ("w1", "w2", "w3"):
            t.pop(f"model.layers.1.block_sparse_moe.experts.7.{w}.weight")
    edit_tensors(folder, drop)
    audit = audit_model_folder(folder)
    assert audit.refused, audit.rows
    assert "model.layers.1.mlp.experts" in audit.message
    assert_agrees_with_transformers(folder)


def test_a_tokenizer_with_ids_past_the_embedding_fails_naming_both_numbers(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "more-tokens")
    tok = json.loads((folder / "tokenizer.json").read_text())
    for i, text in enumerate(("<extra_a>", "<extra_b>", "<extra_c>")):
        tok["added_tokens"].append({"id": 1024 + i, "content": text, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    audit = audit_model_folder(folder)
    row = rows(audit)[ROW_TOKENIZER]
    assert row["ok"] is False and audit.refused
    assert "ids up to 1026" in row["detail"] and "1024 rows" in row["detail"], row["detail"]
    assert all(r["ok"] for r in audit.rows if r["name"] != ROW_TOKENIZER)


# ---------------------------------------------------------- what transformers allows --


def test_tied_embeddings_cover_either_side(tiny_llama: Path, tmp_path: Path) -> None:
    # tie_word_embeddings: the checkpoint stores one of lm_head.weight / embed_tokens.weight.
    for dropped in ("lm_head.weight", "model.embed_tokens.weight"):
        folder = copy_model(tiny_llama, tmp_path / f"tied-{dropped}")
        edit_config(folder, tie_word_embeddings=True)
        edit_tensors(folder, functools.partial(drop_tensors, names=(dropped,)))
        audit = audit_model_folder(folder)
        assert not audit.refused, audit.rows
        assert "through its tie to" in rows(audit)[ROW_MISSING]["detail"]
        assert rows(audit)[ROW_TOKENIZER]["ok"] is True  # the embedding rows come from the tied partner
        assert assert_agrees_with_transformers(folder) == (set(), set(), set())
    # Untied, the same checkpoint lacks the LM head.
    folder = copy_model(tiny_llama, tmp_path / "untied")
    edit_tensors(folder, functools.partial(drop_tensors, names=("lm_head.weight",)))
    assert "lm_head.weight" in rows(audit_model_folder(folder))[ROW_MISSING]["detail"]
    assert assert_agrees_with_transformers(folder)[0] == {"lm_head.weight"}


def test_tied_with_both_sides_absent_is_missing(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "tied-none")
    edit_config(folder, tie_word_embeddings=True)
    edit_tensors(folder, functools.partial(drop_tensors, names=("lm_head.weight", "model.embed_tokens.weight")))
    audit = audit_model_folder(folder)
    assert audit.refused
    detail = rows(audit)[ROW_MISSING]["detail"]
    assert "lm_head.weight" in detail and "model.embed_tokens.weight" in detail
    assert_agrees_with_transformers(folder)


def test_base_model_weights_without_the_prefix_load_into_the_causal_lm(tiny_llama: Path, tmp_path: Path) -> None:
    # A checkpoint saved from LlamaModel names "layers.0…", not "model.layers.0…".
    folder = copy_model(tiny_llama, tmp_path / "no-prefix")

    def strip(t: dict[str, Any]) -> None:
        for k in [k for k in t if k.startswith("model.")]:
            t[k.removeprefix("model.")] = t.pop(k)
    edit_tensors(folder, strip)
    audit = audit_model_folder(folder)
    assert not audit.refused, audit.rows
    assert assert_agrees_with_transformers(folder) == (set(), set(), set())


def test_old_rotary_buffers_in_the_checkpoint_are_ignorable(tiny_llama: Path, tmp_path: Path) -> None:
    import torch

    folder = copy_model(tiny_llama, tmp_path / "inv-freq")

    def add(t: dict[str, Any]) -> None:
        for layer in (0, 1):
            t[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = torch.ones(32)
    edit_tensors(folder, add)
    audit = audit_model_folder(folder)
    assert not audit.refused, audit.rows
    assert "2 ignorable" in rows(audit)[ROW_UNEXPECTED]["detail"]
    assert assert_agrees_with_transformers(folder) == (set(), set(), set())


def test_a_sharded_checkpoint_is_read_through_its_index(tiny_llama: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = copy_model(tiny_llama, tmp_path / "sharded")
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    audit = audit_model_folder(folder)
    assert not audit.refused and audit.facts["files"] == sorted(shards), audit.rows
    edit_config(folder, num_hidden_layers=3)
    assert rows(audit_model_folder(folder))[ROW_MISSING]["ok"] is False


# ------------------------------------------------------------- what it cannot judge --


def test_what_cannot_be_audited_is_a_row_that_did_not_run_never_a_refusal(tiny_llama: Path, tmp_path: Path) -> None:
    quantized = copy_model(tiny_llama, tmp_path / "quantized")
    edit_config(quantized, quantization_config={"quant_method": "gptq", "bits": 4})
    audit = audit_model_folder(quantized)
    assert not audit.refused
    row = rows(audit)[ROW_WEIGHTS]
    assert row["ok"] is None and row["detail"].startswith("could not audit: a quantized checkpoint (gptq)")

    pickles = copy_model(tiny_llama, tmp_path / "pickles")
    (pickles / "model.safetensors").rename(pickles / "pytorch_model.bin")
    row = rows(audit_model_folder(pickles))[ROW_WEIGHTS]
    assert row["ok"] is None and "PyTorch pickles" in row["detail"]

    unknown = copy_model(tiny_llama, tmp_path / "unknown-arch")
    edit_config(unknown, model_type="no-such-model", architectures=["NoSuchForCausalLM"])
    audit = audit_model_folder(unknown)
    assert rows(audit)[ROW_WEIGHTS]["ok"] is None and not audit.refused, audit.rows


def test_an_unreadable_safetensors_header_refuses(tiny_llama: Path, tmp_path: Path) -> None:
    folder = copy_model(tiny_llama, tmp_path / "garbage")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    audit = audit_model_folder(folder)
    row = rows(audit)[ROW_WEIGHTS]
    assert row["ok"] is False and "model.safetensors" in row["detail"] and audit.refused


# -------------------------------------------------------------------- pure helpers --


def test_compare_keys_without_transformers() -> None:
    expected = {"model.embed.weight": (10, 4), "lm_head.weight": (10, 4), "model.norm.weight": (4,)}
    rep = compare_keys(expected, {"model.embed.weight": (10, 4), "model.norm.weight": (4,), "extra.bias": (3,)},
                       tied={"lm_head.weight": "model.embed.weight"}, ignore_unexpected=[r"^extra\."])
    assert rep.ok and rep.tied == {"lm_head.weight": "model.embed.weight"} and rep.ignored_unexpected == ("extra.bias",)
    rep = compare_keys(expected, {"embed.weight": (10, 4), "norm.weight": (5,), "lm_head.weight": (10, 4)},
                       base_model_prefix="model")
    assert rep.missing == () and rep.unexpected == ()
    assert rep.mismatched == (("model.norm.weight", (5,), (4,)),)


def test_compare_keys_fuses_parts_into_one_model_tensor() -> None:
    # transformers 5's MoE layout: one checkpoint tensor per expert, one model tensor per layer.
    def rename(key: str) -> tuple[str, str | None]:
        fused = re.sub(r"experts\.\d+\.w$", "experts.w", key)
        return fused, ("experts.*.w" if fused != key else None)

    def stack(first: str, parts: list[tuple[str, str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
        return {first: (len(parts), *parts[0][2])}

    def needs_data(first: str, parts: list[tuple[str, str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
        raise RuntimeError("needs the values")

    expected = {"m.experts.w": (2, 3)}
    both = {"m.experts.0.w": (3,), "m.experts.1.w": (3,)}
    assert compare_keys(expected, both, rename=rename, fuse=stack).ok
    rep = compare_keys(expected, {"m.experts.0.w": (3,)}, rename=rename, fuse=stack)
    assert rep.mismatched == (("m.experts.w", (1, 3), (2, 3)),)
    rep = compare_keys(expected, both, rename=rename, fuse=needs_data)
    assert rep.ok and rep.unverified == {"m.experts.w": "RuntimeError: needs the values"}


def test_summarise_keys_groups_whole_layers_and_names_the_rest() -> None:
    universe = [f"model.layers.{i}.{p}" for i in range(4) for p in ("a.weight", "b.weight")] + ["lm_head.weight"]
    what, names = summarise_keys(["model.layers.2.a.weight", "model.layers.2.b.weight", "model.layers.3.a.weight",
                                  "model.layers.3.b.weight"], universe)
    assert (what, names) == ("2 layers' weights", "model.layers.2.*, model.layers.3.* (4 keys)")
    what, names = summarise_keys(["model.layers.1.a.weight", "lm_head.weight"], universe)
    assert (what, names) == ("2 tensors", "lm_head.weight, model.layers.1.a.weight")
    what, _ = summarise_keys(["model.layers.0.a.weight", "model.layers.0.b.weight", "lm_head.weight"], universe)
    assert what == "1 layer's weights and 1 other tensor"


# ------------------------------------------------------------------------------ cost --


def test_the_audit_reads_headers_only_and_is_cheap(tiny_llama: Path, tmp_path: Path) -> None:
    audit_model_folder(tiny_llama)  # imports and the tokenizer classes, once
    start = time.perf_counter()
    audit = audit_model_folder(tiny_llama)
    took = time.perf_counter() - start
    assert not audit.refused and took < 5, took  # measured ~0.05 s on 2 busy cores
    # Headers only: a checkpoint whose tensor bytes are all garbage audits exactly the same.
    folder = copy_model(tiny_llama, tmp_path / "garbage-data")
    data = bytearray((folder / "model.safetensors").read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = b"\xff" * (len(data) - header)
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert [r["ok"] for r in audit_model_folder(folder).rows] == [r["ok"] for r in audit.rows]
    # Cached per process for unchanged files; a changed config.json is audited again.
    assert audit_cached(folder) is audit_cached(folder)
    first = audit_cached(folder)
    edit_config(folder, num_hidden_layers=3)
    assert audit_cached(folder) is not first and audit_cached(folder).refused
