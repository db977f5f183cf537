"""What model resolution and the pretrained converter both need, below both of them: the
one-line model error and the weights digests (docs/frameworks.md, "Shared model-file helpers").
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from adaptcheck.base.errors import InvalidInputError

_HASH_CACHE_MIN_BYTES = 256 * 2**20
"""Weights at least this big have their hash cached (keyed by path, size and mtime): hashing
a 15 GB checkpoint on every run would cost tens of seconds."""


class ModelError(InvalidInputError):
    """The model given to adaptcheck cannot be used; the message says why and what to pass.

    An :class:`~adaptcheck.base.errors.InvalidInputError`: like a malformed ladder, it is an input
    the user supplied that adaptcheck cannot use (exit code 3).
    """


def sha256_of_file(path: Path) -> str:
    """sha256 of one file, read now (no cache: for a file just written, or to verify one)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of one file, cached by (path, size, mtime) whatever its size: for a file read on
    every run (a GGUF a pretrained model is converted from) that is not worth hashing again."""
    return _weights_sha256([path], cache_min_bytes=0)[0]


def _weights_sha256(files: list[Path], *, cache_min_bytes: int | None = None) -> tuple[str, int]:
    """(hash, total bytes): one file's sha256, or the sha256 of a ``sha256sum`` listing.

    Files of ``cache_min_bytes`` or more in all (default :data:`_HASH_CACHE_MIN_BYTES`) have
    their hash cached."""
    size = sum(f.stat().st_size for f in files)
    cache: Path | None = None
    if size >= (_HASH_CACHE_MIN_BYTES if cache_min_bytes is None else cache_min_bytes):
        from adaptcheck.base.paths import cache_dir

        key = "\n".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
        cache = cache_dir("weights-sha256") / (hashlib.sha256(key.encode()).hexdigest() + ".txt")
        if cache.is_file():
            cached = cache.read_text().strip()
            if re.fullmatch(r"[0-9a-f]{64}", cached):
                return cached, size
    sums = [(f.name, sha256_of_file(f)) for f in files]
    if len(sums) == 1:
        sha = sums[0][1]
    else:
        sha = hashlib.sha256("".join(f"{h}  {n}\n" for n, h in sums).encode()).hexdigest()
    if cache is not None:
        cache.write_text(sha + "\n")
    return sha, size


def read_config(folder: Path) -> dict[str, object] | None:
    """config.json of ``folder`` as a dict, None when it is missing, unreadable or not a JSON
    object (the family reading, the multimodal and quantization probes read it alike)."""
    try:
        data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
