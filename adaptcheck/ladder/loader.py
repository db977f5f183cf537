"""Load a ladder from YAML (include, extends) and validate it strictly, with file:line in every
error, into the one resolved form every consumer reads (docs/ladders.md, "How a ladder is loaded").
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from adaptcheck.base.errors import LadderError, UnknownNameError, did_you_mean
from adaptcheck.base.paths import data_dir
from adaptcheck.base.schemas.ladder import GradeSpec, LadderSpec
from adaptcheck.base.yamldata import construct, describe, location, parse_yaml, read_text
from adaptcheck.ladder.extends import MAP_TAG, SEQ_TAG, at, merge_ladder, pairs_of, scalar
from adaptcheck.ladder.registry import get_check_class

MAX_EXTENDS_DEPTH = 8
"""Longest chain of ladders extending one another (the shipped ones use 2)."""


@dataclass(frozen=True)
class LoadedLadder:
    """A validated ladder and where it came from."""

    spec: LadderSpec
    source: str
    text: str
    """The resolved ladder as YAML, needing no other file: what a run folder stores."""
    parents: tuple[str, ...] = ()
    """The ladders it extends, nearest first ('builtin:standard' or a path); empty for a flat one."""
    data: dict[str, object] = field(default_factory=dict, compare=False)
    """The resolved mapping as read (what ``text`` holds), before the schema fills in defaults."""
    origins: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    """Check id → the files that gave it a value, parent first (for ``adaptcheck ladder show``)."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class _Tree:
    """One ladder file read and resolved (include expanded, parent merged), not yet validated."""

    root: yaml.MappingNode
    data: dict[str, object]
    """The mapping as read; validated into a :class:`LadderSpec` by :func:`validate_ladder`."""
    text: str
    """For a flat ladder: its own text with the grade include written out (comments kept)."""
    parents: tuple[str, ...]
    labels: dict[str, str]
    """File name (as the marks say it) → label, for every file of the chain."""


def builtin_ladders() -> dict[str, Path]:
    """Built-in ladder names → files."""
    return {p.stem: p for p in sorted(data_dir("ladders").glob("*.yaml"))}


def _is_path(name_or_path: str) -> bool:
    return Path(name_or_path).suffix in (".yaml", ".yml") or "/" in name_or_path


def resolve(name_or_path: str) -> tuple[Path, str]:
    """A ladder name ('quick') or path → (file, source label)."""
    candidate = Path(name_or_path)
    if _is_path(name_or_path) or candidate.exists():
        if not candidate.is_file():
            raise LadderError(f"{name_or_path}: no such ladder file",
                              hint="pass a built-in name (" + ", ".join(builtin_ladders()) + ") or a YAML path")
        return candidate, str(candidate)
    found = builtin_ladders()
    if name_or_path not in found:
        raise UnknownNameError(f"unknown ladder {name_or_path!r}", hint=did_you_mean(name_or_path, list(found)))
    return found[name_or_path], f"builtin:{name_or_path}"


def load_ladder(name_or_path: str) -> LoadedLadder:
    """Load, resolve (include, extends) and validate a ladder; every problem is a one-line LadderError."""
    path, source = resolve(name_or_path)
    tree = _read_tree(path, source, ())
    spec = validate_ladder(tree.data, tree.root, str(path))
    text = tree.text if not tree.parents else resolved_text(tree.data, source, tree.parents)
    origins = {}
    checks = pairs_of(tree.root)["checks"][1]
    assert isinstance(checks, yaml.SequenceNode)
    for check, entry in zip(spec.checks, checks.value, strict=True):
        names = _files_in(entry)
        origins[check.id] = tuple(label for name, label in tree.labels.items() if name in names)
    return LoadedLadder(spec, source, text, tree.parents, tree.data, origins)


