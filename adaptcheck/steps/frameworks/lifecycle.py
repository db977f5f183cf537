"""One loaded framework per worker process, shared by the step-4 checks that follow.

Bringing vLLM up costs tens of seconds, so the ``framework.<name>.*`` checks of a ladder
share one loaded instance: the first check that needs it loads it (and is charged the
time), the next ones reuse it through the worker's ``ctx.scratch``. Asking for a
different framework or different load options shuts the previous one down first, so
two engines never hold device memory at once.

A load that failed is remembered in the run folder (``framework/<key>.failed``), so that
the checks after it answer at once with the same one-line reason instead of paying for
the same failure again, even from a fresh worker after a crash.

Before a framework loads a local model folder, the folder's weights are audited against its
config.json and its tokenizer against the embedding (:mod:`adaptcheck.frameworks.weights_audit`,
headers only): a checkpoint with MISSING, UNEXPECTED or MISMATCHED tensors, or a tokenizer
with ids past the embedding, is refused (:class:`ModelRefused`) instead of served with
randomly initialised weights. The load check fails naming the tensors; the other checks
that need the folder are errors with the same line. The refusal is not written to the
``.failed`` marker (the audit is cheap and cached per process), so whichever check meets it
first, the load check still fails with the rows.

:func:`run_with_framework` is how every step-4 check runs: acquire, run the probe, and
turn an absent framework into a not-applicable skip and a failing one into an error.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from adaptcheck.base.errors import AdaptcheckError, exception_line, missing_dependency
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.framework_evidence import FrameworkCheckEvidence, FrameworkInfo, ModelInfo
from adaptcheck.frameworks.base import (
    Framework,
    FrameworkConfig,
    FrameworkError,
    FrameworkUnavailable,
    LoadOptions,
)
from adaptcheck.frameworks.modelsrc import ResolvedModel, resolve_model
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.frameworks.weights_audit import WeightsAudit, audit_cached
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.params import FrameworkParams, LoadOverrides

SCRATCH_KEY = "framework.active"


@dataclass
class Active:
    """A loaded framework and what it took to get there."""

    key: str
    name: str
    framework: Framework
    model: ResolvedModel
    options: LoadOptions
    load_s: float
    loaded_by: str
    """Id of the check that paid for the load."""
    tokenizer: Any = None
    """The probes' local tokenizer of this instance, loaded once by its first check."""
    audit: WeightsAudit | None = None
    """The weights audit of the served folder; None when the weights are not local (an endpoint)."""


class ModelRefused(FrameworkError):
    """The model folder's weights do not cover its config (or its tokenizer its embedding):
    no framework may serve it. Carries the audit, whose rows name the tensors."""

    def __init__(self, audit: WeightsAudit) -> None:
        super().__init__(audit.message)
        self.audit = audit


def framework_dir(ctx: CheckContext) -> Path:
    path = ctx.run_dir / "framework"
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_for(ctx: CheckContext) -> FrameworkConfig:
    ep = ctx.endpoint
    if ep is None:
        return FrameworkConfig(log_dir=framework_dir(ctx))
    return FrameworkConfig(log_dir=framework_dir(ctx), endpoint_url=ep["url"], endpoint_model=ep["model"],
                           endpoint_reference=ep["reference"])


def _key(name: str, model: str, opts: dict[str, Any]) -> str:
    blob = json.dumps({"framework": name, "model": model, **opts}, sort_keys=True, default=str)
    return f"{name.replace(':', '_').replace('/', '_')}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def release(ctx: CheckContext) -> None:
    """Shut the active framework down (before loading another, and at the end of a test)."""
    active: Active | None = ctx.scratch.pop(SCRATCH_KEY, None)
    if active is not None:
        active.framework.shutdown()


FEATURE_OFF: dict[str, LoadOverrides] = {
    "prefix_caching": {"enable_prefix_caching": False},
    "graph_capture": {"compile": False},
    "spec_decode": {"engine_args": {"speculative_config": None}},
    "fp8_kv_cache": {"engine_args": {"kv_cache_dtype": "auto"}},
    "chunked_prefill": {"engine_args": {"enable_chunked_prefill": False}},
    "tensor_parallel": {"tensor_parallel_size": 1},
}
"""How a feature check turns a feature the deployment deploys *off* for its other instance (an
``engine_args`` value of None removes the argument): everything else stays as deployed."""


def deployed_here(ctx: CheckContext, cls: type[Framework], model: str | None) -> bool:
    """Whether a check of ``cls`` on ``model`` runs the ``--serve`` deployment: the adapter is the
    deployment's engine and the check runs the run's model (its own ``model`` unset, or the same)."""
    dep = ctx.deployment
    if dep is None or not dep.given or cls.deploys is None or cls.deploys != dep.engine:
        return False
    return model is None or model in (ctx.model.name, dep.model)


