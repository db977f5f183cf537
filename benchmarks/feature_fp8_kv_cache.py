"""``framework.fp8_kv_cache`` over seeds: the healthy vLLM passes, the planted wrong-scale cache
fails, and the divergences from float64 that set the fp8 bound (docs/features.md "FP8 KV cache").

For each seed, one real ``adaptcheck run --seed S`` of a two-check ladder: the kind on vLLM, and
the kind on ``tests.steps.frameworks.planted_fp8:WrongFp8Scale`` (the fp8 cache written at twice
its scale). Both formats each (one outcome per format). The seed picks the embedded model's
weights and the prompts, so every seed is another model. Printed per seed and format: the
verdicts, the fp8 instance's teacher-forced KL mean against float64 as a multiple of the bf16
control's (``x control``), the share of the bound it used, and the kv_share it implies
(``(x control) / (u_fp8 / u_bf16)^2``: what ``model_numerics.fp8_kv_cache.kv_share`` is set
above). Exit 1 when a healthy outcome did not pass or a planted one did not fail.

    PYTHONPATH=. python benchmarks/feature_fp8_kv_cache.py                 # seeds 0-4, embedded:tiny-llama
    PYTHONPATH=. python benchmarks/feature_fp8_kv_cache.py --seeds 0 --model pretrained:smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from adaptcheck.base.procs import child_environ
from adaptcheck.steps.frameworks.kinds.fp8_kv_cache import UNIT_ROUNDOFF

REPO = Path(__file__).resolve().parents[1]
PLANTED = "tests.steps.frameworks.planted_fp8:WrongFp8Scale"
GRADE = """
grade:
  levels:
    - level: L1
      name: fp8 KV cache
      conditions:
        - id: every-check
          description: every check passes
          steps: [4]
"""


def ladder(formats: list[str]) -> str:
    checks = [{"id": f"fp8.{name}", "step": 4, "kind": "framework.fp8_kv_cache",
               "params": {"framework": fw, "formats": list(formats)}}
              for name, fw in (("healthy", "vllm"), ("planted", PLANTED))]
    return yaml.safe_dump({"schema_version": 1, "id": "fp8-bench", "version": "0",
                           "defaults": {"timeout_s": 1800}, "checks": checks}, sort_keys=False) + GRADE


def run_seed(seed: int, model: str, formats: list[str], root: Path) -> list[dict[str, Any]]:
    path = root / f"ladder-{seed}.yaml"
    path.write_text(ladder(formats))
    out = root / f"run-{seed}"
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu", "--model",
                    model, "--seed", str(seed), "--out", str(out), "--quiet"], cwd=REPO, env=child_environ(),
                   capture_output=True, text=True, timeout=7200)
    results = json.loads((out / "results.json").read_text())
    return list(results["checks"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated run seeds.")
    ap.add_argument("--model", default="embedded:tiny-llama", help="Model (--model of adaptcheck run).")
    ap.add_argument("--formats", default="fp8_e4m3,fp8_e5m2", help="Comma-separated fp8 formats.")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run folders here.")
    args = ap.parse_args()
    formats = args.formats.split(",")
    root = args.keep or Path(tempfile.mkdtemp(prefix="fp8-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    bad = 0
    tally: dict[str, list[int]] = {"healthy": [0, 0], "planted": [0, 0]}
    shares: dict[str, list[float]] = {f: [] for f in formats}
    print(f"{'seed':>4} {'format':9} {'run':8} {'status':6} {'x control':>10} {'of bound':>9} {'kv_share':>9}  why")
    for seed in (int(s) for s in args.seeds.split(",")):
        for c in run_seed(seed, args.model, formats, root):
            which = "healthy" if c["id"].startswith("fp8.healthy") else "planted"
            fmt = c["id"].rsplit(".", 1)[-1]
            m = c.get("metrics", {})
            x, of = m.get("tf_kl_mean_x_control"), m.get("tf_kl_mean_of_bound")
            share = x / (UNIT_ROUNDOFF[fmt] / UNIT_ROUNDOFF["bf16"]) ** 2 if isinstance(x, (int, float)) else None
            expected = "pass" if which == "healthy" else "fail"
            tally[which][0] += c["status"] == expected
            tally[which][1] += 1
            bad += c["status"] != expected
            if which == "healthy" and share is not None:
                shares[fmt].append(share)
            def num(v: Any, spec: str) -> str:
                return format(v, spec) if isinstance(v, (int, float)) else "-"
            print(f"{seed:>4} {fmt:9} {which:8} {c['status']:6} {num(x, '10.1f')} {num(of, '9.2f')} "
                  f"{num(share, '9.3f')}  {c['message'][:110]}", flush=True)
    print(f"\nhealthy passes {tally['healthy'][0]}/{tally['healthy'][1]}; "
          f"planted fails {tally['planted'][0]}/{tally['planted'][1]}")
    for fmt, vals in shares.items():
        if vals:
            print(f"{fmt}: healthy kv_share {min(vals):.3f}..{max(vals):.3f} over {len(vals)} seeds")
    print(f"run folders: {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
