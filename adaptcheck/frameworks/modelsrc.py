"""Model resolution: ``embedded:NAME`` or a local path → a checked Hugging Face model folder.

This module is responsible for the one question every framework adapter asks first:
*which folder holds the model, and is it usable?* ``embedded:NAME`` is written on first use
by :mod:`adaptcheck.frameworks.synthetic`; anything else must be a local folder and is used
as is. adaptcheck never downloads: a hub id such as ``Qwen/Qwen2.5-7B`` that is not an
existing path is refused with a message that says so. A folder that is not a usable model
(no config.json, config.json not JSON, no weights, no tokenizer) is refused with a one-line
:class:`ModelError` naming the problem and the fix, before any framework spends a minute
starting up on it.

The facts collected here (architecture, head_dim, dtype, a hash of the weights) go into the
report, so a result names exactly which model it was measured on.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcheck import safejson
from adaptcheck.errors import InvalidInputError

EMBEDDED_PREFIX = "embedded:"

_FIX = "pass --model with a folder holding config.json, tokenizer files and *.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HASH_CACHE_MIN_BYTES = 256 * 2**20
"""Weights at least this big have their hash cached (keyed by path, size and mtime): hashing
a 15 GB checkpoint on every run would cost tens of seconds."""


class ModelError(InvalidInputError):
    """The model given to adaptcheck cannot be used; the message says why and what to pass.

    An :class:`~adaptcheck.errors.InvalidInputError`: like a malformed ladder, it is an input
    the user supplied that adaptcheck cannot use (exit code 3).
    """


@dataclass
class ResolvedModel:
    """A model folder that passed the checks, and the facts the report shows about it."""

    name: str
    """As the user gave it (``embedded:tiny-llama`` or a path)."""
    path: Path
    embedded: bool
    architecture: str
    model_type: str
    head_dim: int | None
    num_layers: int | None
    vocab_size: int | None
    max_position: int | None
    """The model's context limit (``max_position_embeddings``), when config.json says."""
    torch_dtype: str | None
    """The dtype config.json declares (the stored weights' dtype, usually)."""
    generated_s: float | None
    """Seconds spent writing the embedded model now; None when it was cached or is a path."""
    synthetic: dict[str, Any] | None
    """adaptcheck's metadata of a synthetic model (probes and all), else None."""
    weights_sha256: str
    """sha256 of the single weights file, or of the ``sha256sum``-style list of several."""
    weights_bytes: int = 0

    def describe(self) -> dict[str, Any]:
        """Plain JSON-able facts for the report."""
        facts: dict[str, Any] = {
            "name": self.name,
            "path": str(self.path),
            "source": "embedded" if self.embedded else "path",
            "architecture": self.architecture,
            "model_type": self.model_type,
            "head_dim": self.head_dim,
            "num_layers": self.num_layers,
            "vocab_size": self.vocab_size,
            "torch_dtype": self.torch_dtype,
            "weights_sha256": self.weights_sha256,
            "weights_bytes": self.weights_bytes,
            "generated_s": None if self.generated_s is None else round(self.generated_s, 2),
        }
        if self.synthetic is not None:
            # The identity of the synthetic model; the probe details stay in its folder.
            facts["synthetic"] = {k: self.synthetic.get(k) for k in
                                  ("name", "seed", "generator_version", "spec_hash", "num_params", "eos_step")}
        return facts


def resolve_model(name: str, *, seed: int = 0) -> ResolvedModel:
    """Turn ``embedded:NAME`` or a local folder into a checked :class:`ResolvedModel`.

    Raises :class:`ModelError` for a path that is not a usable model and
    :class:`~adaptcheck.errors.UnknownNameError` for an unknown embedded name.
    """
    from adaptcheck.frameworks import synthetic

    generated_s: float | None = None
    if name.startswith(EMBEDDED_PREFIX):
        variant = name[len(EMBEDDED_PREFIX):]
        cached = synthetic.is_complete(synthetic.model_dir(variant, seed=seed))  # unknown name raises here
        started = time.perf_counter()
        path = synthetic.ensure_model(variant, seed=seed)
        if not cached:
            generated_s = time.perf_counter() - started
        embedded = True
    else:
        path = _local_folder(name)
        embedded = False
    return _inspect(name, path, embedded=embedded, generated_s=generated_s, synthetic_meta=synthetic.synthetic_info(path))


