"""Do a model folder's weights cover its config? An audit from headers only, before any load, that
refuses a folder a framework would silently fill with random tensors (docs/frameworks.md,
"Weights audit").
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from adaptcheck.base.errors import exception_line

Shape = tuple[int, ...]
Row = dict[str, Any]

ROW_MISSING = "checkpoint covers config.json"
ROW_UNEXPECTED = "checkpoint holds only config.json's tensors"
ROW_MISMATCHED = "tensor shapes match config.json"
ROW_TOKENIZER = "tokenizer ids fit the embedding"
ROW_WEIGHTS = "weights match config.json"
"""The single row of an audit that could not compare the weights at all."""

NAMES_SHOWN = 3
"""How many names (or whole layers) a failing row spells out before the ellipsis."""

_LAYER = re.compile(r"^(?P<stem>(?:.*\.)?(?:layers|layer|h|blocks|block)\.)(?P<index>\d+)\.")
"""A per-layer name: ``model.layers.30.mlp.up_proj.weight`` → stem ``model.layers.``, 30."""

_INV_FREQ = r"rotary_emb\.inv_freq"
_POSITION_IDS = r"(^|\.)position_ids$"


class AuditUnavailable(Exception):
    """The weights could not be compared here; the message says why (an ``ok: None`` row)."""


# ----------------------------------------------------------------------- the comparison --

@dataclass(frozen=True)
class KeyReport:
    """What :func:`compare_keys` found, in transformers' terms."""

    missing: tuple[str, ...]
    """Model names no checkpoint tensor supplies (after tying and the ignorable patterns)."""
    unexpected: tuple[str, ...]
    """Checkpoint names (as renamed for the model) the model has no place for."""
    mismatched: tuple[tuple[str, Shape, Shape], ...]
    """(model name, checkpoint shape, model shape)."""
    loaded: dict[str, Shape]
    """Model name → the shape the checkpoint gives it (matched or not)."""
    tied: dict[str, str]
    """Tied names that the checkpoint covers through their partner: absent name → present one."""
    ignored_missing: tuple[str, ...] = ()
    ignored_unexpected: tuple[str, ...] = ()
    unverified: dict[str, str] = field(default_factory=dict)
    """Fused model names whose shape could not be computed here → why (not counted missing)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)


Renamer = Callable[[str], tuple[str, "str | None"]]
"""Checkpoint name → (model name before the prefix fix, the conversion pattern that matched
or None for a plain rename)."""
Fuser = Callable[[str, list[tuple[str, str, Shape]]], dict[str, Shape]]
"""(first model name, [(checkpoint name, pattern, shape)] of the parts of one fused tensor, in
load order) → {model name: shape} it produces. May raise: the names are then unverified."""
Expander = Callable[[str, str], list[str]]
"""(renamed name, pattern) → every model name a conversion would have produced from it (a
one-to-many split), to report as UNEXPECTED when the model has none of them."""


def _natural(name: str) -> list[tuple[int, int | str]]:
    """Sort key: numeric parts numerically (``layers.2`` before ``layers.10``)."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in name.split(".")]


def _fix_prefix(key: str, expected: Collection[str], prefix: str) -> str:
    """Strip or add the base model's prefix where that turns ``key`` into a model name (a
    ``ForCausalLM`` class loaded from base-model weights, or the other way round)."""
    if not prefix:
        return key
    head = prefix + "."
    if key.startswith(head) and key[len(head):] in expected:
        return key[len(head):]
    if head + key in expected:
        return head + key
    return key


def _tie(missing: set[str], tied: Mapping[str, str]) -> dict[str, str]:
    """Remove tied names that their partner covers from ``missing``, as transformers' tie_weights
    does at load: symmetric (the target present covers a missing source), and for several names
    tied to one source any present one covers the rest. Returns absent → present."""
    covered: dict[str, str] = {}
    pairs = list(tied.items())
    for i, (target, source) in enumerate(pairs):
        source_there, target_there = source not in missing, target not in missing
        if source_there and target_there:
            continue
        if not source_there and target_there:
            target, source = source, target
        elif not source_there and not target_there:
            backup = next((t for t, s in pairs[i + 1:] if s == source and t not in missing), None)
            if backup is None:
                continue  # nothing to tie to: still missing
            source = backup
        if target in missing:
            missing.discard(target)
            covered[target] = source
    return covered


