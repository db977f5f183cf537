"""Healthy-pass / planted-fail counts of step 3's attention through vLLM's selected backend over
seeds: the healthy backend, its impl's forward reading the wrong block, its cache write using
twice k_scale (docs/features.md, "Attention through the platform's backend (step 3)").

Run: PYTHONPATH=. python benchmarks/attention_backend_seeds.py [--seeds 5]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers import vllm_attention as va
from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

CASES: dict[str, list[Mapping[str, object]]] = {
    "paged_attention": [{"name": "gqa_bs32", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2,
                         "head_size": 64, "block_size": 32}],
    "paged_attention_fp8": [{"name": "e4m3", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2,
                             "head_size": 64},
                            {"name": "e5m2", "batch": 2, "max_seq_len": 90, "num_q_heads": 4, "num_kv_heads": 2,
                             "head_size": 128, "kv_cache_dtype": "fp8_e5m2"}],
    "reshape_and_cache_fp8": [{"name": "e4m3", "num_tokens": 24, "num_kv_heads": 2, "head_size": 64,
                               "num_blocks": 8}],
}


def _passes(op: str, seed: int) -> bool:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, provider="vllm", dtypes=["fp32", "bf16"], cases=list(CASES[op]))
    return all(o.status is Status.PASS for o in OpCheck(VllmProvider()).run(ctx, params))


@contextmanager
def _patched(name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    cls = type(va.backend_for(torch.float32, 8, 2, 64, 32, 2).layer.impl)
    original = getattr(cls, name)
    setattr(cls, name, wrap(original))
    try:
        yield
    finally:
        setattr(cls, name, original)


def _wrong_block(original: Any) -> Any:
    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, md: Any, output: Any,
                *args: Any, **kwargs: Any) -> Any:
        md.block_table = md.block_table.roll(1, dims=1)
        return original(self, layer, query, key, value, kv_cache, md, output, *args, **kwargs)
    return forward


def _wrong_scale(original: Any) -> Any:
    def update(self: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> Any:
        kept = layer._k_scale_float
        layer._k_scale_float = kept * 2
        try:
            return original(self, layer, key, value, kv_cache, slot_mapping)
        finally:
            layer._k_scale_float = kept
    return update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    n = parser.parse_args().seeds
    for op in CASES:
        print(f"healthy {op}: passes {sum(_passes(op, s) for s in range(n))}/{n}")
    for what, method, wrap, ops in (("forward reads the wrong block", "forward", _wrong_block,
                                     ("paged_attention", "paged_attention_fp8")),
                                    ("fp8 cache written with 2x k_scale", "do_kv_cache_update", _wrong_scale,
                                     ("reshape_and_cache_fp8", "paged_attention_fp8"))):
        with _patched(method, wrap):
            for op in ops:
                print(f"planted '{what}' {op}: fails {sum(not _passes(op, s) for s in range(n))}/{n}")
    print(f"backend: {va.selected_backend(torch.bfloat16)}")


if __name__ == "__main__":
    main()
