"""The step-3 reproducer: one operator, one dtype, the cases of one check, as a standalone
script — :class:`OpsReproSpec` made text, the check's own code inlined by
:mod:`adaptcheck.repro.bundle` (what it carries and prints: docs/ops.md, "Reproducers").
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict

from adaptcheck.repro.bundle import Bundle
from adaptcheck.repro.files import write_script

OutputTolerance = TypedDict("OutputTolerance", {"class": str, "mode": str, "limits": dict[str, float],
                                                 "max_code_distance": int | None})
"""One output's tolerance class as the script reads it (JSON in the script's ``OUTPUTS``)."""


@dataclass
class OpsReproCase:
    """One case as the check ran it (after any shrink)."""

    name: str
    params: dict[str, object]
    """What the generator reads of the case (fields, ``name`` included, and computed
    properties): the op's own values, which the script hands it as a namespace;
    :func:`_literal` refuses any that is not a plain Python literal."""
    seed: int
    observed: str = ""
    """What the check measured, shown in the script's header for comparison."""


@dataclass
class OpsReproSpec:
    """Everything a step-3 reproducer needs; the callables are inlined by source."""

    check_id: str
    op: str
    dtype: str
    device: str
    provider: str
    provider_description: str
    make_inputs: Callable[..., Any]
    reference: Callable[..., Any]
    op_fn: Callable[..., Any]
    to_numpy: Callable[..., Any]
    compare: Callable[..., Any]
    precision: Callable[..., Any]
    """``full_fp32_precision(backend)``: TF32/HF32 off around the op, as in the check."""
    outputs: list[tuple[str, OutputTolerance]]
    """(output name, tolerance class) per output."""
    in_place: bool
    cases: list[OpsReproCase]
    device_type: str = "cpu"
    torch_module: str = "cpu"
    extension_module: str | None = None
    overrides: dict[tuple[str, str], str] = field(default_factory=dict)
    version: str = ""


_SCRIPT_NAMES = ("CHECK_ID", "OP", "DTYPE", "DEVICE", "PROVIDER", "IN_PLACE", "DEVICE_TYPE", "TORCH_MODULE",
                 "EXTENSION_MODULE", "OUTPUTS", "CASES", "_Limit", "_Tolerance", "_Backend", "build_inputs",
                 "_synchronize", "run_case", "_ratio_text", "_bound_text", "main")
"""Names the script's runtime part defines."""
_SCRIPT_MODULES = {"argparse": "argparse", "ast": "ast", "importlib": "importlib", "json": "json", "math": "math", "os": "os",
                   "sys": "sys", "traceback": "traceback", "types": "types", "np": "numpy", "torch": "torch"}
"""Names the runtime part imports: inlined code importing the same module shares them."""