def _search_any(patterns: Iterable[str]) -> Callable[[str], bool]:
    compiled = [re.compile(p) for p in patterns if p]
    return lambda key: any(c.search(key) for c in compiled)


def compare_keys(expected: Mapping[str, Shape], checkpoint: Mapping[str, Shape], *, base_model_prefix: str = "",
                 rename: Renamer | None = None, fuse: Fuser | None = None, expand: Expander | None = None,
                 tied: Mapping[str, str] | None = None, ignore_missing: Iterable[str] = (),
                 ignore_unexpected: Iterable[str] = ()) -> KeyReport:
    """Match checkpoint tensors to model parameters the way transformers' loader does.

    ``expected``: the model's state-dict names and shapes; ``checkpoint``: the tensors' names
    and shapes. ``rename``/``fuse``/``expand`` carry the model's weight conversions
    (transformers 5; identity without them). ``tied``: model name → the name it is tied to.
    ``ignore_*``: regular expressions searched in the names, as the model class declares them.
    """
    rename = rename or (lambda key: (key, None))
    missing = set(expected)
    unexpected: set[str] = set()
    loaded: dict[str, Shape] = {}
    groups: dict[str, list[tuple[str, str, Shape]]] = {}
    for original in sorted(checkpoint, key=_natural):
        shape = tuple(checkpoint[original])
        renamed, pattern = rename(original)
        renamed = _fix_prefix(renamed, expected, base_model_prefix)
        if renamed not in expected and original in expected:
            renamed, pattern = _fix_prefix(original, expected, base_model_prefix), None
        if renamed in expected:
            if pattern is None:
                loaded[renamed] = shape
            else:
                groups.setdefault(renamed, []).append((original, pattern, shape))
        elif pattern is not None and expand is not None:
            unexpected.update(expand(renamed, pattern))
        else:
            unexpected.add(renamed)
    unverified: dict[str, str] = {}
    for first, parts in groups.items():
        try:
            produced = fuse(first, parts) if fuse is not None else {first: parts[0][2]}
        except Exception as exc:  # noqa: BLE001 - a conversion that cannot run on shapes alone
            unverified[first] = f"{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")
            # The checkpoint does supply them (maybe several, for a split): not missing.
            missing.difference_update(expand(first, parts[0][1]) if expand is not None else [first])
            missing.discard(first)
            continue
        for name, shape in produced.items():
            if name in expected:
                loaded[name] = tuple(shape)
            else:
                unexpected.add(name)
    mismatched = []
    for name, shape in loaded.items():
        missing.discard(name)
        if shape != tuple(expected[name]):
            mismatched.append((name, shape, tuple(expected[name])))
    covered = _tie(missing, tied or {})
    ignorable_missing, ignorable_unexpected = _search_any(ignore_missing), _search_any(ignore_unexpected)
    ignored_m = sorted((k for k in missing if ignorable_missing(k)), key=_natural)
    ignored_u = sorted((k for k in unexpected if ignorable_unexpected(k)), key=_natural)
    return KeyReport(
        missing=tuple(sorted(missing - set(ignored_m), key=_natural)),
        unexpected=tuple(sorted(unexpected - set(ignored_u), key=_natural)),
        mismatched=tuple(sorted(mismatched, key=lambda m: _natural(m[0]))),
        loaded=loaded, tied=covered, ignored_missing=tuple(ignored_m), ignored_unexpected=tuple(ignored_u),
        unverified=unverified,
    )


# -------------------------------------------------------------------------- in words --

