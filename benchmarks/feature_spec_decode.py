"""``framework.spec_decode`` over seeds: healthy runs pass, planted defects fail (docs/features.md,
"Speculative decoding").

For each seed, one real ``adaptcheck run --seed S --model embedded:tiny-llama`` of a small ladder:
healthy n-gram and draft-model speculation (in-process vLLM), the same two with a verifier that
accepts every draft token (``tests.steps.frameworks.planted_spec:AcceptAllDrafts``), and an n-gram
drafter that never drafts (``NeverDrafts``); ``--served`` adds n-gram speculation through
``vllm serve``. The seed also picks the embedded model's weights and so is a different model.
Prints one row per seed (each check's status, drafted/accepted/rejected tokens) and the totals
"healthy passes x/N" and "planted fails x/N" per check; exits 1 when a healthy check did not pass or
a planted one did not fail.

    python benchmarks/feature_spec_decode.py                 # seeds 0-4
    python benchmarks/feature_spec_decode.py --seeds 0,1 --served
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

ROOT = Path(__file__).resolve().parent.parent
PLANTED = "tests.steps.frameworks.planted_spec:"

GRADE = """
grade:
  levels:
    - level: L1
      name: step 4 ran
      conditions:
        - id: load
          description: the framework loads
          checks: [load]
"""

HEALTHY = ("ngram", "draft")
PLANTED_IDS = ("accept_all.ngram", "accept_all.draft", "never_drafts")


def ladder(served: bool) -> dict[str, Any]:
    def check(id_: str, framework: str, **params: Any) -> dict[str, Any]:
        return {"id": id_, "step": 4, "kind": "framework.spec_decode",
                "params": {"framework": framework, "compile": False, **params}}

    checks = [
        {"id": "load", "step": 4, "kind": "framework.load", "params": {"framework": "vllm", "compile": False}},
        check("ngram", "vllm"),
        check("draft", "vllm", method="draft_model"),
        check("accept_all.ngram", PLANTED + "AcceptAllDrafts"),
        check("accept_all.draft", PLANTED + "AcceptAllDrafts", method="draft_model"),
        check("never_drafts", PLANTED + "NeverDrafts"),
    ]
    if served:
        checks.append(check("served.ngram", "vllm_serve"))
    return {"schema_version": 1, "id": "feature-spec-decode", "version": "0", "defaults": {"timeout_s": 900},
            "checks": checks}


def run_seed(seed: int, served: bool, work: Path) -> dict[str, dict[str, Any]]:
    path = work / f"ladder-{seed}.yaml"
    path.write_text(yaml.safe_dump(ladder(served), sort_keys=False) + GRADE)
    out = work / f"run-{seed}"
    subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu",
                    "--model", "embedded:tiny-llama", "--seed", str(seed), "--out", str(out), "--quiet"],
                   cwd=ROOT, capture_output=True, text=True, timeout=3600)
    results = out / "results.json"
    if not results.exists():
        return {}
    return {c["id"]: c for c in json.loads(results.read_text())["checks"]}


def cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return "missing"
    m = check.get("metrics") or {}
    if "drafted_tokens" not in m:
        return check["status"]
    return (f"{check['status']} {m['drafted_tokens']:.0f}/{m['accepted_tokens']:.0f}/"
            f"{m.get('rejected_tokens', 0):.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated run seeds.")
    ap.add_argument("--served", action="store_true", help="Also n-gram speculation through vllm serve.")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run folders here.")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    healthy = (*HEALTHY, "served.ngram") if args.served else HEALTHY
    work = args.keep or Path(tempfile.mkdtemp(prefix="feature-spec-"))
    work.mkdir(parents=True, exist_ok=True)
    by_seed = {}
    print("seed  " + "  ".join(f"{c:>24}" for c in (*healthy, *PLANTED_IDS)) + "   (status drafted/accepted/rejected)")
    for seed in seeds:
        by_seed[seed] = run_seed(seed, args.served, work)
        print(f"{seed:>4}  " + "  ".join(f"{cell(by_seed[seed].get(c)):>24}" for c in (*healthy, *PLANTED_IDS)),
              flush=True)
    ok = True
    n = len(seeds)
    for c in healthy:
        passes = sum(by_seed[s].get(c, {}).get("status") == "pass" for s in seeds)
        ok &= passes == n
        print(f"healthy passes {c}: {passes}/{n}")
    for c in PLANTED_IDS:
        fails = sum(by_seed[s].get(c, {}).get("status") == "fail" for s in seeds)
        ok &= fails == n
        print(f"planted fails {c}: {fails}/{n}")
    print(f"run folders: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