def deployment_overrides(deployment: Deployment, cls: type[Framework]) -> LoadOverrides:
    """The load options of the deployment itself, as the adapter takes them."""
    out: LoadOverrides = {
        "dtype": deployment.dtype,  # type: ignore[typeddict-item]
        "max_model_len": deployment.max_model_len,
        "tensor_parallel_size": deployment.tensor_parallel_size,
        "compile": False if deployment.compile_mode == "eager" else None,
        "enable_prefix_caching": deployment.enable_prefix_caching,
        "engine_args": dict(deployment.engine_args),
    }
    if deployment.server_args and getattr(cls, "launches_server", None):
        out["extra"] = {"server_args": list(deployment.server_args)}
    return out


def merge_toggles(base: LoadOverrides, toggles: LoadOverrides | None) -> LoadOverrides:
    """``base`` with ``toggles`` on top; ``engine_args`` merged name by name, a None value removing the name."""
    if not toggles:
        return base
    merged: LoadOverrides = {**base, **toggles}
    if "engine_args" in toggles:
        args = {**base.get("engine_args", {}), **toggles["engine_args"]}
        merged["engine_args"] = {k: v for k, v in args.items() if v is not None}
    return merged


def acquire(ctx: CheckContext, name: str, check_id: str, *, toggles: LoadOverrides | None = None,
            model: str | None = None, dtype: str | None = None,
            max_model_len: int | None = None, **overrides: Any) -> Active:
    """The loaded framework ``name`` with these options, loading it if needed.

    With a ``--serve`` deployment, a check of the deployed model on the deployment's engine loads
    the deployment's engine arguments, not the ladder's (``model``, ``dtype``, ``max_model_len`` and
    ``overrides`` are then ignored): only ``toggles``, a feature check's own feature, change it.

    Raises FrameworkUnavailable (→ skip), ModelError or FrameworkError (→ error).
    """
    # adaptcheck never downloads: a framework that would reach for a model hub fails instead.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cls = framework_class(name)
    avail = cls.availability()
    if not avail.available:
        raise FrameworkUnavailable(avail.reason)
    unconfigured = cls.unconfigured(config_for(ctx))
    if unconfigured:
        raise FrameworkUnavailable(unconfigured)
    if ctx.deployment is not None and deployed_here(ctx, cls, model):
        resolved = resolve_model(ctx.deployment.model, seed=ctx.seed)
        chosen = merge_toggles(deployment_overrides(ctx.deployment, cls), toggles)
        chosen["max_model_len"] = chosen.get("max_model_len") or resolved.max_position or ctx.model.context_length
    else:
        # The run seed picks the embedded model's weights too: --seed N is a different random model.
        resolved = resolve_model(model or ctx.model.name, seed=ctx.seed)
        ladder: dict[str, Any] = {"dtype": dtype or ctx.model.precision,
                                  "max_model_len": max_model_len or min(ctx.model.context_length,
                                                                        resolved.max_position or ctx.model.context_length),
                                  **overrides}
        chosen = merge_toggles(cast(LoadOverrides, ladder), toggles)
    fields: dict[str, Any] = {k: v for k, v in chosen.items() if k != "model"}
    opts = LoadOptions(model_path=resolved.path, **fields)
    key = _key(name, str(resolved.path), {k: v for k, v in vars(opts).items() if k != "model_path"})
    active: Active | None = ctx.scratch.get(SCRATCH_KEY)
    if active is not None and active.key == key:
        return active
    failed = framework_dir(ctx) / f"{key}.failed"
    if failed.exists():
        raise FrameworkError(failed.read_text(encoding="utf-8").strip())
    fw = cls(config_for(ctx))
    audit = audit_cached(resolved.path) if fw.serves_local_weights() and resolved.path.is_dir() else None
    if audit is not None and audit.refused:
        raise ModelRefused(audit)
    release(ctx)
    start = time.perf_counter()
    try:
        fw.load(opts, str(ctx.device))
    except FrameworkUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the loader raised is the load's failure
        message = str(exc) if isinstance(exc, FrameworkError) else f"{cls.display_name} failed to load: {type(exc).__name__}: {exc}"
        failed.write_text(message.splitlines()[0] if message else type(exc).__name__, encoding="utf-8")
        try:
            fw.shutdown()
        finally:
            raise FrameworkError(failed.read_text(encoding="utf-8")) from exc
    active = Active(key=key, name=name, framework=fw, model=resolved, options=opts,
                    load_s=time.perf_counter() - start, loaded_by=check_id, audit=audit)
    if not ctx.scratch.get("framework.atexit"):
        # The worker ends when the ladder does: stop a launched server cleanly then, rather
        # than leave it to the parent-death signal.
        atexit.register(release, ctx)
        ctx.scratch["framework.atexit"] = True
    ctx.scratch[SCRATCH_KEY] = active
    return active


