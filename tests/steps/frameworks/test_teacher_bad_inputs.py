"""Bad input for step 4's teacher-forced comparison: a one-line reason in the check, and the run goes on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptcheck.frameworks import synthetic
from tests.steps.frameworks.test_framework_checks import fw_check, run_ladder

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")


def test_weights_that_do_not_fit_the_config_are_a_one_line_error_and_the_run_goes_on(
        write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    unfit = tmp_path / "unfit-model"
    shutil.copytree(synthetic.ensure_model("tiny-llama"), unfit)
    config = json.loads((unfit / "config.json").read_text())
    config["intermediate_size"] = 640  # the stored MLP weights are 512 wide
    (unfit / "config.json").write_text(json.dumps(config))
    checks = [fw_check("fw.reference", "reference", "transformers"),
              fw_check("fw.concurrent", "concurrent", "transformers"),
              fw_check("fw.embedded", "reference", "transformers", model="embedded:tiny-llama")]
    by_id, _results, proc = run_ladder(write_ladder, tmp_path, checks, "--model", str(unfit))
    for cid in ("fw.reference", "fw.concurrent"):
        c = by_id[cid]
        assert c["status"] == "error", (cid, c["message"])
        assert "do not match config.json" in c["message"] and "\n" not in c["message"]
    # The run went on: a check on another model ran (and passed) after the failures.
    assert by_id["fw.embedded"]["status"] == "pass", by_id["fw.embedded"]["message"]
    assert "Traceback" not in proc.stderr
