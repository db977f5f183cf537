"""Model resolution: every way a --model value can be wrong, and the facts of a good one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from adaptcheck.base.errors import ExitCode, InvalidInputError, UnknownNameError
from adaptcheck.frameworks import modelfiles, synthetic
from adaptcheck.frameworks.modelsrc import ModelError, ResolvedModel, resolve_model


def refused(name: str) -> str:
    """The one line the user sees for ``--model name``."""
    with pytest.raises(ModelError) as info:
        resolve_model(name)
    line = info.value.one_line()
    assert "\n" not in line
    return line


def model_folder(tmp_path: Path, source: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """A copy of a real model folder with some files removed."""
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    for name in drop:
        (folder / name).unlink()
    return folder


def test_model_error_is_invalid_input() -> None:
    assert issubclass(ModelError, InvalidInputError)
    assert ModelError("x").exit_code == ExitCode.INVALID_INPUT


def test_missing_path(tmp_path: Path) -> None:
    line = refused(str(tmp_path / "nope"))
    assert f"{tmp_path / 'nope'} does not exist" in line
    assert "--model" in line


def test_hub_id_is_never_downloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # so no relative folder of that name can exist
    line = refused("Qwen/Qwen2.5-7B")
    assert "'Qwen/Qwen2.5-7B' is not a local folder" in line
    assert "never downloads" in line
    assert "embedded:" in line


def test_bare_embedded_name_gets_the_prefix_suggested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "did you mean embedded:tiny-llama?" in refused("tiny-llama")


def test_a_file_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert "is a file, not a Hugging Face model directory" in refused(str(tmp_path / "model.safetensors"))


def test_folder_without_config(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama, drop=("config.json",))
    assert refused(str(folder)) == (
        f"{folder} is not a Hugging Face model directory: config.json is missing "
        "(pass --model with a folder holding config.json, tokenizer files and *.safetensors)"
    )


def test_config_not_json(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama)
    (folder / "config.json").write_text('{"model_type": "llama",\n  oops}')
    line = refused(str(folder))
    assert f"{folder / 'config.json'} is not valid JSON" in line
    assert "line 2" in line


@pytest.mark.parametrize("content, expected", [
    ("[1, 2]", "is not a JSON object"),
    ('{"hidden_size": 8}', "names no architecture"),
])
def test_config_without_a_model(tmp_path: Path, tiny_llama: Path, content: str, expected: str) -> None:
    folder = model_folder(tmp_path, tiny_llama)
    (folder / "config.json").write_text(content)
    assert expected in refused(str(folder))


def test_no_weights(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama, drop=("model.safetensors",))
    line = refused(str(folder))
    assert f"{folder} has no weights: no *.safetensors or pytorch_model*.bin file" in line
    assert "--model" in line


def test_pytorch_bin_weights_are_accepted(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama, drop=("model.safetensors",))
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    resolved = resolve_model(str(folder))
    assert resolved.weights_sha256 == hashlib.sha256(b"weights").hexdigest()


def test_sharded_weights_with_a_missing_shard(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"shard")
    line = refused(str(folder))
    assert "missing 1 of 2 weight shards" in line and "model-00002-of-00002.safetensors" in line


def test_no_tokenizer(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama, drop=("tokenizer.json",))
    line = refused(str(folder))
    assert f"{folder} has no tokenizer" in line and "tokenizer.json" in line


def test_unknown_embedded_name() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'tiny-moe'"):
        resolve_model("embedded:tiny-mo")


def test_synthetic_folder_resolves_as_a_path(tiny_llama: Path) -> None:
    resolved = resolve_model(str(tiny_llama))
    assert isinstance(resolved, ResolvedModel)
    assert resolved.path == tiny_llama and not resolved.embedded and resolved.generated_s is None
    assert (resolved.architecture, resolved.model_type) == ("LlamaForCausalLM", "llama")
    assert (resolved.head_dim, resolved.num_layers, resolved.vocab_size) == (64, 2, 1024)
    assert resolved.torch_dtype == "bfloat16"
    weights = (tiny_llama / "model.safetensors").read_bytes()
    assert resolved.weights_sha256 == hashlib.sha256(weights).hexdigest()
    assert resolved.weights_bytes == len(weights)
    assert resolved.synthetic is not None and resolved.synthetic["name"] == "tiny-llama"
    facts = json.loads(json.dumps(resolved.describe()))
    assert facts["source"] == "path" and facts["synthetic"]["seed"] == 0
    assert facts["weights_sha256"] == resolved.weights_sha256


def test_head_dim_80_and_moe_facts(tiny_qwen2_d80: Path, tiny_moe: Path) -> None:
    qwen = resolve_model(str(tiny_qwen2_d80))
    assert (qwen.architecture, qwen.head_dim) == ("Qwen2ForCausalLM", 80)
    moe = resolve_model(str(tiny_moe))
    assert (moe.architecture, moe.model_type, moe.head_dim) == ("MixtralForCausalLM", "mixtral", 64)


def test_several_weight_files_hash_as_a_listing(tmp_path: Path, tiny_llama: Path) -> None:
    folder = model_folder(tmp_path, tiny_llama, drop=("model.safetensors",))
    (folder / "b.safetensors").write_bytes(b"bbb")
    (folder / "a.safetensors").write_bytes(b"aa")
    listing = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                      for name, data in (("a.safetensors", b"aa"), ("b.safetensors", b"bbb")))
    resolved = resolve_model(str(folder))
    assert resolved.weights_sha256 == hashlib.sha256(listing.encode()).hexdigest()
    assert resolved.weights_bytes == 5


def test_embedded_name_is_written_once_into_the_cache(tmp_path: Path, tiny_llama: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTCHECK_CACHE_DIR", str(tmp_path))
    written: list[Path] = []

    def copy_finished(spec: object, seed: int, out: Path) -> None:  # a fast stand-in for the generator
        written.append(out)
        for f in tiny_llama.iterdir():
            shutil.copy2(f, out / f.name)

    monkeypatch.setattr(synthetic, "_write_model", copy_finished)
    first = resolve_model("embedded:tiny-llama")
    assert first.embedded and first.generated_s is not None and first.generated_s >= 0
    assert first.path.parent == tmp_path / "models"
    assert first.describe()["source"] == "embedded"
    second = resolve_model("embedded:tiny-llama")
    assert second.generated_s is None and second.path == first.path
    assert len(written) == 1


def test_big_weights_hash_is_cached(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(modelfiles, "_HASH_CACHE_MIN_BYTES", 1)
    folder = model_folder(tmp_path, tiny_llama)
    first = resolve_model(str(folder)).weights_sha256
    calls: list[Path] = []
    monkeypatch.setattr(modelfiles, "sha256_of_file", lambda p: calls.append(p) or "0" * 64)
    assert resolve_model(str(folder)).weights_sha256 == first
    assert calls == []
    (folder / "model.safetensors").write_bytes(b"changed")  # new size and mtime: hashed again
    assert resolve_model(str(folder)).weights_sha256 == "0" * 64
