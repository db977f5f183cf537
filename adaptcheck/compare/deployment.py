"""Deployment changes: whether two runs certified the same deployment under test, and, when not,
which of its facts differ (docs/compare.md, "Different deployments").

Two runs certified the same deployment exactly when both were given one (``--serve``) and their
digests agree (:func:`adaptcheck.base.schemas.deployment.deployment_digest`: the normalized
command), or when neither was: adaptcheck's own deployment, whether the file says so
(``source: adaptcheck``) or is older than results schema 1.7 and has none. The engine's version
is not part of a deployment (the digest leaves it out on purpose: an upgrade of vLLM under the same
command is the comparison's very use) — it is an environment change.
"""

from __future__ import annotations

import json
import shlex
from typing import Literal

from pydantic import JsonValue

from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compare.model import DeploymentChange, EnvChange, deployment_text

ANOTHER_DEPLOYMENT = "the baseline certified another deployment"
"""How a deployment change starts wherever it is said (the verdict's reason, ``perf.regression``)."""
OWN = "adaptcheck's own"
SHORT_DIGEST = 12
COVERED_ARGS = frozenset(Deployment.model_fields) | {"enforce_eager"}
"""Engine arguments compared as the deployment's own fields (``enforce_eager`` as ``compile_mode``),
so that ``engine_args`` does not list them a second time."""


def given(results: RunResults) -> Deployment | None:
    """The deployment the user gave the run (``--serve``); None for adaptcheck's own or none recorded."""
    d = results.deployment
    return d if d is not None and d.given else None


def _value(value: JsonValue) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _digest(d: Deployment | None) -> str | None:
    return (d.digest[:SHORT_DIGEST] + "…") if d is not None and d.digest else None


def flatten(d: Deployment) -> dict[str, str | None]:
    """A given deployment's facts by name (None: not set, the engine's default), in reading order."""
    flat: dict[str, str | None] = {
        "engine": d.engine,
        "model": d.model,
        "tensor_parallel_size": str(d.tensor_parallel_size),
        "pipeline_parallel_size": str(d.pipeline_parallel_size),
        "max_model_len": str(d.max_model_len) if d.max_model_len is not None else None,
        "kv_cache_dtype": d.kv_cache_dtype,
        "compile_mode": d.compile_mode,
        "dtype": d.dtype,
        "quantization": d.quantization,
        "enable_prefix_caching": str(d.enable_prefix_caching).lower() if d.enable_prefix_caching is not None else None,
        "features": ",".join(d.features) or None,
    }
    for name in sorted(d.engine_args):
        if name not in COVERED_ARGS:
            flat[f"engine_args.{name}"] = _value(d.engine_args[name])
    flat["server_args"] = shlex.join(d.server_args) or None
    return flat


def _change(what: str, before: str | None, after: str | None) -> EnvChange:
    kind: Literal["changed", "added", "removed"] = (
        "added" if before is None else "removed" if after is None else "changed")
    return EnvChange(what=what, before=before, after=after, change=kind)


def _command(d: Deployment) -> str:
    return shlex.join(d.command) if d.command else d.normalized


def compare_deployment(baseline: RunResults, new: RunResults) -> DeploymentChange | None:
    """None when both runs certified the same deployment; else what differs, fact by fact."""
    a, b = given(baseline), given(new)
    if a is None and b is None:
        return None
    # The digest decides; a hand-made record without one is compared by its normalized command.
    if a is not None and b is not None and (a.digest or a.normalized) == (b.digest or b.normalized):
        return None
    changes: list[EnvChange] = []
    if a is None or b is None:
        # One side deployed the user's command, the other adaptcheck's settings: field by field
        # would list every fact as added or removed; the command itself says it.
        changes.append(EnvChange(what="deployment", before=_command(a) if a else OWN, after=_command(b) if b else OWN,
                                 change="changed"))
    else:
        fa, fb = flatten(a), flatten(b)
        for key in dict.fromkeys([*fa, *fb]):
            if fa.get(key) != fb.get(key):
                changes.append(_change(key, fa.get(key), fb.get(key)))
    changes.append(_change("command digest", _digest(a), _digest(b)))
    parts = "; ".join(f"{c.what} {c.before or 'absent'} → {c.after or 'absent'}" for c in changes)
    return DeploymentChange(before=deployment_text(baseline), after=deployment_text(new),
                            before_digest=a.digest if a else None, after_digest=b.digest if b else None,
                            changes=changes, line=f"{ANOTHER_DEPLOYMENT} ({parts})")
