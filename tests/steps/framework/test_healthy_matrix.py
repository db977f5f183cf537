"""Zero false failures on healthy kernels: 5 seeds x dtypes x every framework installed here.

Runs ``benchmarks/step4_false_failures.py``'s matrix through the real CLI (one ``adaptcheck
run --seed S`` per seed; the seed also draws the embedded model's weights, so each seed is
a different model). transformers covers fp32, bf16 and fp16; vLLM (in process and served)
covers the same three dtypes (its CPU build serves fp16 here too). The full matrix over all three
embedded models is the benchmark's default run, quoted in docs/step4-numerics.md; this test
keeps one model per framework so the suite stays within CI's budget.

vLLM costs ~60 s per seed and dtype (loaded in process and started as a server), so its five
seeds are spread over the three dtypes (bf16: 0 and 3, fp32: 1 and 4, fp16: 2): five different
models, every dtype, in a third of the time of 5 × 3 (~310 s instead of ~920 s on 2 cores).
transformers, cheap, keeps 5 seeds × 3 dtypes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks import load_script

pytestmark = pytest.mark.slow  # ~430 s of the full suite on 2 cores: outside the fast lane (-m "not slow")

SEEDS = (0, 1, 2, 3, 4)
VLLM_SEEDS = {"bf16": (0, 3), "fp32": (1, 4), "fp16": (2,)}


def _load() -> ModuleType:
    return load_script("step4_false_failures")


def _matrix(tmp_path: Path, frameworks: list[str], dtypes: list[str], models: list[str], kinds: list[str],
            seeds: tuple[int, ...] = SEEDS) -> str:
    bench = _load()
    text = bench.ladder(frameworks, dtypes, models, kinds)
    per_seed = {s: bench.run_seed(s, text, tmp_path / f"seed{s}") for s in seeds}
    cells = bench.tabulate(per_seed)
    table = bench.render(cells)
    assert set(cells) == {(fw, d) for fw in frameworks for d in dtypes}, table  # every cell ran
    for (fw, dtype), cell in cells.items():
        assert cell.checks == len(seeds) * len(models) * len(kinds), (fw, dtype, table)
        assert not cell.failed, table
        assert cell.passed == cell.checks, table  # a skip here would be a check that could not run
        assert 0 < cell.worst_ratio < 1, table  # figures were really judged, and held
    return str(table)


def test_transformers_has_no_false_failures(tmp_path: Path) -> None:
    print(_matrix(tmp_path, ["transformers"], ["fp32", "bf16", "fp16"], ["tiny-qwen2-d80"], ["reference", "concurrent"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
@pytest.mark.parametrize("dtype", ["bf16", "fp32", "fp16"])  # one test per dtype: each stays within the per-test limit
def test_vllm_in_process_and_served_have_no_false_failures(tmp_path: Path, dtype: str) -> None:
    print(_matrix(tmp_path, ["vllm", "vllm_serve"], [dtype], ["tiny-llama"], ["reference", "concurrent"],
                  seeds=VLLM_SEEDS[dtype]))


def test_vllm_seeds_cover_every_seed_once() -> None:
    spread = sorted(s for seeds in VLLM_SEEDS.values() for s in seeds)
    assert spread == list(SEEDS)
