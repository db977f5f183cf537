"""The CPU float64 reference streamed a layer at a time against the same reference in memory
(docs/reference-at-scale.md): peak RSS, wall time, and what one layer costs.

Each side runs in a child process of its own (so its peak RSS is its own, ``ru_maxrss``): load the
model, score one sequence teacher-forced (one forward pass), then generate greedily; the streamed
side under ``--budget`` (``--reference-memory``), the other uncapped. Prints per side: peak RSS
and the RSS after imports, load / forward / per-token seconds, and the weights' throughput of a
decode step (what ``reference_plan.REFERENCE_BYTES_PER_S`` stands for); for the streamed side the
per-layer cost (checkpoint bytes read and bytes converted per load, seconds per load, seconds per
layer forward) and the peak weight bytes held; and the largest relative difference between the
two sides' teacher-forced logprobs and top-K (0 expected: the streamed numbers are the in-memory
numbers bit for bit). Exits 1 when that difference is over 1e-9 or the held bytes exceed the budget.

    python benchmarks/streamed_reference.py                          # SmolLM2-135M, 400M budget
    python benchmarks/streamed_reference.py --model embedded:tiny-llama --budget 12M --tokens 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAX_REL = 1e-9


def _size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if text[-1:].upper() in "KMG" else text) * mult)


def _rss_mib() -> float:
    """Peak resident set of this process so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(model_name: str, budget: int | None, seq_len: int, tokens: int, out: Path) -> None:
    """One side: load, one teacher-forced forward, ``tokens`` greedy tokens; figures as JSON in ``out``."""
    from adaptcheck.frameworks.base import GenRequest, ScoreRequest
    from adaptcheck.frameworks.modelsrc import resolve_model
    from adaptcheck.steps.frameworks.reference import cpu_transformers
    from adaptcheck.steps.frameworks.reference_plan import reference_plan

    model = resolve_model(model_name, seed=0)
    # torch and transformers imported before the baseline figure: what is left is the model's.
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import adaptcheck.steps.frameworks.streaming  # noqa: F401

    rss_imports = _rss_mib()
    plan = reference_plan(model, budget) if budget is not None else reference_plan(model, 1 << 62)
    start = time.perf_counter()
    fw = cpu_transformers(model, plan.dtype, plan=plan)
    load_s = time.perf_counter() - start
    vocab = int(fw.model.config.get_text_config().vocab_size)
    ids = [(7919 * i + 13) % (vocab - 10) + 5 for i in range(seq_len)]
    start = time.perf_counter()
    scored = fw.score([ScoreRequest(token_ids=ids, start=1, top_k=20)])[0]
    forward_s = time.perf_counter() - start
    streamer = getattr(fw, "streamer", None)
    after_score = dict(vars(streamer.stats)) if streamer else {}
    start = time.perf_counter()
    gen = fw.generate([GenRequest(prompt_ids=ids[:32], max_tokens=tokens, ignore_eos=True)])[0]
    decode_s = time.perf_counter() - start
    figures: dict[str, Any] = {
        "mode": plan.mode, "dtype": plan.dtype, "budget": plan.budget, "held_layers": plan.held_layers,
        "layers": plan.layers, "weights_bytes": plan.weights, "layer_bytes": plan.layer_bytes, "rss_imports_mib": rss_imports, "load_s": load_s,
        "forward_s": forward_s, "decode_s": decode_s, "seq_len": seq_len, "tokens": len(gen.token_ids or []),
        "token_logprobs": scored.token_logprobs, "top": [sorted(r.items()) for r in scored.top_logprobs],
        "generated": gen.token_ids,
    }
    if streamer is not None:
        s, a = streamer.stats, after_score
        figures.update(loads=s.loads, bytes_read=s.bytes_read, bytes_converted=s.bytes_converted, layer_load_s=s.load_s,
                       peak_held=s.peak_bytes, resident_bytes=s.resident_bytes,
                       # The teacher-forced pass (one forward of seq_len tokens) and the generation apart:
                       score_forward_s=a["forward_s"], score_load_s=a["load_s"], score_loads=a["loads"],
                       gen_forward_s=s.forward_s - a["forward_s"], gen_load_s=s.load_s - a["load_s"],
                       gen_loads=s.loads - a["loads"], gen_layer_calls=s.layer_calls - a["layer_calls"])
    fw.shutdown()
    figures["rss_peak_mib"] = _rss_mib()
    out.write_text(json.dumps(figures), encoding="utf-8")


