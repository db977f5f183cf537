"""``framework.reference`` on the embedded DeepSeek-V3 and Qwen3-MoE models over seeds: healthy
frameworks pass, the planted DeepSeek defects fail (docs/families.md).

For each seed, one real ``adaptcheck run --seed S`` of a small ladder (the quick ladder's teacher
sizes): the reference check of transformers and of vLLM in process on both models, and of the
four transformers adapters of ``tests/steps/frameworks/planted_families.py`` on DeepSeek (router
ignores its correction bias, shared expert dropped, MLA without the query's rotary part, MLA with
the latent's key/value halves swapped). The seed picks the embedded models' weights, so each seed
is another pair of models. Prints one row per seed and check (status, teacher-forced KL mean
against its bound, KL p99, same-top-token rate, greedy token agreement, seconds), then the totals
"healthy passes x/N" and "planted fails x/N"; exits 1 when a healthy check did not pass or a
planted one did not fail.

    python benchmarks/family_moe_models.py                      # seeds 0-4, transformers and vLLM
    python benchmarks/family_moe_models.py --seeds 0,1 --no-vllm
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLANTED = "tests.steps.frameworks.planted_families:"
DEEPSEEK, QWEN3_MOE = "embedded:tiny-deepseek-v3", "embedded:tiny-qwen3-moe"
TEACHER = {"prompts": 3, "long_prompt_tokens": 128, "max_tokens": 16}
DEFECTS = ("RoutingBiasIgnored", "SharedExpertDropped", "MlaQueryRopeDropped", "MlaKvHalvesSwapped")

GRADE = """
grade:
  levels:
    - level: L1
      name: step 4 ran
      conditions:
        - id: reference
          description: the reference checks ran
          steps: [4]
"""


def checks(vllm: bool) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(ladder checks, healthy ids, planted ids)."""
    def ref(id_: str, framework: str, model: str, **extra: Any) -> dict[str, Any]:
        return {"id": id_, "step": 4, "kind": "framework.reference",
                "params": {"framework": framework, "model": model, **TEACHER, **extra}}

    frameworks = ["transformers", "vllm"] if vllm else ["transformers"]
    healthy = [ref(f"{short}.{fw}", fw, model, **({"compile": False} if fw == "vllm" else {}))
               for short, model in (("ds", DEEPSEEK), ("q3", QWEN3_MOE)) for fw in frameworks]
    planted = [ref(f"planted.{name}", PLANTED + name, DEEPSEEK) for name in DEFECTS]
    return healthy + planted, [c["id"] for c in healthy], [c["id"] for c in planted]


def run_seed(seed: int, ladder: list[dict[str, Any]], work: Path) -> dict[str, dict[str, Any]]:
    path = work / f"ladder-{seed}.yaml"
    body = {"schema_version": 1, "id": "family-moe-models", "version": "0", "defaults": {"timeout_s": 900},
            "checks": ladder}
    path.write_text(yaml.safe_dump(body, sort_keys=False) + GRADE)
    out = work / f"run-{seed}"
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu",
                    "--model", DEEPSEEK, "--seed", str(seed), "--out", str(out), "--quiet"],
                   cwd=ROOT, capture_output=True, text=True, timeout=3600)
    results = out / "results.json"
    if not results.exists():
        return {}
    return {c["id"]: c for c in json.loads(results.read_text())["checks"]}


def figures(check: dict[str, Any] | None) -> str:
    if check is None:
        return "missing"
    m = check.get("metrics") or {}
    bounds = ((check.get("details") or {}).get("teacher_forced") or {}).get("bounds") or {}
    bound = (bounds.get("kl_mean") or {}).get("bound")

    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    return (f"{check['status']:<5} kl_mean {num(m.get('tf_kl_mean'), '.4f')} (bound {num(bound, '.4f')}) "
            f"kl_p99 {num(m.get('tf_kl_p99'), '.3f')} same_top {num(m.get('tf_same_top_rate'), '.3f')} "
            f"tokens {num(m.get('token_agreement'), '.3f')} {num(check.get('duration_s'), '.1f')} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated embedded-model seeds")
    ap.add_argument("--no-vllm", action="store_true", help="transformers only (also implied when vLLM is absent)")
    ap.add_argument("--keep", type=Path, help="keep the run folders here")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    vllm = not args.no_vllm and importlib.util.find_spec("vllm") is not None
    ladder, healthy, planted = checks(vllm)
    passes = {cid: 0 for cid in healthy}
    fails = {cid: 0 for cid in planted}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            t0 = time.monotonic()
            by_id = run_seed(seed, ladder, work)
            print(f"seed {seed} ({time.monotonic() - t0:.0f} s)")
            for cid in healthy + planted:
                c = by_id.get(cid)
                print(f"  {cid:<28} {figures(c)}")
                if c is not None and cid in passes and c["status"] == "pass":
                    passes[cid] += 1
                if c is not None and cid in fails and c["status"] == "fail":
                    fails[cid] += 1
    print("healthy passes: " + ", ".join(f"{cid} {n}/{len(seeds)}" for cid, n in passes.items()))
    print("planted fails:  " + ", ".join(f"{cid} {n}/{len(seeds)}" for cid, n in fails.items()))
    ok = all(n == len(seeds) for n in passes.values()) and all(n == len(seeds) for n in fails.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