_RUNTIME = r'''

# ======================================================================= this check
CHECK_ID = __CHECK_ID__
OP = __OP__
DTYPE = __DTYPE__
DEVICE = __DEVICE__
PROVIDER = __PROVIDER__
IN_PLACE = __IN_PLACE__
DEVICE_TYPE = __DEVICE_TYPE__
TORCH_MODULE = __TORCH_MODULE__
EXTENSION_MODULE = __EXTENSION_MODULE__
OUTPUTS = json.loads(__OUTPUTS__)
CASES = ast.literal_eval(__CASES__)


class _Limit:
    """The tolerance class's limits for DTYPE (what the check's policy holds)."""

    def __init__(self, limits):
        self._limits = dict(limits)
        for key in ("rtol", "atol", "max_normalized", "min_cosine"):
            setattr(self, key, self._limits.get(key))

    def model_dump(self):
        return {k: self._limits.get(k) for k in ("rtol", "atol", "max_normalized", "min_cosine")}


class _Tolerance:
    def __init__(self, spec):
        self.mode = spec["mode"]
        self.max_code_distance = spec.get("max_code_distance")
        self._limit = _Limit(spec.get("limits") or {})

    def limit_for(self, dtype):
        return self._limit


class _Backend:
    """What the precision switch reads from adaptcheck's backend object."""

    device_type = DEVICE_TYPE
    torch_module = TORCH_MODULE

    def torch_api(self):
        if EXTENSION_MODULE:
            importlib.import_module(EXTENSION_MODULE)
        return getattr(torch, TORCH_MODULE)


def build_inputs(case):
    """The check's inputs for ``case``: same generator code, parameters and seed."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(case["seed"]))
    return make_inputs(types.SimpleNamespace(**case["params"]), DTYPE, gen)


def _synchronize():
    api = getattr(torch, TORCH_MODULE, None)
    sync = getattr(api, "synchronize", None)
    if DEVICE_TYPE != "cpu" and callable(sync):
        sync()


def run_case(case, device):
    """(comparisons, error text): the harness's steps for one case."""
    inputs = build_inputs(case)
    ref_args = {k: to_numpy(v) for k, v in inputs.kwargs.items()}
    dev_args = {k: (v.clone() if IN_PLACE else v).to(device) if isinstance(v, torch.Tensor) else v
                for k, v in inputs.kwargs.items()}
    try:
        with precision(_Backend()):
            got = op_under_test(**dev_args)
            _synchronize()
    except Exception as exc:
        traceback.print_exc()
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        return [], f"{type(exc).__name__}: {first}"[:500]
    expected = reference(**ref_args)
    got_t = got if isinstance(got, tuple) else (got,)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    if len(got_t) != len(OUTPUTS):
        return [], f"the op returned {len(got_t)} outputs, expected {len(OUTPUTS)}"
    mask = inputs.compare_mask.numpy() if inputs.compare_mask is not None else None
    results = []
    for i, (name, tol) in enumerate(OUTPUTS):
        if not isinstance(got_t[i], torch.Tensor):
            return results, f"output {name!r} is a {type(got_t[i]).__name__}, not a tensor"
        results.append(compare(name, got_t[i], np.asarray(exp_t[i]), DTYPE, _Tolerance(tol),
                               mask if i == 0 else None))
    return results, ""


def _ratio_text(ratio):
    return "inf" if not math.isfinite(ratio) else f"{ratio:.3g}x"


def _bound_text(tol):
    limits = ", ".join(f"{k}={v!r}" for k, v in sorted((tol.get("limits") or {}).items()) if v is not None)
    extra = f", max_code_distance={tol['max_code_distance']!r}" if tol.get("max_code_distance") is not None else ""
    return f"{tol['class']} ({tol['mode']}{': ' + limits if limits else ''}{extra})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=f"Reproduce {CHECK_ID}: {OP} in {DTYPE} vs the float64 reference.")
    parser.add_argument("--device", default=DEVICE, help=f"torch device (default {DEVICE}, where the check ran)")
    parser.add_argument("--dump-inputs", metavar="DIR", help="save each case's inputs there (torch.save)")
    args = parser.parse_args(argv)
    if EXTENSION_MODULE:
        importlib.import_module(EXTENSION_MODULE)
    device = torch.device(args.device)
    print(f"{CHECK_ID}: op {OP} ({PROVIDER}) in {DTYPE} on {device}, torch {torch.__version__}")
    rows = []
    for case in CASES:
        if args.dump_inputs:
            os.makedirs(args.dump_inputs, exist_ok=True)
            dump = build_inputs(case)
            torch.save({"kwargs": dump.kwargs, "compare_mask": dump.compare_mask},
                       os.path.join(args.dump_inputs, f"{case['name']}.pt"))
        comparisons, error = run_case(case, device)
        if error:
            print(f"case '{case['name']}' {DTYPE}: ERROR {error}")
            rows.append((case["name"], math.inf, False, error))
            continue
        worst, reason = 0.0, ""
        for comp, (name, tol) in zip(comparisons, OUTPUTS):
            verdict = "ok" if comp.passed else "FAIL"
            print(f"case '{case['name']}' {DTYPE} output '{name}': ratio={comp.ratio!r} max_abs={comp.max_abs!r}"
                  f" max_rel={comp.max_rel!r} normalized={comp.normalized!r} cosine={comp.cosine!r}"
                  f" mismatch_fraction={comp.mismatch_fraction!r} bound: ratio <= 1 under {_bound_text(tol)}"
                  f" -> {verdict}{': ' + comp.reason if comp.reason else ''}")
            worst = max(worst, comp.ratio)
            if not comp.passed and not reason:
                reason = comp.reason
        rows.append((case["name"], worst, all(c.passed for c in comparisons), reason))
    failed = [r for r in rows if not r[2]]
    if failed:
        name, ratio, _, reason = max(failed, key=lambda r: r[1])
        print(f"FAIL {CHECK_ID}: {len(failed)}/{len(rows)} cases out of tolerance; worst '{name}'"
              f" ({_ratio_text(ratio)} of tolerance): {reason}")
        return 1
    name, ratio, _, _ = max(rows, key=lambda r: r[1])
    print(f"PASS {CHECK_ID}: {len(rows)} case{'s' if len(rows) != 1 else ''} within tolerance (worst '{name}'"
          f" at {_ratio_text(ratio)} of tolerance)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _needs(source: str, extension: str | None) -> list[str]:
    """Top-level packages outside the standard library the script imports (also by name,
    ``importlib.import_module("vllm._custom_ops")``), for the header."""
    found = {"torch", "numpy"} | ({extension.split(".")[0]} if extension else set())
    for match in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)|import_module\(\s*['\"]([A-Za-z_]\w*)",
                             source, re.MULTILINE):
        name = match.group(1) or match.group(2)
        if name not in sys.stdlib_module_names and name != "__future__":
            found.add(name)
    return sorted(found)


def _literal(value: Any) -> str:
    """``value`` as a Python literal that ``ast.literal_eval`` reads back equal (tuples stay
    tuples); anything else is refused, so data can never become code in the script."""
    text = repr(value)
    if ast.literal_eval(text) != value:
        raise ValueError(f"case parameters do not survive as a literal: {text[:200]}")
    return text


def render_ops_script(spec: OpsReproSpec) -> str:
    """The script's text (see the module docstring)."""
    bundle = Bundle(overrides=dict(spec.overrides))
    wanted: dict[str, tuple[Callable[..., Any], str]] = {
        "make_inputs": (spec.make_inputs, "input generator"),
        "reference": (spec.reference, "reference kernel"),
        "op_under_test": (spec.op_fn, f"provider {spec.provider!r} op {spec.op!r}"),
        "to_numpy": (spec.to_numpy, "to_numpy"),
        "compare": (spec.compare, "compare"),
        "precision": (spec.precision, "precision switch"),
    }
    # The script's own names may not be taken by inlined code (a kernel named `main` …).
    for name in _SCRIPT_NAMES:
        bundle.reserve(name)
    for name, module in _SCRIPT_MODULES.items():
        bundle.reserve(name, ("ext", module))
    for alias, (obj, _) in wanted.items():
        key = Bundle.key_of(obj)
        bundle.reserve(alias, key if key is not None and key[1] == alias else None)
    roots = {alias: bundle.add_object(obj, label) for alias, (obj, label) in wanted.items()}
    body = bundle.source()
    cases = [{"name": c.name, "params": c.params, "seed": c.seed} for c in spec.cases]
    observed = "\n".join(f"  case '{c.name}' (seed {c.seed}): {c.observed}" for c in spec.cases if c.observed)
    header = (
        f'"""Reproducer for adaptcheck check {spec.check_id}: {spec.op} in {spec.dtype}, provider {spec.provider}.\n\n'
        f"Written by adaptcheck {spec.version} on {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}."
        f" Provider: {spec.provider_description or spec.provider}.\n"
        f"Standalone: needs {', '.join(_needs(body, spec.extension_module))}, not adaptcheck. The input generator, the float64 reference kernel and the comparison below are\n"
        "copied from the code the check ran, so the inputs (same seed) and the error figure are the check's.\n\n"
        f"    python {spec.check_id}.py [--device DEVICE] [--dump-inputs DIR]\n\n"
        "Prints one line per case and output (ratio = error / bound, <= 1 passes); exit 1 when out of tolerance.\n"
        + (f"\nThe check measured:\n{observed}\n" if observed else "")
        + '"""\n'
    )
    # The bundle starts with `from __future__`; it must stay the first statement after the docstring.
    future, _, rest = body.partition("\n")
    stdlib = "import argparse\nimport ast\nimport importlib\nimport json\nimport math\nimport os\nimport sys\nimport traceback\nimport types\n"
    imports = "import numpy as np\nimport torch\n"
    ours = set((stdlib + imports).splitlines())
    rest = "\n".join(line for line in rest.splitlines() if line not in ours) + "\n"
    aliases = "\n\n# ======================================================================= names used below\n"
    aliases += "".join(f"{k} = {v}\n" for k, v in roots.items() if k != v)
    runtime_text = _RUNTIME
    values = {
        "__CHECK_ID__": repr(spec.check_id), "__OP__": repr(spec.op), "__DTYPE__": repr(spec.dtype),
        "__DEVICE__": repr(spec.device), "__PROVIDER__": repr(spec.provider), "__IN_PLACE__": repr(spec.in_place),
        "__DEVICE_TYPE__": repr(spec.device_type), "__TORCH_MODULE__": repr(spec.torch_module),
        "__EXTENSION_MODULE__": repr(spec.extension_module),
        # JSON text in a Python string literal: data from results.json can never become code.
        "__OUTPUTS__": repr(json.dumps([[n, t] for n, t in spec.outputs])),
        "__CASES__": repr(_literal(cases)),
    }
    for placeholder, literal in values.items():
        runtime_text = runtime_text.replace(placeholder, literal)
    return f"{header}{future}\n\n{stdlib}\n{imports}{rest}{aliases}{runtime_text}"


def write_ops_repro(run_dir: Path, spec: OpsReproSpec) -> Path:
    """Write ``repro/<check id>.py`` for ``spec`` into ``run_dir`` and return its path."""
    return write_script(run_dir, spec.check_id, render_ops_script(spec))