def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def summarise_keys(keys: Collection[str], universe: Collection[str], *, shown: int = NAMES_SHOWN) -> tuple[str, str]:
    """(what, names): ``("10 layers' weights", "model.layers.30.* … model.layers.39.* (90 keys)")``.

    A layer all of whose names in ``universe`` are in ``keys`` is said once as ``stem.N.*``;
    other names are spelled out. The first ``shown`` items are listed, then ``…`` and the last.
    """
    per_layer: dict[tuple[str, int], int] = {}
    for name in universe:
        m = _LAYER.match(name)
        if m:
            per_layer[(m["stem"], int(m["index"]))] = per_layer.get((m["stem"], int(m["index"])), 0) + 1
    mine: dict[tuple[str, int], list[str]] = {}
    loose: list[str] = []
    for name in keys:
        m = _LAYER.match(name)
        if m:
            mine.setdefault((m["stem"], int(m["index"])), []).append(name)
        else:
            loose.append(name)
    whole = sorted(k for k, names in mine.items() if len(names) == per_layer.get(k, -1) and len(names) > 1)
    items: list[tuple[list[tuple[int, int | str]], str]] = [(_natural(f"{s}{i}"), f"{s}{i}.*") for s, i in whole]
    for k, names in mine.items():
        if k not in whole:
            loose.extend(names)
    items += [(_natural(n), n) for n in loose]
    labels = [label for _, label in sorted(items)]
    if len(labels) > shown + 1:
        listed = ", ".join(labels[:shown]) + " … " + labels[-1]
    else:
        listed = ", ".join(labels)
    others = len(keys) - sum(len(mine[k]) for k in whole)
    layers = f"{len(whole)} layers' weights" if len(whole) > 1 else "1 layer's weights"
    if whole and others:
        what = f"{layers} and {_plural(others, 'other tensor', 'other tensors')}"
    elif whole:
        what = layers
    else:
        what = _plural(others, "tensor", "tensors")
    count = f" ({_plural(len(keys), 'key', 'keys')})" if whole or len(labels) > shown + 1 else ""
    return what, listed + count


