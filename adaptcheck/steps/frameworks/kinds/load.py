"""``framework.load``: the framework loads the model on the device, after a header-only weights audit.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

from adaptcheck.frameworks.base import GenRequest
from adaptcheck.frameworks.weights_audit import ROW_WEIGHTS
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.lifecycle import Active, run_with_framework
from adaptcheck.steps.frameworks.params import FrameworkParams
from adaptcheck.steps.frameworks.probes import local_tokenizer


class LoadParams(FrameworkParams):
    """``framework.load``: nothing beyond the framework."""


class FrameworkLoadCheck(FrameworkCheck):
    """The framework loads the model on the device (and how long model and load took).

    A local model folder is audited first (``weights_audit``): weights that do not cover
    config.json (MISSING, UNEXPECTED or MISMATCHED tensors) or a tokenizer with ids past the
    embedding fail this check naming them, and the folder is never loaded.
    """

    kind = "framework.load"
    step = 4
    description = ("The framework loads the model on the device (after a header-only audit: the weights cover "
                   "config.json, the tokenizer fits the embedding); load time and platform facts.")
    params_model = LoadParams
    label = "load"
    typical_s = 15.0

    def run(self, ctx: CheckContext, params: LoadParams) -> Outcome:
        return run_with_framework(ctx, params, _load_and_audit, refusal_fails=True)


def _load_and_audit(ctx: CheckContext, active: Active, _params: LoadParams) -> Outcome:
    """The load's outcome, with the weights audit's rows (which held: a refused folder never loads)."""
    outcome = load_outcome(ctx, active)
    audit = active.audit
    if audit is None:
        rows = [{"name": ROW_WEIGHTS, "ok": None,
                 "detail": "not audited: the framework serves an endpoint's weights, not a local folder"}]
    else:
        rows = list(audit.rows)
        outcome.details["weights_audit"] = audit.describe()
        outcome.metrics["weights_audit_s"] = round(audit.seconds, 4)
        not_run = [r["detail"] for r in rows if r["ok"] is None]
        held = sum(1 for r in rows if r["ok"])
        outcome.message += f"; weights audit: {held}/{len(rows)} held" + (f" ({not_run[0]})" if not_run else "")
    outcome.details["subchecks"] = [*outcome.details.get("subchecks", []), *rows]
    return outcome


def load_outcome(ctx: CheckContext, active: Active) -> Outcome:
    reused = active.loaded_by != ctx.check_id
    metrics = {"load_s": round(active.load_s, 3)}
    if active.model.generated_s is not None:
        metrics["model_generation_s"] = round(active.model.generated_s, 3)
    tok = local_tokenizer(active)
    gen = active.framework.generate([GenRequest(prompt=prompts.SHORT_PROMPTS[0], max_tokens=4)])[0]
    if not gen.text and not gen.token_ids:
        return Outcome.failed("the model loaded but its first request returned nothing", metrics=metrics)
    what = "reused" if reused else "loaded"
    eos_note = "" if tok.hf is not None else " (endpoint of unknown weights: no local tokenizer)"
    return Outcome.passed(f"{active.framework.display_name} {what} {active.model.name} in {active.load_s:.1f} s; "
                          f"first answer {gen.text[:40]!r}{eos_note}", metrics=metrics)