def _read_tree(path: Path, label: str, seen: tuple[tuple[Path, str], ...]) -> _Tree:
    """``path`` read, its grade include expanded and, when it extends another ladder, that one
    read (recursively), validated on its own and merged under it. ``seen``: the children
    below it, as (resolved file, name shown), to refuse a cycle."""
    text = read_text(path, LadderError, "ladder")  # size-bounded; a problem is one LadderError line
    data, root = parse_yaml(text, str(path), LadderError)
    assert isinstance(root, yaml.MappingNode)  # parse_yaml refuses anything but a mapping
    root, data, flat_text = _expand_grade_include(root, data, text, path)
    labels = {str(path): label}
    if "extends" not in data:
        for key in ("without", "add"):
            if key in data:
                raise LadderError(f"{location(root, [key], str(path))}: {key}: only a ladder that extends another "
                                  f"(extends: NAME) may use {key}:")
        return _Tree(root, data, flat_text, (), labels)
    value_node = pairs_of(root)["extends"][1]
    parent_path, parent_label = _parent_file(value_node, path)
    chain = (*seen, (path.resolve(), _short(label)))
    if any(parent_path.resolve() == p for p, _ in chain):
        names = " → ".join([*(shown for _, shown in chain), _short(parent_label)])
        raise LadderError(f"{at(value_node)}: extends: a cycle ({names}); a ladder cannot extend itself, directly "
                          "or through others: remove one of these extends")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise LadderError(f"{at(value_node)}: extends: more than {MAX_EXTENDS_DEPTH} ladders extend one another "
                          "here; extend a ladder nearer the top of the chain")
    parent = _read_tree(parent_path, parent_label, chain)
    # Every ladder of a chain must be a ladder by itself: its problems are reported against its
    # own file, not as a puzzle in the child's.
    validate_ladder(parent.data, parent.root, str(parent_path))
    # messages name the parent as the child wrote it ('standard', '../base.yaml')
    merged = merge_ladder(parent.root, root, str(value_node.value))
    return _Tree(merged, construct(merged), "", (parent_label, *parent.parents), {**parent.labels, **labels})


def _parent_file(node: yaml.Node, child: Path) -> tuple[Path, str]:
    """The file ``extends:`` names: a built-in ladder name, or a file relative to the child."""
    name = scalar(node)
    if not name:
        raise LadderError(f"{at(node)}: extends: expected the name of a built-in ladder "
                          f"({', '.join(builtin_ladders())}) or a YAML file relative to this one")
    if _is_path(name):
        target = child.parent / name
        if not target.is_file():
            raise LadderError(f"{at(node)}: extends: no such ladder file {name!r} (looked for {target}; a path is "
                              f"relative to this ladder's folder, a name without .yaml is a built-in ladder: "
                              f"{', '.join(builtin_ladders())})")
        return target, str(target)
    found = builtin_ladders()
    if name not in found:
        raise LadderError(f"{at(node)}: extends: no built-in ladder {name!r} ({did_you_mean(name, list(found))}; "
                          "a file of your own is given as a path ending in .yaml, relative to this ladder)")
    return found[name], f"builtin:{name}"


def _short(label: str) -> str:
    return label.removeprefix("builtin:")


def _files_in(node: yaml.Node) -> set[str]:
    """The file names in the marks of every node under ``node`` (who gave a check its values)."""
    names = {node.start_mark.name}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            names |= _files_in(k) | _files_in(v)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            names |= _files_in(item)
    return names


