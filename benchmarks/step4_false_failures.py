"""Step 4's false-failure rate on healthy kernels: seeds x dtypes x frameworks x models.

For each seed, one real ``adaptcheck run --seed S`` of a generated ladder with
``framework.reference``, ``framework.concurrent`` and ``framework.kv_cache`` for every
(framework, dtype, embedded model) asked for. The run seed also picks the embedded model's
random weights, so every seed is a different model. Nothing is planted: every check that
does not pass is a false failure of the method (or a real defect of this machine's
kernels — the table says which check, so it can be looked at).

Printed per (framework, dtype): checks run, passes, not-applicable skips, false failures,
and the worst ratio of a teacher-forced figure to its bound (``kl_mean``/``kl_p99`` of the
reference check, ``kl_mean``/``kl_max`` of the same-framework rows) — how much headroom the
bounds of ``matrices/tolerances.yaml`` leave on a healthy machine. Exit 1 when any check
failed or errored.

    python benchmarks/step4_false_failures.py                       # transformers, 5 seeds, 3 dtypes
    python benchmarks/step4_false_failures.py --frameworks transformers,vllm,vllm_serve --dtypes bf16,fp32
    python benchmarks/step4_false_failures.py --models auto --sizes quick    # the real default model, quick sizes

``--sizes quick`` gives every check the sizes the quick ladder gives its transformers check of
that kind (teacher prompts, batch, rounds …): the false-failure rate of the ladder a user runs
by default; the default, ``defaults``, is the params models' own defaults (the standard ladder).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adaptcheck.base.procs import child_environ
from adaptcheck.ladder.loader import load_ladder

KINDS = ("reference", "concurrent", "kv_cache")
REPO = Path(__file__).resolve().parents[1]
GRADE = """
grade:
  levels:
    - level: L1
      name: healthy step 4
      conditions:
        - id: every-check
          description: every step-4 check of the matrix passes
          steps: [4]
"""


@dataclass
class Cell:
    """What one (framework, dtype) column collected over seeds and models."""

    checks: int = 0
    passed: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    worst_ratio: float = 0.0
    worst_what: str = ""


def model_spec(model: str) -> tuple[str, str]:
    """(label for check ids, model name for the ladder): a bare name is an embedded model
    (``tiny-llama``); ``pretrained:NAME``, ``auto`` or a folder path are used as given."""
    if ":" in model or "/" in model or model == "auto":
        label = re.sub(r"[^A-Za-z0-9_-]+", "-", model.rstrip("/").rsplit("/", 1)[-1].split(":")[-1]).strip("-")
        return label or "model", model
    return model, f"embedded:{model}"


def ladder_sizes(name: str) -> dict[str, dict[str, Any]]:
    """The step-4 sizes a shipped ladder gives its transformers checks of the ladder's model, by kind
    (``framework.reference`` → its params without ``framework``); checks naming a model of their own
    (a family's embedded model) have sizes of their own."""
    spec = load_ladder(name).spec  # resolved: quick extends standard
    return {c.kind: {k: v for k, v in c.params.items() if k != "framework"}
            for c in spec.checks if c.step == 4 and c.params.get("framework") == "transformers"
            and not c.params.get("model")}


def ladder(frameworks: Iterable[str], dtypes: Iterable[str], models: Iterable[str], kinds: Iterable[str],
           sizes: dict[str, dict[str, Any]] | None = None) -> str:
    specs = [model_spec(m) for m in models]
    checks = [{"id": f"{fw}.{label}.{d}.{k}", "step": 4, "kind": f"framework.{k}", "timeout_s": 900,
               "params": {**copy.deepcopy((sizes or {}).get(f"framework.{k}", {})), "framework": fw, "dtype": d, "model": name,
                          **({"compile": False} if fw.startswith("vllm") else {})}}
              for fw in frameworks for label, name in specs for d in dtypes for k in kinds]
    # Each check its own copy of the sizes: a shared dict would be dumped as a YAML alias, which
    # the ladder loader refuses (data files write their values out).
    return yaml.safe_dump({"schema_version": 1, "id": "false-failures", "version": "1",
                           "defaults": {"timeout_s": 900}, "checks": checks}, sort_keys=False) + GRADE


def run_seed(seed: int, ladder_text: str, out: Path) -> list[dict[str, Any]]:
    """One ``adaptcheck run`` of the matrix ladder; its checks from results.json."""
    path = out.parent / f"ladder-{seed}.yaml"
    path.write_text(ladder_text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(path), "--device", "cpu",
                           "--out", str(out), "--seed", str(seed), "--quiet"], capture_output=True, text=True, check=False,
                          env=child_environ())  # not what an in-process engine of the caller set (under pytest)
    results = out / "results.json"
    if not results.exists():
        raise RuntimeError(f"seed {seed}: adaptcheck run wrote no results.json in {out}: {proc.stderr[-1500:]}")
    return list(json.loads(results.read_text())["checks"])