def _local_folder(name: str) -> Path:
    """The folder ``name`` points to, or a ModelError saying why it is not one."""
    from adaptcheck.frameworks.synthetic import embedded_names

    path = Path(name).expanduser()
    if not path.exists():
        if name in embedded_names():
            raise ModelError(f"model {name!r} is not a folder", hint=f"did you mean embedded:{name}?")
        if _HUB_ID.match(name):
            raise ModelError(
                f"model {name!r} is not a local folder, and adaptcheck never downloads models",
                hint=f"download it yourself and pass its folder to --model, or use embedded:NAME "
                     f"({', '.join(embedded_names())})",
            )
        raise ModelError(f"model path {path.absolute()} does not exist", hint=_FIX)
    if not path.is_dir():
        raise ModelError(f"model path {path.absolute()} is a file, not a Hugging Face model directory", hint=_FIX)
    return path.absolute()


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path} is not a Hugging Face model directory: config.json is missing", hint=_FIX)
    try:
        # Bounded (size, nesting, integer length): a hostile config.json is one line, not a crash.
        config = safejson.loads(safejson.read_text(config_file, what="config.json"), str(config_file))
    except safejson.JsonFormatError as exc:
        detail = exc.message.split("not a readable JSON file: ", 1)[-1]
        raise ModelError(f"{config_file} is not valid JSON: {detail}", hint="restore the file from the model's source") from None
    except safejson.JsonLimitError as exc:
        raise ModelError(exc.message, hint="restore the file from the model's source") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{config_file} cannot be read: {exc}", hint="check the file's permissions") from None
    if not isinstance(config, dict):
        raise ModelError(f"{config_file} is not a JSON object", hint="restore the file from the model's source")
    if not config.get("architectures") and not config.get("model_type"):
        raise ModelError(f"{config_file} names no architecture: neither 'architectures' nor 'model_type' is set",
                         hint="restore the file from the model's source")
    return config


def _weights_files(path: Path) -> list[Path]:
    """The weights a framework would load: safetensors first, else PyTorch pickles."""
    for pattern, index_name in (("*.safetensors", "model.safetensors.index.json"),
                                ("pytorch_model*.bin", "pytorch_model.bin.index.json")):
        files = sorted(p for p in path.glob(pattern) if p.is_file())
        index = path / index_name
        if index.is_file():
            # Sharded: every shard the index names must be there, or loading fails late.
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                raise ModelError(f"{index} is not a valid weights index",
                                 hint="restore the file from the model's source") from None
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                raise ModelError(f"{path} is missing {len(missing)} of {len(shards)} weight shards "
                                 f"named in {index_name} (first: {missing[0]})",
                                 hint="copy the complete model folder")
        if files:
            return files
    raise ModelError(f"{path} has no weights: no *.safetensors or pytorch_model*.bin file", hint=_FIX)


def _check_tokenizer(path: Path) -> None:
    if any((path / f).is_file() for f in _TOKENIZER_FILES) or any(path.glob("*.tiktoken")):
        return
    raise ModelError(f"{path} has no tokenizer: none of {', '.join(_TOKENIZER_FILES)} is there", hint=_FIX)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part: multimodal configs nest it under ``text_config``."""
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in config:
        return {**config, **text}
    return config


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _inspect(name: str, path: Path, *, embedded: bool, generated_s: float | None,
             synthetic_meta: dict[str, Any] | None) -> ResolvedModel:
    config = _read_config(path)
    weights = _weights_files(path)
    _check_tokenizer(path)
    text = _text_config(config)
    head_dim = _as_int(text.get("head_dim"))
    hidden, heads = _as_int(text.get("hidden_size")), _as_int(text.get("num_attention_heads"))
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    architectures = config.get("architectures") or []
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    sha, size = _weights_sha256(weights)
    return ResolvedModel(
        name=name,
        path=path,
        embedded=embedded,
        architecture=str(architectures[0]) if architectures else "",
        model_type=str(config.get("model_type", "")),
        head_dim=head_dim,
        num_layers=_as_int(text.get("num_hidden_layers")),
        vocab_size=_as_int(text.get("vocab_size")),
        max_position=_as_int(text.get("max_position_embeddings")),
        torch_dtype=str(dtype) if dtype else None,
        generated_s=generated_s,
        synthetic=synthetic_meta,
        weights_sha256=sha,
        weights_bytes=size,
    )


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _weights_sha256(files: list[Path]) -> tuple[str, int]:
    """(hash, total bytes): one file's sha256, or the sha256 of a ``sha256sum`` listing."""
    size = sum(f.stat().st_size for f in files)
    cache: Path | None = None
    if size >= _HASH_CACHE_MIN_BYTES:
        from adaptcheck.paths import cache_dir

        key = "\n".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
        cache = cache_dir("weights-sha256") / (hashlib.sha256(key.encode()).hexdigest() + ".txt")
        if cache.is_file():
            cached = cache.read_text().strip()
            if re.fullmatch(r"[0-9a-f]{64}", cached):
                return cached, size
    sums = [(f.name, _file_sha256(f)) for f in files]
    if len(sums) == 1:
        sha = sums[0][1]
    else:
        sha = hashlib.sha256("".join(f"{h}  {n}\n" for n, h in sums).encode()).hexdigest()
    if cache is not None:
        cache.write_text(sha + "\n")
    return sha, size