def _expand_grade_include(root: yaml.MappingNode, data: dict[str, object], text: str,
                          path: Path) -> tuple[yaml.MappingNode, dict[str, object], str]:
    """``grade: {include: FILE, without: [condition ids]}`` replaced by the rules of FILE
    (relative to the ladder's folder), minus the conditions named.

    Returns the tree with the rules' own nodes in it (an error in a rule names FILE's line),
    its data, and the ladder's text with the rules written out in place of the include block.

    Why the text too: the run folder snapshots a flat ladder as its own text (comments kept)
    and a resume re-reads that snapshot alone, so the snapshot must carry the rules themselves.
    The ``grade:`` block is the ladder's last top-level key by convention; it is rewritten in
    place and everything above it keeps its lines.
    """
    filename = str(path)
    grade = data.get("grade")
    if not (isinstance(grade, dict) and "include" in grade):
        return root, data, text
    where = location(root, ["grade"], filename)
    unknown = sorted(set(grade) - {"include", "without"})
    if unknown:
        raise LadderError(f"{where}: grade: with include, only 'without' may be given (not {', '.join(unknown)})")
    include, without = grade["include"], grade.get("without") or []
    if not isinstance(include, str) or not isinstance(without, list) or not all(isinstance(w, str) for w in without):
        raise LadderError(f"{where}: grade: include must be a file name and without a list of condition ids")
    inc_path = path.parent / include
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
    grade_node = _rules_without(inc_root, set(without))
    new_root = yaml.MappingNode(MAP_TAG, [(k, grade_node if str(k.value) == "grade" else v) for k, v in root.value],
                                root.start_mark, root.end_mark)

    levels = [{**lv.model_dump(exclude_defaults=True),
               "conditions": [c.model_dump(exclude_defaults=True) for c in lv.conditions if c.id not in without]}
              for lv in rules.levels]
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("grade:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "#", "\n")), len(lines))
    dumped = yaml.safe_dump({"levels": levels}, sort_keys=False, width=1000, allow_unicode=True)
    note = f"# grade rules of {include}" + (f" without {', '.join(without)}" if without else "") + " (expanded)\n"
    block = note + "grade:\n" + "".join(f"  {ln}" if ln.strip() else ln for ln in dumped.splitlines(keepends=True))
    return new_root, construct(new_root), "".join(lines[:start]) + block + "".join(lines[end:])


def _rules_without(rules: yaml.Node, without: set[str]) -> yaml.MappingNode:
    """The included rules' tree (already validated as GradeSpec) without the named conditions."""
    assert isinstance(rules, yaml.MappingNode)
    levels_key, levels = pairs_of(rules)["levels"]
    assert isinstance(levels, yaml.SequenceNode)
    new_levels = []
    for level in levels.value:
        assert isinstance(level, yaml.MappingNode)
        pairs = []
        for k, v in level.value:
            if str(k.value) == "conditions":
                assert isinstance(v, yaml.SequenceNode)
                kept = [c for c in v.value if isinstance(c, yaml.MappingNode)
                        and str(pairs_of(c)["id"][1].value) not in without]
                v = yaml.SequenceNode(SEQ_TAG, kept, v.start_mark, v.end_mark, flow_style=v.flow_style)
            pairs.append((k, v))
        new_levels.append(yaml.MappingNode(MAP_TAG, pairs, level.start_mark, level.end_mark))
    seq = yaml.SequenceNode(SEQ_TAG, new_levels, levels.start_mark, levels.end_mark)
    return yaml.MappingNode(MAP_TAG, [(levels_key, seq)], rules.start_mark, rules.end_mark)


def parse_ladder(text: str, filename: str) -> LadderSpec:
    """Validate the text of a flat ladder (a run folder's snapshot). Errors name ``filename:line``.

    A ladder that extends another or includes its grade rules is loaded from its file with
    :func:`load_ladder`: a text alone has no folder to find the other files in."""
    data, root = parse_yaml(text, filename, LadderError)
    if "extends" in data:
        raise LadderError(f"{location(root, ['extends'], filename)}: extends: this ladder text cannot be read "
                          "alone; load it from its file (adaptcheck ladder show FILE prints it resolved)")
    return validate_ladder(data, root, filename)


def validate_ladder(data: dict[str, object], root: yaml.Node, filename: str) -> LadderSpec:
    """Validate a resolved ladder's data. Errors name the file and line each value came from
    (``filename`` only where a node has no file of its own)."""
    try:
        spec = LadderSpec.model_validate(data)
    except ValidationError as exc:
        raise LadderError(describe(exc, root, filename) + _which_check(exc, data)) from None

    for i, check in enumerate(spec.checks):
        where = location(root, ["checks", i, "kind"], filename)
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
                    where = location(root, ["grade", "levels", li, "conditions", ci, "checks", pi], filename)
                    raise LadderError(f"{where}: condition {cond.id!r} selects {pattern!r}, which matches"
                                      f" no check of this ladder ({did_you_mean(pattern, ids)})")
    return spec


def _which_check(exc: ValidationError, data: dict[str, object]) -> str:
    """' (check ID)' when the reported problem is inside a check: in a ladder merged from
    several files the index in ``checks.N`` is the merged ladder's, the id is what the user wrote."""
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]  # the one describe() reports
    loc = err["loc"]
    checks = data.get("checks")
    if len(loc) >= 2 and loc[0] == "checks" and isinstance(loc[1], int) and isinstance(checks, list) \
            and loc[1] < len(checks) and isinstance(checks[loc[1]], dict) and "id" in checks[loc[1]]:
        return f" (check {checks[loc[1]]['id']!r})"
    return ""


