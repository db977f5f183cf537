"""``framework.reference`` on ``embedded:tiny-hybrid`` over seeds: the healthy transformers
adapter passes, each planted Mamba2 defect fails (docs/families.md, the hybrid family).

For each seed, one real ``adaptcheck run --seed S`` of a three-check ladder: the reference
check on transformers, on ``tests.steps.frameworks.planted_hybrid:SsmStateNotCarried`` (each
decode step starts from a zeroed SSM state) and on ``...:SsmNoDSkip`` (the D skip dropped).
The seed picks the embedded model's weights and the prompts, so every seed is another model.
Printed per seed and run: the verdict, the teacher-forced KL mean against float64 and the
control's, the greedy token agreement and the failed sequences. Exit 1 when a healthy outcome
did not pass or a planted one did not fail.

    PYTHONPATH=. python benchmarks/family_hybrid_model.py                 # seeds 0-4
    PYTHONPATH=. python benchmarks/family_hybrid_model.py --seeds 0 --framework vllm
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

import yaml

from adaptcheck.base.procs import child_environ

REPO = Path(__file__).resolve().parents[1]
PLANTED = {"state_not_carried": "tests.steps.frameworks.planted_hybrid:SsmStateNotCarried",
           "no_d_skip": "tests.steps.frameworks.planted_hybrid:SsmNoDSkip"}
SIZE = {"prompts": 4, "long_prompt_tokens": 128, "max_tokens": 24}
"""The standard ladder's tiny-hybrid reference size."""
GRADE = """
grade:
  levels:
    - level: L1
      name: hybrid reference
      conditions:
        - id: every-check
          description: every check passes
          steps: [4]
"""


def ladder(healthy: str) -> str:
    runs = {"healthy": healthy, **PLANTED}
    checks = [{"id": f"hybrid.{name}", "step": 4, "kind": "framework.reference",
               "params": {"framework": fw, "model": "embedded:tiny-hybrid", **SIZE,
                          **({"compile": False} if fw == "vllm" else {})}}
              for name, fw in runs.items()]
    return yaml.safe_dump({"schema_version": 1, "id": "hybrid-bench", "version": "0",
                           "defaults": {"timeout_s": 1800}, "checks": checks}, sort_keys=False) + GRADE


def run_seed(seed: int, healthy: str, root: Path) -> list[dict[str, Any]]:
    path = root / f"ladder-{seed}.yaml"
    path.write_text(ladder(healthy))
    out = root / f"run-{seed}"
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu", "--model",
                    "embedded:tiny-llama", "--seed", str(seed), "--out", str(out), "--quiet"], cwd=REPO,
                   env=child_environ(), capture_output=True, text=True, timeout=7200)
    results = json.loads((out / "results.json").read_text())
    return list(results["checks"])


def _num(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated run seeds.")
    ap.add_argument("--framework", default="transformers", help="The healthy run's framework (transformers, vllm).")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run folders here.")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="hybrid-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    bad = 0
    print(f"{'seed':>4} {'run':18} {'status':6} {'kl_mean':>9} {'control':>9} {'agree':>6} {'failed':>6} {'s':>5}  why")
    for seed in (int(s) for s in args.seeds.split(",")):
        t0 = time.monotonic()
        checks = run_seed(seed, args.framework, root)
        for c in checks:
            which = c["id"].split(".", 1)[1]
            m = c.get("metrics", {})
            expected = "pass" if which == "healthy" else "fail"
            bad += c["status"] != expected
            print(f"{seed:>4} {which:18} {c['status']:6} {_num(m.get('tf_kl_mean'), '9.2e')} "
                  f"{_num(m.get('control_kl_mean'), '9.2e')} {_num(m.get('token_agreement'), '6.1%')} "
                  f"{_num(m.get('sequences_failed'), '6d')} {_num(c.get('duration_s'), '5.0f')}  "
                  f"{c['message'][:100]}", flush=True)
        print(f"     seed {seed}: {time.monotonic() - t0:.0f} s wall", flush=True)
    print(f"run folders: {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
