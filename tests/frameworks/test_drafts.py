"""frameworks/drafts: a draft cut from any local decoder folder keeps exactly the first layers,
the shared tensors and the tokenizer; what it cannot cut is a ModelError with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adaptcheck.frameworks.drafts import MARKER, draft_layers, layer_draft
from adaptcheck.frameworks.modelfiles import ModelError


def target_folder(root: Path, layers: int = 4, **config: object) -> Path:
    folder = root / "target"
    folder.mkdir()
    tensors = {"model.embed_tokens.weight": torch.randn(10, 4), "model.norm.weight": torch.ones(4)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.down_proj.weight"] = torch.full((4, 4), float(i))
    # Two shards, as a real checkpoint may be.
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[len(names) // 2:]}, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "model.safetensors.index.json").write_text("{}")
    (folder / "tokenizer.json").write_text('{"tok": 1}')
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": 4,
                                                    "layer_types": ["full_attention"] * layers, **config}))
    return folder


def test_the_draft_keeps_the_first_layers_and_everything_shared(tmp_path: Path) -> None:
    draft = layer_draft(target_folder(tmp_path, layers=4), root=tmp_path / "cache")
    config = json.loads((draft / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 == draft_layers(4)
    assert config["layer_types"] == ["full_attention"] * 2
    tensors = load_file(str(draft / "model.safetensors"))
    assert sorted(tensors) == ["model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
                               "model.layers.1.mlp.down_proj.weight", "model.norm.weight"]
    assert float(tensors["model.layers.1.mlp.down_proj.weight"][0, 0]) == 1.0  # layer 1, not another
    assert (draft / "tokenizer.json").read_text() == '{"tok": 1}'
    assert not (draft / "model.safetensors.index.json").exists()  # one weights file, no stale index
    assert (draft / MARKER).exists()


def test_the_draft_is_written_once_and_follows_the_target(tmp_path: Path) -> None:
    target = target_folder(tmp_path, layers=4)
    first = layer_draft(target, root=tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert layer_draft(target, root=tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    # Other weights (another size): another folder, never the stale draft.
    save_file({"model.layers.0.x": torch.zeros(8)}, str(target / "model-00001-of-00002.safetensors"))
    assert layer_draft(target, root=tmp_path / "cache") != first


@pytest.mark.parametrize(("config", "layers", "says"), [
    ({"num_hidden_layers": 1}, None, "num_hidden_layers of 2 or more"),
    ({}, 4, "1 to 3 of its 4 layers"),
])
def test_what_cannot_be_cut_says_why(tmp_path: Path, config: dict[str, object], layers: int | None,
                                     says: str) -> None:
    target = target_folder(tmp_path, layers=4, **config)
    with pytest.raises(ModelError, match=says):
        layer_draft(target, layers, root=tmp_path / "cache")


def test_a_folder_without_per_layer_names_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "flat"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    save_file({"blocks_0_w": torch.zeros(2)}, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match="no tensor is named by layer"):
        layer_draft(folder, root=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*"))  # nothing half-written left behind
