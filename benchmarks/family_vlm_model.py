"""``framework.reference`` with images on ``embedded:tiny-qwen2-vl`` over seeds: the healthy
transformers adapter passes, each planted vision-language defect fails (docs/families.md, multimodal).

For each seed, one real ``adaptcheck run --seed S`` of a three-check ladder sharing one float64
teacher (2 text + 2 image prompts): the reference check on transformers at bf16, and on
``tests.steps.frameworks.planted_vlm`` SwappedMropeSections (the decoder's M-RoPE time/height
bands swapped) and ZeroedImageFeatures (the projector's output dropped). The seed picks the
model's weights and the text prompts, so every seed is another model. Printed per seed and run:
the verdict, the teacher-forced KL mean and p99 against float64, the bf16 control's, the KL mean
as a multiple of the control (``x control``) and of its bound (``of bound``). Exit 1 when a
healthy run did not pass or a planted one did not fail.

    PYTHONPATH=. python benchmarks/family_vlm_model.py                 # seeds 0-4
    PYTHONPATH=. python benchmarks/family_vlm_model.py --seeds 0,1 --framework vllm
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
from adaptcheck.steps.frameworks.bounds import load_numerics

REPO = Path(__file__).resolve().parents[1]
MODEL = "embedded:tiny-qwen2-vl"
PLANTED = ("SwappedMropeSections", "ZeroedImageFeatures")
SIZE = {"prompts": 2, "long_prompt_tokens": 0, "chat": False, "max_tokens": 16, "images": 2}
GRADE = """
grade:
  levels:
    - level: L1
      name: multimodal reference
      conditions:
        - id: every-check
          description: every check passes
          steps: [4]
"""


def ladder(framework: str) -> str:
    runs = [("healthy", framework)] + [(name, f"tests.steps.frameworks.planted_vlm:{name}") for name in PLANTED]
    checks = [{"id": f"vlm.{name}", "step": 4, "kind": "framework.reference",
               "params": {"framework": fw, "model": MODEL, "dtype": "bf16", **SIZE, "greedy": name == "healthy"}}
              for name, fw in runs]
    return yaml.safe_dump({"schema_version": 1, "id": "vlm-bench", "version": "0",
                           "defaults": {"timeout_s": 1800}, "checks": checks}, sort_keys=False) + GRADE


def run_seed(seed: int, framework: str, root: Path) -> list[dict[str, Any]]:
    path = root / f"ladder-{seed}.yaml"
    path.write_text(ladder(framework))
    out = root / f"run-{seed}"
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu", "--model",
                    MODEL, "--seed", str(seed), "--out", str(out), "--quiet"], cwd=REPO, env=child_environ(),
                   capture_output=True, text=True, timeout=7200)
    return list(json.loads((out / "results.json").read_text())["checks"])


def _num(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated run seeds.")
    ap.add_argument("--framework", default="transformers", help="The healthy run's framework.")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run folders here.")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="vlm-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    rule = load_numerics().cross_framework["kl_mean"]  # the reference check's bound (tolerances.yaml)
    bad = 0
    tally = {name: [0, 0] for name in ("healthy", *PLANTED)}
    print(f"{'seed':>4} {'run':21} {'status':6} {'kl_mean':>9} {'kl_p99':>9} {'control':>9} {'x control':>9} "
          f"{'of bound':>8}  message")
    for seed in (int(s) for s in args.seeds.split(",")):
        for c in run_seed(seed, args.framework, root):
            which = c["id"].split(".", 1)[1]
            m = c.get("metrics", {})
            kl, ctl = m.get("tf_kl_mean"), m.get("control_kl_mean")
            x = kl / ctl if isinstance(kl, (int, float)) and isinstance(ctl, (int, float)) and ctl else None
            bound = rule.bound(ctl, "bf16") if isinstance(ctl, (int, float)) else None
            of = kl / bound if isinstance(kl, (int, float)) and bound else None
            expected = "pass" if which == "healthy" else "fail"
            tally[which][0] += c["status"] == expected
            tally[which][1] += 1
            bad += c["status"] != expected
            print(f"{seed:>4} {which:21} {c['status']:6} {_num(kl, '9.2e')} {_num(m.get('tf_kl_p99'), '9.2e')} "
                  f"{_num(ctl, '9.2e')} {_num(x, '9.1f')} {_num(of, '8.2f')}  {str(c.get('message'))[:80]}",
                  flush=True)
    print("\n" + "; ".join(f"{k} {'passes' if k == 'healthy' else 'fails'} {v[0]}/{v[1]}" for k, v in tally.items()))
    print(f"run folders: {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