def run_side(model: str, budget: int | None, seq_len: int, tokens: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{'streamed' if budget else 'in_memory'}.json"
    cmd = [sys.executable, __file__, "--child", "--model", model, "--seq-len", str(seq_len), "--tokens", str(tokens),
           "--out", str(out), "--budget", str(budget or 0)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def max_rel_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest |a - b| / max(|a|, tiny) over the scored tokens' logprobs and the top-K rows (same
    tokens required: a different top-K token set counts as infinite)."""
    worst = 0.0
    pairs = list(zip(a["token_logprobs"], b["token_logprobs"], strict=True))
    for ra, rb in zip(a["top"], b["top"], strict=True):
        if [t for t, _ in ra] != [t for t, _ in rb]:
            return float("inf")
        pairs.extend((x, y) for (_, x), (_, y) in zip(ra, rb, strict=True))
    for x, y in pairs:
        worst = max(worst, abs(x - y) / max(abs(x), 1e-300))
    return worst


def report(mem: dict[str, Any], st: dict[str, Any], budget: int) -> list[str]:
    """The printed figures."""
    mib = 1 << 20
    lines = [f"{'side':10} {'mode':10} {'dtype':5} {'peak RSS':>10} {'after imports':>14} {'load s':>7} "
             f"{'forward s':>9} {'s/token':>8} {'GB/s/token':>10}"]
    for name, side in (("in memory", mem), ("streamed", st)):
        per_token = side["decode_s"] / max(1, side["tokens"])
        lines.append(f"{name:10} {side['mode']:10} {side['dtype']:5} {side['rss_peak_mib']:8.0f} M "
                     f"{side['rss_imports_mib']:12.0f} M {side['load_s']:7.2f} {side['forward_s']:9.2f} "
                     f"{per_token:8.3f} {side['weights_bytes'] / per_token / 1e9:10.2f}")
    if st.get("loads"):
        n, layers = st["loads"], st["layers"]
        lines.append(f"streamed: {st['held_layers']} of {layers} layers held; peak weights held "
                     f"{st['peak_held'] / mib:.1f} MiB (resident {st['resident_bytes'] / mib:.1f} MiB) of a "
                     f"{budget / mib:.1f} MiB budget")
        lines.append(f"per layer load: {st['bytes_read'] / n / mib:.2f} MiB read, {st['bytes_converted'] / n / mib:.2f} "
                     f"MiB converted, {1000 * st['layer_load_s'] / n:.1f} ms "
                     f"({st['bytes_converted'] / st['layer_load_s'] / 1e9:.2f} GB/s converted; {n} loads)")
        lines.append(f"per layer forward: teacher-forced {1000 * st['score_forward_s'] / layers:.1f} ms "
                     f"({st['seq_len']} tokens); decode {1000 * st['gen_forward_s'] / max(1, st['gen_layer_calls']):.2f}"
                     f" ms per token (prefill included)")
        lines.append(f"teacher-forced sequence: {st['forward_s']:.2f} s = {st['score_loads']} loads "
                     f"{st['score_load_s']:.2f} s + forwards {st['score_forward_s']:.2f} s; generation "
                     f"{st['decode_s']:.2f} s = {st['gen_loads']} loads {st['gen_load_s']:.2f} s + forwards "
                     f"{st['gen_forward_s']:.2f} s")
    lines.append(f"teacher-forced logprobs and top-K, streamed vs in memory: max relative difference "
                 f"{max_rel_diff(mem, st):.3g} (bound {MAX_REL:g}); greedy tokens "
                 f"{'identical' if mem['generated'] == st['generated'] else 'DIFFER'}")
    return lines


# Published shapes (parameters): per decoder layer (all of its weights, what a load converts), of
# it merged from several tensors on load (fused experts), active per token (what a forward
# multiplies), outside the layers; checkpoint bytes per parameter. DeepSeek-V3 as its bf16 cast
# (its fp8 checkpoint is dequantized by transformers' quantizer, which the streamer does not drive).
SCALE: dict[str, dict[str, Any]] = {
    "7B (Llama-2-7B)": {"layers": [(32, 202.4e6, 0.0, 202.4e6)], "resident": 262.1e6, "stored": 2,
                        "flops_per_token_out": 2 * 4096 * 32000},
    "72B (Qwen2.5-72B)": {"layers": [(80, 877.9e6, 0.0, 877.9e6)], "resident": 2491.4e6, "stored": 2,
                          "flops_per_token_out": 2 * 8192 * 152064},
    "671B (DeepSeek-V3, bf16)": {"layers": [(3, 583e6, 0.0, 583e6), (58, 11.51e9, 11.32e9, 583e6)],
                                 "resident": 1853.2e6, "stored": 2, "flops_per_token_out": 2 * 7168 * 129280},
}


def extrapolate(st: dict[str, Any], mem: dict[str, Any], tokens: int = 256) -> list[str]:
    """The measured per-layer costs carried to larger models, float64, the smallest streaming
    budget (one layer held): the rates are this machine's (conversion GB/s, float64 GFLOP/s of
    a teacher-forced layer forward, GB/s of an in-memory decode)."""
    conv = st["bytes_converted"] / st["layer_load_s"]  # bytes/s converted, disk read included
    layer_params = st["layer_bytes"] / 8  # a SmolLM2 layer's parameters (all its layers are alike)
    flops = 2 * layer_params * st["seq_len"] * st["layers"] / st["score_forward_s"]
    decode = mem["weights_bytes"] * mem["tokens"] / mem["decode_s"]
    out = [f"extrapolation (float64, one layer held; this machine: {conv / 1e9:.2f} GB/s converted, "
           f"{flops / 1e9:.1f} GFLOP/s teacher-forced, {decode / 1e9:.1f} GB/s in-memory decode; "
           f"{tokens}-token sequences):",
           f"  {'model':26} {'held GiB':>9} {'disk GB/fwd':>11} {'load s/fwd':>10} {'s/sequence':>10} "
           f"{'s/token':>8} {'in memory GB':>12}"]
    for name, m in SCALE.items():
        layers = [(n, p, merged, active) for n, p, merged, active in m["layers"]]
        biggest = max(layers, key=lambda x: x[1])
        held = 8 * m["resident"] + 8 * biggest[1] + m["stored"] * biggest[1] + 8 * biggest[2]
        disk = sum(n * p * m["stored"] for n, p, _, _ in layers)
        load_s = sum(n * 8 * p for n, p, _, _ in layers) / conv
        compute = (sum(n * 2 * a for n, _, _, a in layers) + m["flops_per_token_out"]) * tokens / flops
        per_token = load_s + (sum(n * 2 * a for n, _, _, a in layers) + m["flops_per_token_out"]) / flops
        total = 8 * (m["resident"] + sum(n * p for n, p, _, _ in layers))
        out.append(f"  {name:26} {held / 2**30:9.1f} {disk / 1e9:11.0f} {load_s:10.0f} {load_s + compute:10.0f} "
                   f"{per_token:8.0f} {total / 1e9:12.0f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pretrained:smollm2-135m")
    ap.add_argument("--budget", default="400M", help="--reference-memory of the streamed side (K/M/G suffix)")
    ap.add_argument("--seq-len", type=int, default=128, help="tokens of the teacher-forced sequence")
    ap.add_argument("--tokens", type=int, default=8, help="greedy tokens generated")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    budget = _size(str(args.budget)) if args.budget else None
    if args.child:  # --budget 0: the uncapped side
        child(args.model, budget or None, args.seq_len, args.tokens, args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        mem = run_side(args.model, None, args.seq_len, args.tokens, Path(tmp))
        st = run_side(args.model, budget, args.seq_len, args.tokens, Path(tmp))
    print(f"{args.model}: {args.seq_len}-token teacher-forced sequence, {args.tokens} greedy tokens")
    print("\n".join(report(mem, st, budget or 0)))
    if st.get("loads"):
        print("\n".join(extrapolate(st, mem)))
    bad = max_rel_diff(mem, st) > MAX_REL or mem["generated"] != st["generated"]
    bad = bad or (st["mode"] == "streamed" and st["peak_held"] > (budget or 0))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
