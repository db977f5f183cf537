"""Tamper evidence for ``results.json``: a SHA-256 digest over the file's own content, stored by
``RunResults.save`` and checked by ``adaptcheck verify`` (docs/ci.md, "What the digest proves").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import NoReturn

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from adaptcheck.base import safejson
from adaptcheck.base.errors import exception_line

DIGEST_FIELD = "digest"
"""Top-level key of results.json that carries the digest."""

DIGEST_PREFIX = "sha256:"
_DIGEST_SHAPE = re.compile(r"sha256:[0-9a-f]{64}")


class Integrity(str, Enum):
    """Verdict of :func:`verify_file`."""

    INTACT = "intact"
    EDITED = "edited"
    NO_DIGEST = "no_digest"
    UNREADABLE = "unreadable"


class VerifyResult(BaseModel):
    """What ``adaptcheck verify`` found for one file."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="The file that was verified.")
    status: Integrity = Field(description="intact | edited | no_digest | unreadable.")
    stored: str | None = Field(default=None, description="The digest the file carries, when it carries one.")
    computed: str | None = Field(default=None, description="The digest of the file's content now, when it could be computed.")
    message: str = Field(description="One line saying what the verdict means.")

    @property
    def intact(self) -> bool:
        """True only when the file carries a digest and its content matches it."""
        return self.status is Integrity.INTACT

    @property
    def unverified_reason(self) -> str:
        """Why nothing vouches for the file, in the words every unverified mark uses
        ('edited after the run', 'no digest'); '' when it is intact."""
        return UNVERIFIED_REASONS.get(self.status, "")


UNVERIFIED_REASONS: dict[Integrity, str] = {
    Integrity.EDITED: "edited after the run",
    Integrity.NO_DIGEST: "no digest",
    Integrity.UNREADABLE: "unreadable",
}
"""The short reason an output marked unverified gives (HTML banner, JSON, JUnit, matrix)."""


def canonical_bytes(content: Mapping[str, JsonValue]) -> bytes:
    """The bytes the digest is taken over: ``content`` without its digest field, canonically.

    ``ensure_ascii`` keeps the bytes independent of how the file encoded non-ASCII text (and
    lets lone surrogates from ``\\ud800`` escapes through instead of failing to encode);
    ``allow_nan=False`` because results.json is standard JSON (pydantic writes NaN as null).
    """
    body = {k: v for k, v in content.items() if k != DIGEST_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def compute_digest(content: Mapping[str, JsonValue]) -> str:
    """``"sha256:<hex>"`` over :func:`canonical_bytes` of ``content``."""
    return DIGEST_PREFIX + hashlib.sha256(canonical_bytes(content)).hexdigest()


class _DuplicateKey(ValueError):
    """Raised while parsing when an object repeats a key."""


def _no_duplicates(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    # A repeated key is read as its *last* value here but as its first by some other
    # readers: adaptcheck never writes one, so a file that has one was edited.
    out: dict[str, JsonValue] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


def verify_text(text: str, source: str = "results.json") -> VerifyResult:
    """Verify the JSON text of a results file (``source`` names it in the verdict)."""
    try:
        # Bounded (size, depth, integer length): a hostile file is "unreadable", not a crash.
        content = safejson.loads(text, source, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        return VerifyResult(path=source, status=Integrity.EDITED,
                            message=f"{source}: was edited after the run: key {str(exc)!r} appears twice in one object")
    except safejson.JsonFormatError as exc:
        return VerifyResult(path=source, status=Integrity.UNREADABLE, message=exc.message)
    except safejson.JsonLimitError as exc:
        return VerifyResult(path=source, status=Integrity.UNREADABLE, message=exc.message)
    except ValueError as exc:
        return VerifyResult(path=source, status=Integrity.UNREADABLE,
                            message=f"{source}: not a readable JSON file: {exception_line(exc, with_type=False)}")
    except RecursionError:
        # json's C parser gives up on very deep nesting with RecursionError, not ValueError.
        return VerifyResult(path=source, status=Integrity.UNREADABLE,
                            message=f"{source}: not a readable JSON file: nested too deeply")
    if not isinstance(content, dict):
        return VerifyResult(path=source, status=Integrity.UNREADABLE,
                            message=f"{source}: expected a JSON object at the top level")
    stored = content.get(DIGEST_FIELD)
    if stored is None:
        return VerifyResult(path=source, status=Integrity.NO_DIGEST,
                            message=f"{source}: carries no digest (written before results schema 1.1, or the digest was removed)")
    computed = compute_digest(content)
    if not isinstance(stored, str) or not _DIGEST_SHAPE.fullmatch(stored):
        return VerifyResult(path=source, status=Integrity.EDITED, stored=str(stored), computed=computed,
                            message=f"{source}: was edited after the run: its digest is not 'sha256:<64 hex digits>'")
    if stored != computed:
        return VerifyResult(path=source, status=Integrity.EDITED, stored=stored, computed=computed,
                            message=f"{source}: was edited after the run: its content no longer matches its digest")
    return VerifyResult(path=source, status=Integrity.INTACT, stored=stored, computed=computed,
                        message=f"{source}: intact (content matches {stored})")


def verify_file(path: Path) -> VerifyResult:
    """Verify a results file on disk: intact, edited, no digest, or unreadable."""
    try:
        text = safejson.read_text(Path(path), what="results file")
    except FileNotFoundError:
        return VerifyResult(path=str(path), status=Integrity.UNREADABLE, message=f"{path}: no such results file")
    except safejson.JsonLimitError as exc:
        return VerifyResult(path=str(path), status=Integrity.UNREADABLE, message=exc.message)
    except (OSError, UnicodeDecodeError) as exc:
        return VerifyResult(path=str(path), status=Integrity.UNREADABLE,
                            message=f"{path}: not a readable file: {exc}")
    return verify_text(text, str(path))