def ratios(check: dict[str, Any]) -> list[tuple[str, float]]:
    """(what, value / bound) for every teacher-forced bound the check recorded."""
    out: list[tuple[str, float]] = []
    details = check.get("details", {})
    for where, bounds in (("reference", (details.get("teacher_forced") or {}).get("bounds")),
                          ("same-framework", (details.get("distribution") or {}).get("bounds")),
                          ("batched-vs-alone", ((details.get("distribution") or {}).get("vs_reference") or {}).get("bounds"))):
        for stat, b in (bounds or {}).items():
            if b.get("bound"):
                out.append((f"{where} {stat}", float(b["value"]) / float(b["bound"])))
    return out


def tabulate(per_seed: dict[int, list[dict[str, Any]]]) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = defaultdict(Cell)
    for seed, checks in per_seed.items():
        for c in checks:
            fw, _model, dtype, _kind = c["id"].split(".")
            cell = cells[(fw, dtype)]
            cell.checks += 1
            if c["status"] == "pass":
                cell.passed += 1
            elif c["status"] == "skip":
                cell.skipped += 1
            else:
                cell.failed.append(f"seed {seed} {c['id']}: {c['status']}: {c['message'][:160]}")
            for what, r in ratios(c):
                if r > cell.worst_ratio:
                    cell.worst_ratio, cell.worst_what = r, f"{what} (seed {seed}, {c['id']})"
    return cells


def render(cells: dict[tuple[str, str], Cell]) -> str:
    lines = [f"{'framework':<12} {'dtype':<5} {'checks':>6} {'pass':>5} {'skip':>5} {'false fail':>10}  worst figure/bound",
             "-" * 96]
    for (fw, dtype), c in sorted(cells.items()):
        lines.append(f"{fw:<12} {dtype:<5} {c.checks:>6} {c.passed:>5} {c.skipped:>5} {len(c.failed):>10}  "
                     f"{c.worst_ratio:.2f}  {c.worst_what}")
    for c in cells.values():
        lines.extend(f"  FAILED {f}" for f in c.failed)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated run seeds (each a different model)")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--frameworks", default="transformers")
    ap.add_argument("--models", default="tiny-llama,tiny-qwen2-d80,tiny-moe")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--sizes", choices=["defaults", "quick", "standard"], default="defaults",
                    help="check sizes: the params models' defaults, or those a shipped ladder gives its transformers checks")
    ap.add_argument("--out", type=Path, default=None, help="keep the run folders here (default: a temporary folder)")
    args = ap.parse_args(argv)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    sizes = None if args.sizes == "defaults" else ladder_sizes(args.sizes)
    text = ladder(split(args.frameworks), split(args.dtypes), split(args.models), split(args.kinds), sizes)
    with tempfile.TemporaryDirectory(prefix="adaptcheck-ff-") as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        per_seed = {}
        for seed in (int(s) for s in split(args.seeds)):
            per_seed[seed] = run_seed(seed, text, root / f"seed{seed}")
            print(f"seed {seed}: {sum(c['status'] == 'pass' for c in per_seed[seed])}/{len(per_seed[seed])} passed",
                  file=sys.stderr, flush=True)
        cells = tabulate(per_seed)
    print(render(cells))
    return 1 if any(c.failed for c in cells.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
