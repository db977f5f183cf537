"""Ladders that extend another (``extends:``): the merge rules, applied to YAML node trees so that
every value keeps the file and line it came from (the rules and why: docs/ladders.md).
"""

from __future__ import annotations

import yaml

from adaptcheck.base.errors import LadderError, did_you_mean
from adaptcheck.base.schemas.ladder import CheckSpec, LadderSpec

MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"

CHILD_KEYS = ("extends", "without", "add")
"""Top-level keys only a ladder that extends another may use."""
REQUIRED_IN_CHILD = ("schema_version", "id")
REPLACED_WHOLE = ("grade",)
"""Top-level mappings a child replaces instead of merging (see the module docstring)."""
UNSET = "unset"
PLACES = ("after", "before")


def at(node: yaml.Node) -> str:
    """``file:line`` of a node (its mark carries the file it was read from)."""
    return f"{node.start_mark.name}:{node.start_mark.line + 1}"


def pairs_of(node: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping node's (key node, value node) pairs by key text, in order."""
    return {str(k.value): (k, v) for k, v in node.value}


def scalar(node: yaml.Node) -> str | None:
    """A plain string scalar's text (None for anything else)."""
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
        return str(node.value)
    return None


def merge_nodes(parent: yaml.Node, child: yaml.Node) -> yaml.Node:
    """``child`` over ``parent``: two mappings merge key by key (the parent's keys in its
    order, then the child's new ones); anything else is the child's, whole."""
    if not (isinstance(parent, yaml.MappingNode) and isinstance(child, yaml.MappingNode)):
        return child
    own = pairs_of(child)
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    for key, value in parent.value:
        if str(key.value) in own:
            child_key, child_value = own.pop(str(key.value))
            merged.append((child_key, merge_nodes(value, child_value)))
        else:
            merged.append((key, value))
    merged.extend(own.values())
    # The child's marks: a "field required" found later points at the child, which made the change.
    return yaml.MappingNode(MAP_TAG, merged, child.start_mark, child.end_mark, flow_style=child.flow_style)


def merge_ladder(parent: yaml.MappingNode, child: yaml.MappingNode, parent_label: str) -> yaml.MappingNode:
    """The child ladder's tree merged onto its (already valid) parent's, by the module's rules.

    ``parent_label`` names the parent in messages ('standard', or its path)."""
    own = pairs_of(child)
    _known_keys(own, tuple(LadderSpec.model_fields) + CHILD_KEYS, "", "a ladder that extends another")
    missing = [k for k in REQUIRED_IN_CHILD if k not in own]
    if missing:
        raise LadderError(f"{at(child)}: a ladder that extends another states its own {' and '.join(missing)} "
                          f"(add {', '.join(f'{k}: …' for k in missing)}: the results must not name {parent_label} "
                          "for a ladder that is not it)")
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    for key, value in parent.value:
        name = str(key.value)
        if name == "checks":
            merged.append((key, _merge_checks(value, child, own, parent_label)))
        elif name in own:
            child_key, child_value = own[name]
            merged.append((child_key, child_value if name in REPLACED_WHOLE else merge_nodes(value, child_value)))
        else:
            merged.append((key, value))
    done = {str(k.value) for k, _ in parent.value} | set(CHILD_KEYS) | {"checks"}
    merged.extend(pair for name, pair in own.items() if name not in done)
    return yaml.MappingNode(MAP_TAG, merged, parent.start_mark, parent.end_mark)


def _merge_checks(parent_checks: yaml.Node, child: yaml.MappingNode,
                  own: dict[str, tuple[yaml.Node, yaml.Node]], parent_label: str) -> yaml.SequenceNode:
    assert isinstance(parent_checks, yaml.SequenceNode)  # the parent was validated as a ladder
    entries: dict[str, yaml.MappingNode] = {}
    for entry in parent_checks.value:
        assert isinstance(entry, yaml.MappingNode)
        entries[str(pairs_of(entry)["id"][1].value)] = entry
    ids = list(entries)
    dropped = _without(own, ids, parent_label)
    overrides = _overrides(own, ids, parent_label)
    for cid, (key, override) in overrides.items():
        if cid in dropped:
            raise LadderError(f"{at(key)}: checks: {cid!r} is both changed here and dropped by without: "
                              "(keep one of the two)")
        entries[cid] = _override(entries[cid], override, cid)
    order = [cid for cid in ids if cid not in dropped]
    added = _added(own, set(ids) - dropped, order)
    placed: dict[str, str] = {}  # place key ('after:X' / 'before:X') -> id of the last check put there
    for cid, place, entry in added:
        entries[cid] = entry
        if place is None:
            order.append(cid)
            continue
        side, anchor = place
        if side == "after":
            # several checks after one anchor keep the child's order: after the last one put there
            order.insert(order.index(placed.get(f"after:{anchor}", anchor)) + 1, cid)
            placed[f"after:{anchor}"] = cid
        else:
            order.insert(order.index(anchor), cid)  # before X, then before X again: child's order kept
    return yaml.SequenceNode(SEQ_TAG, [entries[cid] for cid in order], parent_checks.start_mark,
                             parent_checks.end_mark)


def _without(own: dict[str, tuple[yaml.Node, yaml.Node]], ids: list[str], parent_label: str) -> set[str]:
    if "without" not in own:
        return set()
    node = own["without"][1]
    items = node.value if isinstance(node, yaml.SequenceNode) else None
    if items is None or any(scalar(item) is None for item in items):
        raise LadderError(f"{at(node)}: without: expected a list of check ids of {parent_label} to drop, "
                          "e.g. without: [framework.vllm.compile]")
    dropped: set[str] = set()
    for item in items:
        cid = str(item.value)
        if cid not in ids:
            raise LadderError(f"{at(item)}: without: {parent_label} has no check {cid!r} ({did_you_mean(cid, ids)})")
        if cid in dropped:
            raise LadderError(f"{at(item)}: without: {cid!r} is listed twice (remove one)")
        dropped.add(cid)
    return dropped


def _overrides(own: dict[str, tuple[yaml.Node, yaml.Node]], ids: list[str],
               parent_label: str) -> dict[str, tuple[yaml.Node, yaml.MappingNode]]:
    if "checks" not in own:
        return {}
    node = own["checks"][1]
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return {}  # 'checks:' with nothing under it
    if not isinstance(node, yaml.MappingNode):
        raise LadderError(f"{at(node)}: checks: in a ladder that extends another, checks maps a check id of "
                          f"{parent_label} to the fields that change (e.g. smoke.matmul: {{params: {{max_n: 512}}}}); "
                          "new checks go under add:")
    out: dict[str, tuple[yaml.Node, yaml.MappingNode]] = {}
    for id_node, override in node.value:
        cid = str(id_node.value)
        if cid not in ids:
            raise LadderError(f"{at(id_node)}: checks: {parent_label} has no check {cid!r} ({did_you_mean(cid, ids)}; "
                              "a new check goes under add:, with its id, step and kind)")
        if not isinstance(override, yaml.MappingNode):
            raise LadderError(f"{at(override)}: checks.{cid}: expected the fields that change, as a mapping "
                              "(e.g. params: {…}, timeout_s: 300)")
        fields = (*(f for f in CheckSpec.model_fields if f != "id"), UNSET)
        for k, _ in override.value:
            if str(k.value) == "id":
                raise LadderError(f"{at(k)}: checks.{cid}.id: the id is the key above and cannot change "
                                  "(to rename a check, drop it with without: and add it under add:)")
        _known_keys(pairs_of(override), fields, f"checks.{cid}.", "a check's override")
        out[cid] = (id_node, override)
    return out


def _override(entry: yaml.MappingNode, override: yaml.MappingNode, cid: str) -> yaml.MappingNode:
    """The parent's entry with the override's ``unset`` paths removed, then its fields merged on."""
    own = pairs_of(override)
    fields = yaml.MappingNode(MAP_TAG, [(k, v) for k, v in override.value if str(k.value) != UNSET],
                              override.start_mark, override.end_mark)
    if UNSET in own:
        _, node = own[UNSET]
        items = node.value if isinstance(node, yaml.SequenceNode) else None
        if items is None or any(scalar(item) is None for item in items):
            raise LadderError(f"{at(node)}: checks.{cid}.unset: expected a list of dotted paths into the "
                              "parent's entry, e.g. unset: [params.budget_s]")
        for item in items:
            path = str(item.value).split(".")
            if _path_set(fields, path):
                raise LadderError(f"{at(item)}: checks.{cid}.unset: {item.value!r} is also set in this override "
                                  "(unset it or set it, not both)")
            entry = _without_path(entry, path, f"{at(item)}: checks.{cid}.unset")
    return _as_mapping(merge_nodes(entry, fields))


def _path_set(fields: yaml.MappingNode, path: list[str]) -> bool:
    """Whether the override writes the value at ``path`` or something inside it."""
    node: yaml.Node = fields
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            return True  # the override replaces a value above the path whole
        found = pairs_of(node).get(part)
        if found is None:
            return False
        node = found[1]
    return True


def _without_path(node: yaml.MappingNode, path: list[str], where_unset: str,
                  done: tuple[str, ...] = ()) -> yaml.MappingNode:
    """A copy of ``node`` without the key at ``path`` (the nodes it shares are untouched);
    ``where_unset`` ('file:line: checks.ID.unset') starts every error."""

    def error(msg: str) -> LadderError:
        return LadderError(f"{where_unset}: {msg}")

    own = pairs_of(node)
    part = path[0]
    where = ".".join((*done, part))
    if part not in own:
        raise error(f"the parent's entry has no {where!r} ({did_you_mean(part, list(own))})")
    if part == "id":
        raise error("the id cannot be unset")
    if len(path) == 1:
        kept = [(k, v) for k, v in node.value if str(k.value) != part]
    else:
        child = own[part][1]
        if not isinstance(child, yaml.MappingNode):
            raise error(f"{where!r} of the parent's entry is no mapping, so {'.'.join(path[1:])!r} cannot be in it")
        inner = _without_path(child, path[1:], where_unset, (*done, part))
        kept = [(k, inner if str(k.value) == part else v) for k, v in node.value]
    return yaml.MappingNode(MAP_TAG, kept, node.start_mark, node.end_mark, flow_style=node.flow_style)


def _added(own: dict[str, tuple[yaml.Node, yaml.Node]], kept: set[str],
           order: list[str]) -> list[tuple[str, tuple[str, str] | None, yaml.MappingNode]]:
    """``add:`` entries as (id, (side, anchor) or None, entry without its placement key)."""
    if "add" not in own:
        return []
    _, node = own["add"]
    if not isinstance(node, yaml.SequenceNode) or not all(isinstance(e, yaml.MappingNode) for e in node.value):
        raise LadderError(f"{at(node)}: add: expected a list of checks, each a full entry as in any ladder "
                          "(id, step, kind, …) with after: ID or before: ID to place it")
    out: list[tuple[str, tuple[str, str] | None, yaml.MappingNode]] = []
    known = set(kept)
    for i, entry in enumerate(node.value):
        assert isinstance(entry, yaml.MappingNode)
        fields = pairs_of(entry)
        _known_keys(fields, tuple(CheckSpec.model_fields) + PLACES, f"add.{i}.", "an added check")
        cid = scalar(fields["id"][1]) if "id" in fields else None
        if cid is None:
            raise LadderError(f"{at(entry)}: add.{i}: an added check needs its id (id: …)")
        if cid in known:
            why = "is a check already (change it under checks: instead)" if cid in kept else "is added twice"
            raise LadderError(f"{at(fields['id'][1])}: add.{i}: {cid!r} {why}")
        places = [p for p in PLACES if p in fields]
        if len(places) > 1:
            raise LadderError(f"{at(entry)}: add.{cid}: give after: or before:, not both")
        place: tuple[str, str] | None = None
        if places:
            anchor_node = fields[places[0]][1]
            anchor = scalar(anchor_node)
            if anchor is None or anchor not in known:
                choices = [c for c in order if c in known] + [c for c, _, _ in out]
                raise LadderError(f"{at(anchor_node)}: add.{cid}.{places[0]}: no check {anchor_node.value!r} to "
                                  f"place it {places[0]} ({did_you_mean(str(anchor_node.value), choices)})")
            place = (places[0], anchor)
        known.add(cid)
        kept_pairs = [(k, v) for k, v in entry.value if str(k.value) not in PLACES]
        out.append((cid, place, yaml.MappingNode(MAP_TAG, kept_pairs, entry.start_mark, entry.end_mark)))
    return out


def _known_keys(pairs: dict[str, tuple[yaml.Node, yaml.Node]], allowed: tuple[str, ...], prefix: str,
                what: str) -> None:
    for name, (key, _) in pairs.items():
        if name not in allowed:
            raise LadderError(f"{at(key)}: {prefix}{name}: unknown key in {what} ({did_you_mean(name, list(allowed))})")


def _as_mapping(node: yaml.Node) -> yaml.MappingNode:
    assert isinstance(node, yaml.MappingNode)
    return node

