"""A planted tensor-parallel defect through a ``--serve`` deployment, over seeds (docs/deployment.md).

For each seed, two ``adaptcheck run --steps 4`` of a throw-away ladder (framework.vllm.load and
framework.vllm.reference) against the deployment ``vllm serve embedded:tiny-llama
--tensor-parallel-size 2 …``: healthy, then with ``ADAPTCHECK_PLANT=tp_drop_partial_sum`` (the test
venv's dummy vLLM general plugin makes TP rank 1 add zeros to every all-reduce) and with
``ADAPTCHECK_PLANT=activation_gelu`` (its SwiGLU kernel computes GELU instead of SiLU). Prints the
reference check's status and message per run; exits 1 when a healthy run does not pass or a
planted one does not fail. Needs the test venv (the plugin) and two cores.

    PYTHONPATH=. python benchmarks/deployment_planted.py [--seeds 0 1 2 3 4] [--plants none activation_gelu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from adaptcheck.ladder.loader import load_ladder

SERVE = ("vllm serve embedded:tiny-llama --tensor-parallel-size 2 --enable-prefix-caching --enforce-eager "
         "--max-model-len 512")
KEEP = ("framework.vllm.load", "framework.vllm.reference", "smoke.device_visible", "matrix.telemetry", "matrix.rules",
        "matrix.known_good", "ops.gemm", "perf.soak", "perf.regression")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--plants", nargs="+", default=["none", "tp_drop_partial_sum", "activation_gelu"],
                    help="none (healthy), tp_drop_partial_sum, activation_gelu (the dummy vLLM plugin's defects)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="deployment-planted-"))
    ladder = tmp / "planted.yaml"
    drop = [c.id for c in load_ladder("quick").spec.checks if c.id not in KEEP]
    ladder.write_text("schema_version: 1\nextends: quick\nid: planted\nwithout:\n"
                      + "".join(f"  - {i}\n" for i in drop), encoding="utf-8")
    wrong = 0
    print(f"{'plant':<22} {'seed':>4}  status  message")
    for plant in args.plants:
        for seed in args.seeds:
            out = tmp / f"{plant}-{seed}"
            env = {**os.environ, "ADAPTCHECK_PLANT": plant}
            subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--quiet", "--ladder", str(ladder), "--steps", "4",
                            "--seed", str(seed), "--out", str(out), "--serve", SERVE], env=env, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            results = json.loads((out / "results.json").read_text(encoding="utf-8"))
            ref = {c["id"]: c for c in results["checks"]}["framework.vllm.reference"]
            expected = "pass" if plant == "none" else "fail"
            wrong += ref["status"] != expected
            print(f"{plant:<22} {seed:>4}  {ref['status']:<6}  {ref['message'][:140]}")
    print(f"{wrong} unexpected result(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
