"""framework.compile and framework.tensor_parallel over five seeds: healthy passes, planted defects fail
(docs/features.md, "Graph capture / compile" and "Tensor parallel on one host").

For each seed, one ``adaptcheck run`` of a throw-away ladder through the real CLI on the CPU
(the seed changes the embedded model's weights and the prompts): the healthy compile check, the
two planted compile defects (eager under compile; a compiled path wrong only at padded batch
sizes), healthy TP 2 on two cores, and TP 2 with one rank's partial sum dropped
(tests/steps/frameworks/planted_ctp.py). Prints per check: passes / fails over the seeds, the
row that failed, and the proof figures.

    PYTHONPATH=. python benchmarks/feature_compile_tp.py             # seeds 0..4
    PYTHONPATH=. python benchmarks/feature_compile_tp.py --seeds 0 1 --only compile
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from tests.conftest import ladder_text
from tests.steps.frameworks.planted_ctp import compile_checks, tensor_parallel_checks

EXPECT = {"compile.healthy": "pass", "compile.eager": "fail", "compile.padded": "fail",
          "tp.healthy": "pass", "tp.dropped": "fail"}


def run_seed(seed: int, checks: list[dict[str, JsonValue]], root: Path) -> tuple[list[dict[str, Any]], float]:
    ladder = root / f"ladder-{seed}.yaml"
    ladder.write_text(ladder_text([dict(c) for c in checks], timeout_s=900))
    out = root / f"run-{seed}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(ladder), "--device", "cpu",
                    "--model", "embedded:tiny-llama", "--seed", str(seed), "--out", str(out), "--quiet"],
                   check=False, capture_output=True, text=True)
    took = time.perf_counter() - start
    results = json.loads((out / "results.json").read_text())
    return list(results["checks"]), took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--only", choices=("compile", "tp"), default=None)
    args = ap.parse_args()
    checks = [*(compile_checks() if args.only != "tp" else []), *(tensor_parallel_checks() if args.only != "compile" else [])]
    tally: dict[str, list[str]] = {c["id"]: [] for c in checks}  # type: ignore[misc]
    with tempfile.TemporaryDirectory(prefix="feature-ctp-") as tmp:
        for seed in args.seeds:
            got, took = run_seed(seed, checks, Path(tmp))
            print(f"seed {seed}: {took:.0f} s", flush=True)
            for c in got:
                rows = c.get("details", {}).get("subchecks", [])
                failed = next((r["name"] for r in rows if r["ok"] is False), "-")
                active = next((r["detail"] for r in rows if r["name"].startswith("feature active")), "")
                tally[str(c["id"])].append(str(c["status"]))
                print(f"  {c['id']:16} {c['status']:5} failed row: {failed:45.45} | {active[:110]}", flush=True)
    print("\ncheck             expected  as expected")
    for cid, statuses in tally.items():
        want = EXPECT[cid]
        print(f"{cid:17} {want:9} {sum(s == want for s in statuses)}/{len(statuses)}  ({', '.join(statuses)})")


if __name__ == "__main__":
    main()
