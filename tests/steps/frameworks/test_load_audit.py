"""A model folder whose weights do not cover its config is refused by step 4, never served.

One real ``adaptcheck run``: transformers' load check on a copy of the embedded model whose
config.json declares more layers than its checkpoint holds (transformers would initialise
them at random and every answer-level check would agree with a reference built the same
way), and on the untouched folder. The audit itself is tested in
tests/frameworks/test_weights_audit.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptcheck.frameworks import synthetic
from tests.steps.frameworks.test_framework_checks import fw_check, run_ladder

pytestmark = pytest.mark.slow  # one CLI run with a transformers load: outside the fast lane


def test_load_check_refuses_a_folder_with_more_layers_than_its_weights(write_ladder: Callable[..., Path],
                                                                        tmp_path: Path) -> None:
    original = synthetic.ensure_model("tiny-llama")
    deeper = tmp_path / "deeper-model"
    shutil.copytree(original, deeper)
    config = json.loads((deeper / "config.json").read_text())
    config["num_hidden_layers"] = 12  # the checkpoint holds 2
    (deeper / "config.json").write_text(json.dumps(config))
    checks = [fw_check("fw.load", "load", "transformers"),
              fw_check("fw.single_request", "single_request", "transformers"),
              fw_check("fw.load.original", "load", "transformers", model=str(original))]
    by_id, _results, proc = run_ladder(write_ladder, tmp_path, checks, "--model", str(deeper))

    refused = by_id["fw.load"]
    assert refused["status"] == "fail", refused["message"]
    msg = refused["message"]
    assert msg.startswith("model folder refused: 10 layers' weights MISSING from the checkpoint: "
                          "model.layers.2.*"), msg
    assert "(90 keys)" in msg and "\n" not in msg
    rows = {r["name"]: r for r in refused["details"]["subchecks"]}
    assert rows["checkpoint covers config.json"]["ok"] is False
    assert refused["details"]["weights_audit"]["missing"] == 90
    # The folder was never loaded: the next check on it is an error with the same line.
    later = by_id["fw.single_request"]
    assert later["status"] == "error" and later["message"] == msg, later["message"]

    passed = by_id["fw.load.original"]
    assert passed["status"] == "pass", passed["message"]
    assert "weights audit: 4/4 held" in passed["message"]
    assert all(r["ok"] for r in passed["details"]["subchecks"]), passed["details"]["subchecks"]
    assert "Traceback" not in proc.stderr
