"""The vision family of step 3 (encoder_attention, patch_embed, mrope, vision_rope_2d) on the standard
ladder's cases: per seed, the worst error of the torch and vllm providers as a fraction of the
tolerance (and the largest normalized error), then every planted defect of
tests/steps/ops/vision_defects.py with its smallest figure over the dtypes (caught when the check
fails in every dtype). Exits 1 when a healthy provider fails a seed or a defect passes one.

Run: PYTHONPATH=. python benchmarks/family_vision_ops.py [--seeds 5] [--providers torch,vllm]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from adaptcheck.steps.ops.providers.registry import load_provider

ROOT = Path(__file__).resolve().parents[1]
OPS = ("encoder_attention", "patch_embed", "mrope", "vision_rope_2d")
DTYPES = ["fp32", "bf16", "fp16"]


def ladder_cases() -> dict[str, list[Mapping[str, object]]]:
    """The cases of each op's ``ops.<op>`` entry in ladders/standard.yaml."""
    checks = yaml.safe_load((ROOT / "ladders" / "standard.yaml").read_text(encoding="utf-8"))["checks"]
    return {c["params"]["op"]: list(c["params"]["cases"]) for c in checks if c.get("id") in {f"ops.{o}" for o in OPS}}


def _defects() -> list[tuple[str, str, Callable[..., Any], bool]]:
    """(what, op, fn, needs vLLM) for every planted defect."""
    sys.path.insert(0, str(ROOT))
    from tests.steps.ops import vision_defects as d

    return [("attention causal", "encoder_attention", d.attention_causal, False),
            ("cu_seqlens ignored", "encoder_attention", d.attention_across_images, False),
            ("patch rows (T, C) not (C, T)", "patch_embed", d.patch_frame_major, False),
            ("M-RoPE h/w sections swapped", "mrope", d.mrope_hw_swapped, False),
            ("M-RoPE temporal only (1-D)", "mrope", d.mrope_temporal_only, False),
            ("M-RoPE interleave ignored", "mrope", d.mrope_chunked_always, False),
            ("ViT RoPE row/col swapped", "vision_rope_2d", d.vision_rope_hw_swapped, False),
            ("vLLM attn: one segment", "encoder_attention", d.vllm_attention_across_images, True),
            ("vLLM patch: (T, C) rows", "patch_embed", d.vllm_patch_frame_major, True),
            ("vLLM M-RoPE: text positions", "mrope", d.vllm_mrope_text_positions, True),
            ("vLLM M-RoPE: h/w rows swapped", "mrope", d.vllm_mrope_hw_swapped, True)]


def run(provider: OpProvider, op: str, cases: list[Mapping[str, object]], seed: int) -> list[Outcome]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, provider=provider.name, dtypes=DTYPES, cases=cases, budget_s=600)
    return OpCheck(provider).run(ctx, params)


def figures(outcome: Outcome) -> tuple[float, float]:
    """(worst ratio to the tolerance, largest normalized error) over the outcome's cases and outputs."""
    cases = outcome.details.get("cases", [])
    ratio = max((c["ratio"] for c in cases), default=float("nan"))
    norm = max((o["normalized"] or 0.0 for c in cases for o in c.get("outputs", [])), default=float("nan"))
    return ratio, norm


def healthy(providers: list[str], seeds: int, cases: dict[str, list[Mapping[str, object]]]) -> bool:
    ok = True
    print(f"{'op':<18} {'provider':<6} {'dtype':<5} " + " ".join(f"seed{s:<3}" for s in range(seeds))
          + "  max normalized  wall/seed")
    for op in OPS:
        for name in providers:
            provider = load_provider(name)
            per_dtype: dict[str, list[tuple[Status, float, float]]] = {dt: [] for dt in DTYPES}
            t0 = time.perf_counter()
            for seed in range(seeds):
                for o in run(provider, op, cases[op], seed):
                    per_dtype[str(o.subid)].append((o.status, *figures(o)))
            wall = (time.perf_counter() - t0) / seeds
            for dt, rows in per_dtype.items():
                cells = " ".join(f"{r:7.3f}" if s is Status.PASS else f"{s.value.upper():>7}" for s, r, _ in rows)
                ok &= all(s is Status.PASS for s, _, _ in rows)
                print(f"{op:<18} {name:<6} {dt:<5} {cells}  {max(n for _, _, n in rows):14.3e}  {wall:8.1f}s")
    return ok


def planted(seeds: int, cases: dict[str, list[Mapping[str, object]]], with_vllm: bool) -> bool:
    ok = True
    print("\nplanted defects: smallest error/tolerance over fp32, bf16, fp16 per seed (caught: > 1 in every dtype)")
    for what, op, fn, needs_vllm in _defects():
        if needs_vllm and not with_vllm:
            print(f"{what:<30} (left out: no vllm provider in this run)")
            continue
        cells, caught = [], True
        for seed in range(seeds):
            outcomes = run(DictProvider("planted", {op: fn}), op, cases[op], seed)
            caught &= all(o.status is Status.FAIL for o in outcomes)
            cells.append(min(figures(o)[0] for o in outcomes))
        ok &= caught
        print(f"{what:<30} " + " ".join(f"{c:9.3g}" for c in cells) + ("  caught" if caught else "  MISSED"))
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--providers", default="torch,vllm")
    args = ap.parse_args(argv)
    providers = [p for p in args.providers.split(",") if p]
    with_vllm = importlib.util.find_spec("vllm") is not None
    if not with_vllm and "vllm" in providers:
        print("vLLM is not installed: the vllm provider and the vLLM defects are left out")
        providers.remove("vllm")
    cases = ladder_cases()
    t0 = time.perf_counter()
    ok = healthy(providers, args.seeds, cases)
    ok &= planted(args.seeds, cases, with_vllm and "vllm" in args.providers)
    print(f"\n{'all healthy seeds pass and every defect is caught' if ok else 'FAILED'} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