def _shape(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def key_rows(report: KeyReport, expected: Mapping[str, Shape], checkpoint: Mapping[str, Shape], *,
             model_class: str) -> list[Row]:
    """The three rows of a comparison: MISSING, UNEXPECTED, MISMATCHED (each held or not)."""
    rows: list[Row] = []
    if report.missing:
        what, names = summarise_keys(report.missing, expected)
        rows.append(_row(ROW_MISSING, False, f"{what} MISSING from the checkpoint: {names}; a framework would "
                                             "initialise them at random"))
    else:
        notes = [f"{a} through its tie to {b}" for a, b in sorted(report.tied.items())]
        if report.ignored_missing:
            notes.append(f"{len(report.ignored_missing)} absent that {model_class} declares ignorable")
        if report.unverified:
            notes.append(f"{len(report.unverified)} fused from their parts without a shape check here")
        rows.append(_row(ROW_MISSING, True, f"the checkpoint supplies all {len(expected)} tensors of {model_class}"
                                            + (f" ({'; '.join(notes)})" if notes else "")))
    if report.unexpected:
        what, names = summarise_keys(report.unexpected, report.unexpected)
        rows.append(_row(ROW_UNEXPECTED, False, f"{what} UNEXPECTED in the checkpoint ({model_class} of config.json "
                                                f"has no such tensor): {names}; a framework would ignore them"))
    else:
        ignored = f" ({len(report.ignored_unexpected)} ignorable: {', '.join(report.ignored_unexpected[:NAMES_SHOWN])})" \
            if report.ignored_unexpected else ""
        rows.append(_row(ROW_UNEXPECTED, True, f"every one of the {len(checkpoint)} checkpoint tensors is a tensor "
                                               f"of {model_class}{ignored}"))
    if report.mismatched:
        shown = "; ".join(f"{name} {_shape(got)} in the checkpoint, {_shape(want)} by config.json"
                          for name, got, want in report.mismatched[:NAMES_SHOWN])
        more = f" … ({len(report.mismatched)} keys)" if len(report.mismatched) > NAMES_SHOWN else ""
        rows.append(_row(ROW_MISMATCHED, False, f"{_plural(len(report.mismatched), 'tensor', 'tensors')} MISMATCHED "
                                                f"(shapes that do not match config.json): {shown}{more}"))
    else:
        rows.append(_row(ROW_MISMATCHED, True, f"{len(report.loaded)} tensors have the shapes config.json implies"))
    return rows


def tokenizer_row(max_id: int | None, rows: int | None, *, source: str, why: str = "") -> Row:
    """Every id the tokenizer can produce must index a row of the embedding."""
    if max_id is None or rows is None:
        return _row(ROW_TOKENIZER, None, f"could not audit: {why or 'no tokenizer or embedding size'}")
    if max_id >= rows:
        return _row(ROW_TOKENIZER, False, f"the tokenizer produces ids up to {max_id} but the embedding has "
                                          f"{rows} rows ({source}): ids {rows}..{max_id} index past it")
    return _row(ROW_TOKENIZER, True, f"largest tokenizer id {max_id} < {rows} embedding rows ({source})")


def _row(name: str, ok: bool | None, detail: str) -> Row:
    return {"name": name, "ok": ok, "detail": detail}


# ------------------------------------------------------------------------ the folder --

@dataclass
class WeightsAudit:
    """The audit of one model folder: its rows, and whether it refuses the folder."""

    path: Path
    rows: list[Row]
    seconds: float
    facts: dict[str, JsonValue] = field(default_factory=dict)
    """Counts and sources for the report (model class, tensors expected/in the checkpoint …)."""

    @property
    def refused(self) -> bool:
        """Some row did not hold: the folder must not be served."""
        return any(r["ok"] is False for r in self.rows)

    @property
    def message(self) -> str:
        """One line: the first row that did not hold (and how many more), else a summary."""
        failed = [r for r in self.rows if r["ok"] is False]
        if failed:
            more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
            return f"model folder refused: {failed[0]['detail']}{more}"
        not_run = [r["detail"] for r in self.rows if r["ok"] is None]
        held = [r for r in self.rows if r["ok"]]
        tail = f"; {not_run[0]}" if not_run else ""
        return f"weights audit: {len(held)} of {len(self.rows)} sub-checks held{tail}"

    def describe(self) -> dict[str, JsonValue]:
        """Plain JSON-able facts for ``details.weights_audit``."""
        return {"path": str(self.path), "refused": self.refused, "seconds": round(self.seconds, 4), **self.facts}


@dataclass(frozen=True)
class Checkpoint:
    """The tensors a framework would load from a folder, read from the safetensors headers."""

    files: tuple[str, ...]
    shapes: dict[str, Shape]
    duplicates: tuple[str, ...] = ()
    """Names stored in more than one shard (the last read wins in transformers)."""


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files loaded from ``path``: the shards the index names, else
    ``model.safetensors``, else every ``*.safetensors`` (vLLM's rule). Raises AuditUnavailable
    for a folder of PyTorch pickles (their tensor list cannot be read without unpickling)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return [path / name for name in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AuditUnavailable(f"{index.name} is not a readable weights index ({type(exc).__name__})") from None
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if files:
        return files
    if any(path.glob("pytorch_model*.bin")):
        raise AuditUnavailable("the weights are PyTorch pickles (pytorch_model*.bin): only safetensors headers "
                               "are read")
    raise AuditUnavailable("no *.safetensors file")


class UnreadableCheckpoint(Exception):
    """A safetensors file whose header cannot be read: no framework can load it either."""


def read_checkpoint(path: Path) -> Checkpoint:
    """Names and shapes of every tensor, from the headers (``safe_open``: no tensor data is read)."""
    from safetensors import safe_open

    shapes: dict[str, Shape] = {}
    duplicates: list[str] = []
    files = checkpoint_files(path)
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():
                    if name in shapes:
                        duplicates.append(name)
                    shapes[name] = tuple(int(d) for d in fh.get_slice(name).get_shape())
        except FileNotFoundError:
            raise UnreadableCheckpoint(f"{file.name}, named in the weights index, is not there") from None
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise UnreadableCheckpoint(f"the tensor list of {file.name} cannot be read: "
                                       f"{exception_line(exc, with_type=False)}") from None
    return Checkpoint(files=tuple(f.name for f in files), shapes=shapes, duplicates=tuple(duplicates))


@dataclass
class ExpectedModel:
    """The model config.json describes, as names and shapes (built on the meta device)."""

    model_class: str
    shapes: dict[str, Shape]
    base_model_prefix: str
    tied: dict[str, str]
    ignore_missing: list[str]
    ignore_unexpected: list[str]
    embedding: str | None
    """State-dict name of the input embedding's weight."""
    rename: Renamer | None = None
    fuse: Fuser | None = None
    expand: Expander | None = None


def _patterns(value: Any) -> list[str]:
    if not value:
        return []
    return [str(v) for v in (value if isinstance(value, (list, tuple, set, frozenset)) else [value])]


def expected_model(path: Path) -> ExpectedModel:
    """Build the model of ``path/config.json`` on the meta device and describe what it loads.

    Raises AuditUnavailable when it cannot be built here (with the reason).
    """
    config_data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config_data, dict):
        raise AuditUnavailable("config.json is not a JSON object")
    quant = config_data.get("quantization_config") or (config_data.get("text_config") or {}).get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise AuditUnavailable(f"a quantized checkpoint ({method}): its tensor layout is its quantizer's")
    if config_data.get("auto_map"):
        raise AuditUnavailable("the model is custom code (config.json's auto_map), which adaptcheck does not run")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise AuditUnavailable(f"{exc.name or 'transformers'} is not installed") from None
    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - an unknown model_type, a config this version cannot read
        raise AuditUnavailable(f"transformers {transformers.__version__} cannot read config.json: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    try:
        with torch.device("meta"):
            if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
                model = cls._from_config(config)
            else:
                model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - an architecture this transformers does not build
        raise AuditUnavailable(f"transformers {transformers.__version__} cannot build {arch or 'the model'}: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
    shapes = {name: tuple(int(d) for d in t.shape) for name, t in model.state_dict().items()}
    buffers = [name for name, _ in model.named_buffers()]
    ignore_unexpected = _patterns(getattr(model, "_keys_to_ignore_on_load_unexpected", None))
    if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
        ignore_unexpected.append(_INV_FREQ)
    if any(b.endswith("position_ids") for b in buffers):
        ignore_unexpected.append(_POSITION_IDS)
    expected = ExpectedModel(
        model_class=type(model).__name__, shapes=shapes, base_model_prefix=str(getattr(model, "base_model_prefix", "")),
        tied=_tied_keys(model), ignore_missing=_patterns(getattr(model, "_keys_to_ignore_on_load_missing", None)),
        ignore_unexpected=ignore_unexpected, embedding=_embedding_name(model),
    )
    _add_conversions(expected, model)
    return expected


def _first_line(exc: BaseException) -> str:
    return exception_line(exc, with_type=False)


def _tied_keys(model: Any) -> dict[str, str]:
    """Tied name → its source: transformers 5's ``all_tied_weights_keys``, else (4.x) the
    ``_tied_weights_keys`` list tied to the input embedding when the config ties them."""
    mapping = getattr(model, "all_tied_weights_keys", None)
    if isinstance(mapping, dict):
        return {str(k): str(v) for k, v in mapping.items()}
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    names = getattr(model, "_tied_weights_keys", None)
    embedding = _embedding_name(model)
    if not getattr(text, "tie_word_embeddings", False) or not names or embedding is None:
        return {}
    return {str(k): embedding for k in (names if isinstance(names, (list, tuple, set)) else [names])}


def _embedding_name(model: Any) -> str | None:
    try:
        weight = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return None
    return next((n for n, p in model.named_parameters(remove_duplicate=False) if p is weight), None)


def _add_conversions(expected: ExpectedModel, model: Any) -> None:
    """transformers 5's renames and fusions of checkpoint names (none before 5)."""
    try:
        import torch
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return
    import copy

    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    dtype = next((p.dtype for p in model.parameters()), torch.float32)

    def rename(key: str) -> tuple[str, str | None]:
        renamed, pattern = rename_source_key(key, renamings, converters)
        return renamed, pattern

    def fuse(first: str, parts: list[tuple[str, str, Shape]]) -> dict[str, Shape]:
        # A fresh copy per fused tensor, fed meta tensors of the checkpoint's shapes: the
        # conversion's own operations (stack, concatenate …) give the shape it would load.
        converter = copy.deepcopy(by_pattern[parts[0][1]])
        for original, pattern, shape in parts:
            # The loader's synchronous path collects callables that materialise a tensor.
            part: Any = functools.partial(torch.empty, shape, dtype=dtype, device="meta")
            converter.add_tensor(first, original, pattern, part)
        produced = converter.convert(first, model=model, config=model.config)
        return {name: tuple(int(d) for d in (t[0] if isinstance(t, list) else t).shape) for name, t in produced.items()}

    def expand(renamed: str, pattern: str) -> list[str]:
        targets = by_pattern[pattern].target_patterns
        return [renamed.replace(targets[0], t) for t in targets]

    expected.rename, expected.fuse, expected.expand = rename, fuse, expand


def tokenizer_max_id(path: Path) -> int:
    """The largest id the folder's tokenizer produces (vocabulary and added tokens), as
    transformers' AutoTokenizer — what the frameworks load — builds it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    ids = [int(i) for i in tok.get_vocab().values()]
    ids += [int(i) for i in getattr(tok, "added_tokens_decoder", {})]
    return max([*ids, len(tok) - 1])


def _config_vocab(path: Path) -> int | None:
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for cfg in (data, data.get("text_config") if isinstance(data, dict) else None):
        if isinstance(cfg, dict) and isinstance(cfg.get("vocab_size"), int):
            return int(cfg["vocab_size"])
    return None


def audit_model_folder(path: Path, *, tokenizer: bool = True) -> WeightsAudit:
    """Audit ``path`` (a Hugging Face model folder): weights vs config.json, tokenizer vs embedding.

    Never raises for a folder it cannot judge: that is an ``ok: None`` row with the reason.
    """
    start = time.perf_counter()
    path = Path(path)
    rows: list[Row] = []
    facts: dict[str, JsonValue] = {}
    embedding_rows: int | None = None
    embedding_source = ""
    try:
        ckpt = read_checkpoint(path)
        facts["files"] = [f for f in ckpt.files]
        facts["checkpoint_tensors"] = len(ckpt.shapes)
        expected = expected_model(path)
        facts["model_class"] = expected.model_class
        facts["expected_tensors"] = len(expected.shapes)
        report = compare_keys(expected.shapes, ckpt.shapes, base_model_prefix=expected.base_model_prefix,
                              rename=expected.rename, fuse=expected.fuse, expand=expected.expand, tied=expected.tied,
                              ignore_missing=expected.ignore_missing, ignore_unexpected=expected.ignore_unexpected)
        facts.update(missing=len(report.missing), unexpected=len(report.unexpected), mismatched=len(report.mismatched))
        facts["tied"] = {a: b for a, b in report.tied.items()}
        rows += key_rows(report, expected.shapes, ckpt.shapes, model_class=expected.model_class)
        emb = expected.embedding
        for name in (emb, report.tied.get(emb or "")):
            if name and name in report.loaded:
                embedding_rows, embedding_source = report.loaded[name][0], f"{name} {_shape(report.loaded[name])}"
                break
    except UnreadableCheckpoint as exc:
        rows.append(_row(ROW_WEIGHTS, False, str(exc)))
    except AuditUnavailable as exc:
        rows.append(_row(ROW_WEIGHTS, None, f"could not audit: {exc}"))
    except Exception as exc:  # noqa: BLE001 - an audit that breaks must not pass or refuse a model
        rows.append(_row(ROW_WEIGHTS, None, f"could not audit: {type(exc).__name__}: {_first_line(exc)}"))
    if tokenizer:
        if embedding_rows is None:
            embedding_rows, embedding_source = _config_vocab(path), "config.json vocab_size"
        try:
            max_id: int | None = tokenizer_max_id(path)
            why = ""
        except Exception as exc:  # noqa: BLE001 - the framework's own load will say more
            max_id, why = None, f"the tokenizer does not load: {type(exc).__name__}: {_first_line(exc)}"
        facts.update(tokenizer_max_id=max_id, embedding_rows=embedding_rows)
        rows.append(tokenizer_row(max_id, embedding_rows, source=embedding_source, why=why))
    return WeightsAudit(path=path, rows=rows, seconds=time.perf_counter() - start, facts=facts)


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every file the audit reads: a changed file is audited again."""
    out = []
    for f in sorted(path.iterdir()):
        if f.is_file() and (f.suffix in (".json", ".safetensors", ".model", ".txt", ".tiktoken")):
            st = f.stat()
            out.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


_CACHE: dict[tuple[str, tuple[tuple[str, int, int], ...]], WeightsAudit] = {}


def audit_cached(path: Path) -> WeightsAudit:
    """:func:`audit_model_folder`, once per process for unchanged files (step 4 asks per load)."""
    key = (str(Path(path).resolve()), _signature(Path(path)))
    if key not in _CACHE:
        _CACHE.clear()  # one model per run, as a rule: keep the last only
        _CACHE[key] = audit_model_folder(Path(path))
    return _CACHE[key]