def framework_info(active: Active) -> FrameworkInfo:
    """Which framework answered, loaded how, for the report: the loaded form of ``details.framework``."""
    # describe() facts (versions, platform, URL…) differ per adapter: FrameworkInfo keeps them as extras.
    # Ours win over a describe() key of the same name (none has one today; a plugin might).
    return FrameworkInfo.model_validate({**active.framework.describe(), "name": active.name, "loaded": True,
                                         "display_name": active.framework.display_name,
                                         "load_s": round(active.load_s, 3), "loaded_by": active.loaded_by})


def framework_facts(active: Active) -> dict[str, Any]:
    """The same facts as a plain dict: the perf steps' ``details.server`` (not yet typed evidence)."""
    return {"name": active.name, "display_name": active.framework.display_name, "load_s": round(active.load_s, 3),
            "loaded_by": active.loaded_by, **active.framework.describe()}


def not_loaded(name: str) -> FrameworkInfo:
    """``details.framework`` of an outcome whose framework did not load: the same shape, the name only."""
    return FrameworkInfo(name=name, loaded=False)


def with_evidence(outcome: Outcome, framework: FrameworkInfo, model: ModelInfo | None = None) -> Outcome:
    """``outcome`` with the lifecycle evidence every step-4 outcome carries (framework, model).

    The body's own details (sub-check rows, comparisons…) are kept and validated against the
    shared part of the schema, so a body that wrote a malformed row fails here, in tests, rather
    than in a reader months later. A framework or model the body already set is kept.
    """
    current = FrameworkCheckEvidence.model_validate({"framework": framework, **outcome.details})
    if model is not None and current.model is None:
        current.model = model
    outcome.details = current.dump()
    return outcome


P = TypeVar("P", bound=FrameworkParams)


def refused_outcome(exc: ModelRefused, *, failed: bool) -> Outcome:
    """A refused model folder: the load check's failure (``failed``), any other check's error."""
    audit = exc.audit
    details: dict[str, Any] = {"subchecks": audit.rows, "weights_audit": audit.describe()}
    if not failed:
        return Outcome.errored(audit.message, details=details)
    return Outcome.failed(audit.message, details=details, metrics={"weights_audit_s": round(audit.seconds, 4)})


def run_with_framework(ctx: CheckContext, params: P, body: Callable[[CheckContext, Active, P], Outcome], *,
                       refusal_fails: bool = False, toggles: LoadOverrides | None = None) -> Outcome:
    """Load (or reuse) the framework, run ``body``, and turn failures into truthful outcomes.

    A model folder the weights audit refuses is an error here, or a failure with the audit's
    rows where ``refusal_fails`` (the load check, which is what judges the folder).
    """
    try:
        active = acquire(ctx, params.framework, ctx.check_id, toggles=toggles, **params.load_overrides())
    except ModelRefused as exc:
        # A refused, absent or failing framework carries the same ``framework`` shape as a
        # loaded one (the name; no facts): readers never guess between a string and a dict.
        return with_evidence(refused_outcome(exc, failed=refusal_fails), not_loaded(params.framework))
    except FrameworkUnavailable as exc:
        return with_evidence(Outcome.skipped(f"{params.framework}: {exception_line(exc, with_type=False)}",
                                             applicable=False), not_loaded(params.framework))
    except (AdaptcheckError, FrameworkError) as exc:
        missing = missing_dependency(exc)
        if missing:  # an optional package this framework needs for this model: n/a, never an error
            return with_evidence(Outcome.skipped(f"{params.framework}: {missing}", applicable=False),
                                 not_loaded(params.framework))
        return with_evidence(Outcome.errored(f"{params.framework}: {exception_line(exc, with_type=False)}"),
                             not_loaded(params.framework))
    try:
        outcome = body(ctx, active, params)
    except FrameworkUnavailable as exc:
        outcome = Outcome.skipped(exception_line(exc, with_type=False), applicable=False)
    except (AdaptcheckError, FrameworkError) as exc:
        # A server that died mid-check, an endpoint that stopped answering: say so, go on.
        missing = missing_dependency(exc)
        outcome = Outcome.skipped(missing, applicable=False) if missing else Outcome.errored(f"{active.framework.display_name}: {exception_line(exc, with_type=False)}")
    return with_evidence(outcome, framework_info(active), ModelInfo.model_validate(active.model.describe()))


def tp_unfit(cls: type[Framework], model: str, seed: int, ranks: int) -> str | None:
    """:meth:`Framework.tensor_parallel_unfit` for a check's model name, decided before anything
    loads; a model that does not resolve is left to the load, which says why."""
    try:
        path = resolve_model(model, seed=seed).path
    except (AdaptcheckError, OSError):
        return None
    return cls.tensor_parallel_unfit(path, ranks)
