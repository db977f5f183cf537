"""Load a ladder from YAML and validate it strictly, with file:line in every error.

Parsing, duplicate-key rejection and line mapping come from :mod:`adaptcheck.yamldata`;
this module adds what only a ladder has: check kinds, their params and step, and grade
conditions that must select real checks.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from adaptcheck.errors import LadderError, UnknownNameError, did_you_mean
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.models.ladder import GradeSpec, LadderSpec
from adaptcheck.paths import data_dir
from adaptcheck.yamldata import describe, line_of, parse_yaml, read_text


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
    text = read_text(path, LadderError, "ladder")  # size-bounded; a problem is one LadderError line
    text = expand_grade_include(text, str(path), path.parent)
    return LoadedLadder(parse_ladder(text, str(path)), source, text)


def expand_grade_include(text: str, filename: str, base_dir: Path) -> str:
    """The ladder with ``grade: {include: FILE, without: [condition ids]}`` replaced by the
    rules of FILE (relative to the ladder's folder), minus the conditions named.

    Why text, not just data: the run folder snapshots the ladder (``ladder.yaml``) and a
    resume re-reads that snapshot alone, so the snapshot must carry the rules themselves. The
    ``grade:`` block is the ladder's last top-level key by convention; it is rewritten in
    place and everything above it keeps its lines (errors still point at the right line).
    """
    data, root = parse_yaml(text, filename, LadderError)
    grade = data.get("grade")
    if not (isinstance(grade, dict) and "include" in grade):
        return text
    where = f"{filename}:{line_of(root, ['grade'])}"
    unknown = sorted(set(grade) - {"include", "without"})
    if unknown:
        raise LadderError(f"{where}: grade: with include, only 'without' may be given (not {', '.join(unknown)})")
    include, without = grade["include"], grade.get("without") or []
    if not isinstance(include, str) or not isinstance(without, list) or not all(isinstance(w, str) for w in without):
        raise LadderError(f"{where}: grade: include must be a file name and without a list of condition ids")
    inc_path = base_dir / include
    inc_text = read_text(inc_path, LadderError, "grade rules")
    inc_data, inc_root = parse_yaml(inc_text, str(inc_path), LadderError)
    try:
        rules = GradeSpec.model_validate(inc_data)
    except ValidationError as exc:
        raise LadderError(describe(exc, inc_root, str(inc_path))) from None
    ids = [c.id for lv in rules.levels for c in lv.conditions]
    for w in without:
        if w not in ids:
            raise LadderError(f"{where}: grade: without names {w!r}, which is no condition of {include} "
                              f"({did_you_mean(w, ids)})")
    levels = [{**lv.model_dump(exclude_defaults=True),
               "conditions": [c.model_dump(exclude_defaults=True) for c in lv.conditions if c.id not in without]}
              for lv in rules.levels]
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("grade:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "#", "\n")), len(lines))
    dumped = yaml.safe_dump({"levels": levels}, sort_keys=False, width=1000, allow_unicode=True)
    note = f"# grade rules of {include}" + (f" without {', '.join(without)}" if without else "") + " (expanded)\n"
    block = note + "grade:\n" + "".join(f"  {ln}" if ln.strip() else ln for ln in dumped.splitlines(keepends=True))
    return "".join(lines[:start]) + block + "".join(lines[end:])


def parse_ladder(text: str, filename: str) -> LadderSpec:
    """Validate ladder text. Errors name ``filename:line``."""
    data, root = parse_yaml(text, filename, LadderError)
    try:
        spec = LadderSpec.model_validate(data)
    except ValidationError as exc:
        raise LadderError(describe(exc, root, filename)) from None

    for i, check in enumerate(spec.checks):
        where = f"{filename}:{line_of(root, ['checks', i, 'kind'])}"
        try:
            cls = get_check_class(check.kind)
        except UnknownNameError as exc:
            raise LadderError(f"{where}: check {check.id!r}: {exc.one_line()}") from None
        if cls.step and cls.step != check.step:  # step 0: a kind usable in any step
            raise LadderError(f"{where}: check {check.id!r}: kind {check.kind!r} belongs to step {cls.step}, not {check.step}")
        try:
            cls.params_model.model_validate(check.params)
        except ValidationError as exc:
            raise LadderError(f"{describe(exc, root, filename, ('checks', i, 'params'))} (check {check.id!r})") from None

    ids = [c.id for c in spec.checks]
    for li, level in enumerate(spec.grade.levels):
        for ci, cond in enumerate(level.conditions):
            for pi, raw in enumerate(cond.checks):
                pattern = raw.replace("{precision}", spec.model.precision)
                if not any(fnmatch.fnmatchcase(cid, pattern) or pattern.startswith(cid + ".")
                           or ("." in pattern and fnmatch.fnmatchcase(cid, pattern.rsplit(".", 1)[0])) for cid in ids):
                    line = line_of(root, ["grade", "levels", li, "conditions", ci, "checks", pi])
                    raise LadderError(f"{filename}:{line}: condition {cond.id!r} selects {pattern!r}, which matches"
                                      f" no check of this ladder ({did_you_mean(pattern, ids)})")
    return spec
