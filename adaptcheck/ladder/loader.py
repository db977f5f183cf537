"""Load a ladder from YAML and validate it strictly, with file:line in every error.

YAML is read with ``safe_load`` semantics; the composed node tree is kept only to map a
validation error's location back to a line number, and to reject duplicate keys (which
``safe_load`` would silently resolve to the last one, hiding a typo).
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from adaptcheck.errors import LadderError, UnknownNameError, did_you_mean
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.models.ladder import LadderSpec
from adaptcheck.paths import data_dir


@dataclass(frozen=True)
class LoadedLadder:
    """A validated ladder and where it came from."""

    spec: LadderSpec
    source: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def builtin_ladders() -> dict[str, Path]:
    """Built-in ladder names → files."""
    return {p.stem: p for p in sorted(data_dir("ladders").glob("*.yaml"))}


def resolve(name_or_path: str) -> tuple[Path, str]:
    """A ladder name ('quick') or path → (file, source label)."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists() or "/" in name_or_path:
        if not candidate.is_file():
            raise LadderError(f"{name_or_path}: no such ladder file",
                              hint="pass a built-in name (" + ", ".join(builtin_ladders()) + ") or a YAML path")
        return candidate, str(candidate)
    found = builtin_ladders()
    if name_or_path not in found:
        raise UnknownNameError(f"unknown ladder {name_or_path!r}", hint=did_you_mean(name_or_path, list(found)))
    return found[name_or_path], f"builtin:{name_or_path}"


def load_ladder(name_or_path: str) -> LoadedLadder:
    """Load, parse and validate a ladder; every problem is a one-line LadderError."""
    path, source = resolve(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LadderError(f"{path}: cannot read ladder: {exc}") from None
    return LoadedLadder(parse_ladder(text, str(path)), source, text)


def parse_ladder(text: str, filename: str) -> LadderSpec:
    """Validate ladder text. Errors name ``filename:line``."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise LadderError(f"{filename}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise LadderError(f"{filename}: malformed YAML: {exc}") from None
    if root is None or not isinstance(data, dict):
        raise LadderError(f"{filename}:1: a ladder must be a YAML mapping with 'schema_version', 'id', 'checks', 'grade'")
    _reject_duplicate_keys(root, filename)
    try:
        spec = LadderSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = list(err["loc"])
        raise LadderError(f"{filename}:{_line_of(root, loc)}: {'.'.join(map(str, loc)) or '(top)'}: {err['msg']}") from None

    for i, check in enumerate(spec.checks):
        where = f"{filename}:{_line_of(root, ['checks', i, 'kind'])}"
        try:
            cls = get_check_class(check.kind)
        except UnknownNameError as exc:
            raise LadderError(f"{where}: check {check.id!r}: {exc.one_line()}") from None
        if cls.step and cls.step != check.step:  # step 0: a kind usable in any step
            raise LadderError(f"{where}: check {check.id!r}: kind {check.kind!r} belongs to step {cls.step}, not {check.step}")
        try:
            cls.params_model.model_validate(check.params)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ["checks", i, "params", *err["loc"]]
            raise LadderError(f"{filename}:{_line_of(root, loc)}: check {check.id!r} params"
                              f" {'.'.join(map(str, err['loc'])) or ''}: {err['msg']}") from None

    ids = [c.id for c in spec.checks]
    for li, level in enumerate(spec.grade.levels):
        for ci, cond in enumerate(level.conditions):
            for pi, pattern in enumerate(cond.checks):
                if not any(fnmatch.fnmatchcase(cid, pattern) or pattern.startswith(cid + ".") for cid in ids):
                    line = _line_of(root, ["grade", "levels", li, "conditions", ci, "checks", pi])
                    raise LadderError(f"{filename}:{line}: condition {cond.id!r} selects {pattern!r}, which matches"
                                      f" no check of this ladder ({did_you_mean(pattern, ids)})")
    return spec


def _reject_duplicate_keys(node: yaml.Node, filename: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if key.value in seen:
                raise LadderError(f"{filename}:{key.start_mark.line + 1}: duplicate key {key.value!r}")
            seen.add(key.value)
            _reject_duplicate_keys(value, filename)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item, filename)


def _line_of(root: yaml.Node, loc: list[Any]) -> int:
    """Line (1-based) of the deepest node reachable along ``loc``."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if str(k.value) == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            nxt = node.value[part]
        else:
            nxt = None
        if nxt is None:
            break
        node = nxt
    return node.start_mark.line + 1
