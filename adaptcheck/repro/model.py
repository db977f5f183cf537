"""The step-4 reproducer: a model's teacher-forced distributions on the device vs float64.

:func:`write_model_repro` writes ``repro/<check id>.py``, a script that needs torch,
transformers and the model folder (plus vLLM for the vLLM frameworks), never adaptcheck: it
scores the check's sequences on the reference and on the device as the check did and exits 1
when the KL mean or p99 is over its bound. What it does, step by step: docs/step4-numerics.md
("Reproducers"). Everything from the run (sequences, bounds, URL) is embedded as JSON text,
never as code.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypedDict

from adaptcheck import __version__
from adaptcheck.base import klestimate
from adaptcheck.base.dtypes import FLOAT_DTYPES, framework_dtype
from adaptcheck.repro.files import write_script

DTYPES = FLOAT_DTYPES
"""What the device side may run in; the reference also fp64."""


class ReproSequence(TypedDict):
    """One token sequence the script scores teacher-forced (embedded in it as JSON)."""

    token_ids: list[int]
    start: int


@dataclass
class ModelReproSpec:
    """What a step-4 reproducer needs (the contract of issue 13)."""

    framework: str
    """"transformers" | "vllm" | "vllm_serve" | "endpoint" | another served framework."""
    model_path: str
    dtype: str
    """"fp32" | "fp16" | "bf16"."""
    device: str
    """torch device string of the device side ("cpu", "cuda:0" …)."""
    attn_implementation: str | None
    sequences: list[ReproSequence]
    """Positions start .. len-1 of each are scored."""
    top_k: int
    bound_kl_mean: float
    bound_kl_p99: float
    observed_kl_mean: float
    observed_kl_p99: float
    endpoint_url: str | None = None
    """Already redacted by the caller."""
    served_model: str | None = None
    reference_top_k: int = 64
    """Alternatives kept per position on the reference side: the estimator's buckets are the
    device's top-K *within these* (``model_numerics.reference_top_k`` of
    matrices/tolerances.yaml; pass it so the script's figure is the check's)."""
    reference_dtype: str = "fp64"
    """The reference's dtype ("fp32" where the check had to fall back from float64)."""
    reference_attn_implementation: str | None = "sdpa"

    def validate(self) -> None:
        """Raise ValueError for a spec no script could run."""
        if self.dtype not in DTYPES or self.reference_dtype not in (*DTYPES, "fp64"):
            raise ValueError(f"dtype {self.dtype!r} / reference dtype {self.reference_dtype!r}: not one of"
                             f" {', '.join(DTYPES)} (and fp64 for the reference)")
        if not self.sequences:
            raise ValueError("no sequences to score")
        for i, seq in enumerate(self.sequences):
            ids, start = seq.get("token_ids"), seq.get("start")
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise ValueError(f"sequence {i}: token_ids must be a list of ints")
            if not isinstance(start, int) or not 1 <= start < len(ids):
                raise ValueError(f"sequence {i}: start must be 1..len-1, not {start!r}")
        if self.top_k < 1 or self.reference_top_k < 1:
            raise ValueError(f"top_k and reference_top_k must be at least 1, not {self.top_k}, {self.reference_top_k}")