# --- the resolved ladder as text -------------------------------------------------------------------

FLOW_WIDTH = 100
"""Longest mapping written on one line in a resolved ladder; longer ones are written as blocks."""


class _Flow(dict[Any, Any]):
    """A mapping written on one line (``{name: x, tokens: 8}``), as the shipped files write them."""


class _FlowList(list[Any]):
    """A list of scalars written on one line (``[fp32, bf16]``)."""


class _Dumper(yaml.SafeDumper):
    """Safe dumper that indents a list under its key, as the shipped ladders do."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping(MAP_TAG, v, flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence(SEQ_TAG, v, flow_style=True))


def _leaf(value: object) -> bool:
    """A mapping of scalars and lists of scalars (one line in the shipped files)."""
    return isinstance(value, dict) and all(
        not isinstance(v, (dict, list)) or (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
        for v in value.values())


def _styled(value: object, flow_maps: bool) -> object:
    """``value`` with its small parts marked for one-line style, as the shipped files write
    them: lists of scalars always; with ``flow_maps``, a list whose items are all mappings of
    scalars (op cases, request mixes) one item a line, and any other such mapping (``slo``,
    ``teacher``, short ``params``) when it fits in :data:`FLOW_WIDTH` characters."""
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return _FlowList(value)
        if flow_maps and all(_leaf(v) and v for v in value):
            return [_Flow({k: _styled(x, flow_maps) for k, x in v.items()}) for v in value]
        return [_styled(v, flow_maps) for v in value]
    if isinstance(value, dict):
        styled = {k: _styled(v, flow_maps) for k, v in value.items()}
        if flow_maps and value and _leaf(value) and len(
                yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=10**6)) <= FLOW_WIDTH:
            return _Flow(styled)
        return styled
    return value


def resolved_text(data: dict[str, object], source: str, parents: tuple[str, ...]) -> str:
    """The resolved data of a ladder that extends others, as a flat ladder file (the comments
    that explain its values stay in the files it was resolved from, which the header names).

    Lines are never wrapped: a wrapped plain scalar reads back the same, but one value a
    line is what a reader diffing two snapshots wants."""
    body: dict[str, object] = {}
    for key, value in data.items():
        if key == "checks" and isinstance(value, list):
            # a check entry itself in block style, its params in the shipped files' style
            body[key] = [{k: _styled(v, flow_maps=True) for k, v in c.items()} if isinstance(c, dict) else c
                         for c in value]
        else:
            body[key] = _styled(value, flow_maps=False)  # model, defaults, grade: block, as written
    chain = " extends ".join(_short(s) for s in (source, *parents))
    header = (f"# The ladder {chain}, resolved into one file by adaptcheck (adaptcheck ladder show).\n"
              "# Why each value is what it is: the comments beside it in those ladders' own files.\n")
    return header + yaml.dump(body, Dumper=_Dumper, sort_keys=False, width=10**6, allow_unicode=True)
