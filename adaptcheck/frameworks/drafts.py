"""Draft models for speculative decoding, cut from the model under test: its first layers with
its own embedding, final norm, LM head and tokenizer, written once into the model cache.

A draft must share the target's tokenizer id for id, and it must agree with the target often
enough for the verifier to accept some of its tokens and reject others: a model's own first
layers read through its own final norm and LM head do both (the "logit lens" of a residual
stream), where a random or foreign model would almost never be accepted. This serves every model
that is a local Hugging Face decoder folder (``num_hidden_layers`` in ``config.json``, weights
named ``….layers.N.…`` in safetensors); embedded models keep their own embedded drafts
(:mod:`adaptcheck.frameworks.synthetic`).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from adaptcheck.base.paths import cache_dir
from adaptcheck.frameworks.modelfiles import ModelError

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
"""A decoder layer's tensor name (``model.layers.3.self_attn.q_proj.weight``): the layer index."""
NOT_COPIED = {"model.safetensors.index.json", "config.json"}
"""Files of the target that the draft writes itself (one weights file, its own config)."""
MARKER = "adaptcheck-draft.json"
"""Written last: a folder without it is an interrupted write, made again."""


def draft_layers(num_layers: int) -> int:
    """Half the target's layers (at least one): deep enough that the draft's proposals are the
    target's token a good share of the time on a real model, shallow enough to be cheaper."""
    return max(1, num_layers // 2)


def layer_draft(target: Path, layers: int | None = None, *, root: Path | None = None) -> Path:
    """The folder of ``target``'s first ``layers`` layers (default :func:`draft_layers`), written on first use.

    Raises ModelError with the reason when ``target`` is not a folder this can cut (no
    ``num_hidden_layers``, no safetensors weights, no per-layer tensor names).
    """
    config_path = target / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"no readable config.json in {target}: {exc}") from exc
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or total < 2:
        raise ModelError(f"{target}: config.json has no num_hidden_layers of 2 or more to cut a draft from")
    keep = draft_layers(total) if layers is None else layers
    if not 1 <= keep < total:
        raise ModelError(f"{target}: a draft keeps 1 to {total - 1} of its {total} layers, not {keep}")
    weights = sorted(target.glob("*.safetensors"))
    if not weights:
        raise ModelError(f"{target}: no safetensors weights to cut a draft from")
    # The folder's name follows the target's bytes (config and weight sizes): new weights, new draft.
    ident = hashlib.sha256(config_path.read_bytes())
    for w in weights:
        ident.update(f"{w.name}:{w.stat().st_size}".encode())
    out = (root or cache_dir("models")) / f"draft-{target.name}-L{keep}-{ident.hexdigest()[:12]}"
    if (out / MARKER).exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write(target, config, weights, keep, tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(target: Path, config: dict[str, object], weights: list[Path], keep: int, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = {}
    layers_seen: set[int] = set()
    for w in weights:
        for name, t in load_file(str(w)).items():
            m = LAYER.search(name)
            if m is not None:
                layers_seen.add(int(m.group(1)))
                if int(m.group(1)) >= keep:
                    continue
            tensors[name] = t.contiguous()
    if not layers_seen:
        raise ModelError(f"{target}: no tensor is named by layer (….layers.N.…): cannot cut a draft")
    for f in target.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in NOT_COPIED:
            shutil.copyfile(f, out / f.name)
    total = config["num_hidden_layers"]
    cut = {**config, "num_hidden_layers": keep}
    # Per-layer lists (Qwen3/SmolLM3 ``layer_types``) name one entry per layer.
    for key, value in config.items():
        if isinstance(value, list) and len(value) == total and key.startswith("layer"):
            cut[key] = value[:keep]
    (out / "config.json").write_text(json.dumps(cut, indent=2))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / MARKER).write_text(json.dumps({"created_by": "adaptcheck", "draft_of": str(target),
                                          "layers": keep, "of_layers": total}, indent=2))