_SCRIPT = r'''
import argparse
import json
import math
import os
import sys
import urllib.request

SPEC = json.loads(__SPEC__)
TORCH_DTYPES = __TORCH_DTYPES__


def transformers_scores(dtype, device, attn_implementation, top_k):
    """Per sequence, per scored position: (logprob of the given token, {token id: logprob} of
    the top-K plus the given token). Each sequence alone, one forward pass, as the check does."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": getattr(torch, TORCH_DTYPES[dtype])}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(SPEC["model_path"], **kwargs).to(device).eval()
    out = []
    for s in SPEC["sequences"]:
        ids = torch.tensor([list(s["token_ids"])], dtype=torch.long)
        mask = torch.ones_like(ids)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           position_ids=positions.to(device)).logits
        # The logits at position i predict token i + 1.
        lp = torch.log_softmax(logits[0, s["start"] - 1: ids.shape[1] - 1].double().cpu(), dim=-1)
        tokens = s["token_ids"][s["start"]:]
        vals, idx = lp.topk(min(top_k, lp.shape[-1]), dim=-1)
        chosen = lp.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None])[:, 0].tolist()
        rows = []
        for pos, tok in enumerate(tokens):
            top = {int(i): float(v) for i, v in zip(idx[pos].tolist(), vals[pos].tolist())}
            top.setdefault(int(tok), float(chosen[pos]))
            rows.append((float(chosen[pos]), top))
        out.append(rows)
    return out


def _from_prompt_logprobs(seq, entries, field):
    ids = seq["token_ids"]
    if entries is None or len(entries) != len(ids):
        raise SystemExit(f"no prompt logprobs for a {len(ids)}-token sequence (got {entries!r:.80})")
    rows = []
    for pos in range(seq["start"], len(ids)):
        top = {int(t): float(field(v)) for t, v in (entries[pos] or {}).items()}
        if ids[pos] not in top:
            raise SystemExit(f"prompt logprobs at position {pos} lack the prompt's own token {ids[pos]}")
        rows.append((top[ids[pos]], top))
    return rows


def vllm_scores(dtype, device):
    """vLLM offline: SamplingParams(max_tokens=1, prompt_logprobs=K)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=SPEC["model_path"], dtype=TORCH_DTYPES[dtype], seed=0, max_logprobs=max(20, SPEC["top_k"]),
              max_model_len=max(len(s["token_ids"]) for s in SPEC["sequences"]) + 16)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=SPEC["top_k"], seed=0)
    out = []
    for s in SPEC["sequences"]:  # each alone, as the check scores them
        (o,) = llm.generate([{"prompt_token_ids": list(s["token_ids"])}], params, use_tqdm=False)
        out.append(_from_prompt_logprobs(s, o.prompt_logprobs, lambda v: v.logprob))
    return out


def endpoint_scores(url):
    """An OpenAI-compatible server: /v1/completions with prompt_logprobs (vLLM's extension)."""
    base = url.rstrip("/")
    if not base.endswith("/completions"):
        base = base + ("/completions" if base.endswith("/v1") else "/v1/completions")
    out = []
    for seq in SPEC["sequences"]:
        body = {"model": SPEC["served_model"], "prompt": list(seq["token_ids"]), "max_tokens": 1,
                "temperature": 0, "prompt_logprobs": SPEC["top_k"]}
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = "Bearer " + os.environ["OPENAI_API_KEY"]
        req = urllib.request.Request(base, data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=600) as resp:
            answer = json.loads(resp.read().decode())
        entries = answer["choices"][0].get("prompt_logprobs")
        out.append(_from_prompt_logprobs(seq, entries, lambda v: v["logprob"] if isinstance(v, dict) else v))
    return out


__ESTIMATOR__


def statistics(reference, device):
    kls, dlps, same = [], [], []
    for ref_rows, dev_rows in zip(reference, device):
        if len(ref_rows) != len(dev_rows):
            raise SystemExit(f"{len(ref_rows)} reference positions vs {len(dev_rows)} scored")
        for (rl, rt), (dl, dt) in zip(ref_rows, dev_rows):
            kls.append(position_kl(rt, dt))
            dlps.append(abs(rl - dl))
            same.append(max(rt, key=rt.__getitem__) == max(dt, key=dt.__getitem__))
    n = len(kls)
    return {"positions": n, "kl_mean": sum(kls) / n if n else 0.0, "kl_p99": quantile(kls, 0.99),
            "kl_max": max(kls, default=0.0), "dlogprob_max": max(dlps, default=0.0),
            "same_top_rate": sum(same) / n if n else 1.0}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Reproduce a step-4 teacher-forced comparison.")
    parser.add_argument("--device", default=SPEC["device"], help="torch device of the device side (transformers)")
    parser.add_argument("--url", default=SPEC.get("endpoint_url"), help="endpoint base URL (served frameworks)")
    args = parser.parse_args(argv)
    fw = SPEC["framework"]
    print(f"{SPEC['check_id']}: {fw} {SPEC['dtype']} on {args.device} vs transformers {SPEC['reference_dtype']} on cpu"
          f" ({SPEC['reference_attn_implementation']}), model {SPEC['model_path']}, {len(SPEC['sequences'])} sequences,"
          f" device top-{SPEC['top_k']} within reference top-{SPEC['reference_top_k']}")
    reference = transformers_scores(SPEC["reference_dtype"], "cpu", SPEC["reference_attn_implementation"],
                                    SPEC["reference_top_k"])
    if fw == "transformers":
        device = transformers_scores(SPEC["dtype"], args.device, SPEC.get("attn_implementation"), SPEC["top_k"])
    elif fw in ("vllm", "vllm_serve"):
        device = vllm_scores(SPEC["dtype"], args.device)
    else:
        if not args.url:
            raise SystemExit("no endpoint URL recorded (it was redacted?): pass --url")
        device = endpoint_scores(args.url)
    s = statistics(reference, device)
    over = [name for name, bound in (("kl_mean", SPEC["bound_kl_mean"]), ("kl_p99", SPEC["bound_kl_p99"]))
            if not s[name] <= bound]
    print(f"KL(ref||device) mean={s['kl_mean']!r} p99={s['kl_p99']!r} max={s['kl_max']!r} over {s['positions']} positions;"
          f" bound mean<={SPEC['bound_kl_mean']!r} p99<={SPEC['bound_kl_p99']!r};"
          f" |dlogprob| max={s['dlogprob_max']!r} same-top {s['same_top_rate']:.3f};"
          f" check measured mean={SPEC['observed_kl_mean']!r} p99={SPEC['observed_kl_p99']!r}")
    print(("FAIL: " + ", ".join(over) + " over the bound") if over else "PASS: within the bounds")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def render_model_script(check_id: str, spec: ModelReproSpec) -> str:
    """The script's text (see the module docstring)."""
    spec.validate()
    data = {**asdict(spec), "check_id": check_id}
    needs = "torch, transformers" + (", vllm" if spec.framework in ("vllm", "vllm_serve") else "")
    header = (
        f'"""Reproducer for adaptcheck check {check_id}: {spec.framework} {spec.dtype} on {spec.device}'
        f" vs transformers fp64 on cpu, teacher-forced.\n\n"
        f"Written by adaptcheck {__version__} on {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}."
        f" Standalone: needs {needs} and the model folder\n{spec.model_path}\n(not adaptcheck).\n\n"
        f"    python {check_id}.py [--device DEVICE] [--url URL]\n\n"
        "Prints KL(reference || device) mean / p99 / max over every scored position and the bounds;\n"
        f"exit 1 when over a bound. The check measured KL mean {spec.observed_kl_mean!r}, p99 {spec.observed_kl_p99!r}.\n"
        '"""\n'
    )
    # JSON inside a Python string literal: values from the run can never become code.
    # The estimator's own source (adaptcheck.base.klestimate): the script computes what the check did.
    estimator = "\n\n".join(inspect.getsource(f).rstrip() for f in (klestimate.position_kl, klestimate.quantile))
    # The script cannot import adaptcheck: it gets adaptcheck's one dtype map as a literal.
    torch_dtypes = repr({name: framework_dtype(name) for name in (*DTYPES, "fp64")})
    # The run's values go in last, so a placeholder spelled inside them (a model path) stays text.
    script = _SCRIPT.replace("__TORCH_DTYPES__", torch_dtypes, 1).replace("__ESTIMATOR__", estimator, 1)
    return header + script.replace("__SPEC__", repr(json.dumps(data)), 1)


def write_model_repro(run_dir: Path, check_id: str, spec: ModelReproSpec) -> Path:
    """Write ``repro/<check id>.py`` for a step-4 comparison into ``run_dir``; its path."""
    return write_script(Path(run_dir), check_id, render_model_script(check_id, spec))
