"""A check whose optional dependency is missing is n/a with the pip command that installs it:
never an error, never a failed family, never an empty message (issue 39: README command 1
installed no Pillow, and the vision-language checks errored with "ImportError:" and nothing after).

Pillow cannot be uninstalled from the test venv (vLLM needs it), so the run's processes get a
``sitecustomize`` that makes ``import PIL`` fail as it does where Pillow is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ladder_text, run_cli

BLOCK_PIL = '''
import sys


class _NoPillow:
    """Import PIL as in a venv without Pillow: ModuleNotFoundError."""

    def find_spec(self, name, path=None, target=None):
        if name == "PIL" or name.startswith("PIL."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoPillow())
'''


@pytest.mark.slow  # ~40 s: the CLI, one worker, the VLM written and loaded
def test_a_vision_model_without_pillow_is_not_applicable_with_the_install_command(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_PIL)
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(ladder_text([{"id": "vlm.load", "step": 4, "kind": "framework.load", "tags": ["family:multimodal"],
                                    "params": {"framework": "transformers", "model": "embedded:tiny-qwen2-vl"}}],
                                  timeout_s=600))
    out = tmp_path / "run"
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out), "--quiet"],
                   env={"PYTHONPATH": f"{site}:{Path(__file__).resolve().parents[2]}"}, timeout=900)
    import json

    results = json.loads((out / "results.json").read_text())
    check = next(c for c in results["checks"] if c["id"] == "vlm.load")
    assert check["status"] == "skip" and check.get("applicable") is False, (check, proc.stderr[-2000:])
    assert "pip install pillow" in check["message"] and "PIL" in check["message"], check["message"]
    assert not check["message"].rstrip().endswith(":")
    family = next(f for f in results["families"] if f["name"] == "multimodal")
    assert family["status"] != "failed", family
