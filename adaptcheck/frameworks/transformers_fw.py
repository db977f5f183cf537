"""Hugging Face transformers, in process, on the selected device: the always-available framework,
and at float64 on the CPU the reference of step 4 (docs/frameworks.md, "transformers").
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from adaptcheck.base.dtypes import framework_dtype
from adaptcheck.base.errors import exception_line, missing_dependency
from adaptcheck.frameworks.base import (
    Availability,
    Framework,
    FrameworkConfig,
    FrameworkError,
    FrameworkFacts,
    FrameworkUnavailable,
    Generation,
    GenRequest,
    LoadOptions,
    Scored,
    ScoreRequest,
    apply_stop,
)

if TYPE_CHECKING:
    import torch


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _dtype_kwarg() -> str:
    """``dtype`` since transformers 4.56, ``torch_dtype`` before (vendor stacks pin older ones)."""
    from packaging.version import Version

    return "dtype" if Version(_version("transformers") or "0") >= Version("4.56") else "torch_dtype"


class _GenerateKwargs(TypedDict, total=False):
    """``generate`` keywords that depend on the batch (stop strings, EOS handling)."""

    stop_strings: list[str]
    tokenizer: object
    eos_token_id: list[int] | None


def _moe_kwargs(path: Path) -> dict[str, str]:
    """transformers 5 runs MoE experts as a grouped matmul that has no float64 kernel (the CPU
    reference); the per-expert loop works for every dtype and device, like eager attention."""
    from packaging.version import Version

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    moe = any(k in config for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    if moe and Version(_version("transformers") or "0") >= Version("5.0"):
        return {"experts_implementation": "eager"}
    return {}


class TransformersFramework(Framework):
    """transformers ``AutoModelForCausalLM`` + ``generate`` (greedy)."""

    name = "transformers"
    display_name = "Hugging Face transformers (in process)"
    supports_prefix_caching = False
    supports_compile_toggle = False

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        super().__init__(config)
        self.model: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.dtype = "bf16"
        self._opts: LoadOptions | None = None
        self.images: Any = None
        """A vision-language model's image inputs (:class:`~adaptcheck.frameworks.multimodal.ImageInputs`)."""

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("transformers") is None:
            return Availability(False, "transformers is not installed (pip install transformers)")
        return Availability(True, version=_version("transformers"))

    def load(self, opts: LoadOptions, device: str) -> float:
        avail = self.availability()
        if not avail.available:
            raise FrameworkUnavailable(avail.reason)
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from adaptcheck.frameworks import multimodal

        start = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(opts.model_path))
            # The dtype keyword's name depends on the version (_dtype_kwarg), hence no TypedDict.
            kwargs: dict[str, torch.dtype | str] = {_dtype_kwarg(): getattr(torch, framework_dtype(opts.dtype)),
                                                    **_moe_kwargs(opts.model_path)}
            # transformers' default attention (SDPA where torch has it) unless the ladder asks
            # otherwise: it is what `transformers serve` and most users run, so the device's
            # fused attention kernel is what step 4 exercises (eager never calls it).
            if opts.extra.get("attn_implementation"):
                kwargs["attn_implementation"] = str(opts.extra["attn_implementation"])
            # A vision-language model (config.json has vision_config) is an image-text-to-text
            # class: the causal-LM auto class does not map it.
            vision = multimodal.vision_config(opts.model_path) is not None
            auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
            self.model = auto.from_pretrained(str(opts.model_path), **kwargs)
            self.model.to(device).eval()
            self.images = multimodal.ImageInputs(opts.model_path, self.tokenizer) if vision else None
        except Exception as exc:
            missing = missing_dependency(exc)
            if missing:  # a model whose processor needs an optional package: n/a, with the pip command
                raise FrameworkUnavailable(f"transformers cannot load {opts.model_path.name} here: {missing}") from exc
            first = exception_line(exc, with_type=False)
            if "mismatched_sizes" in first:
                # transformers prints the tensors in a report of its own; say what it means.
                raise FrameworkError(f"transformers could not load {opts.model_path}: the weights' shapes do not "
                                     "match config.json (a tensor of another size than the config declares; "
                                     "the worker log lists them)") from exc
            raise FrameworkError(f"transformers could not load {opts.model_path}: {exception_line(exc)}") from exc
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.device, self.dtype, self._opts = device, opts.dtype, opts
        return time.perf_counter() - start

    def _prompt_ids(self, req: GenRequest) -> list[int]:
        if req.images:
            if self.images is None or req.messages is None:
                raise FrameworkError("transformers: images need a vision-language model and a chat request")
            return self.images.prompt_ids(req.messages, req.images)
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        if req.messages is not None:
            ids = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer versions
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in self.tokenizer(req.prompt or "")["input_ids"]]

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        if self.model is None:
            raise FrameworkError("transformers: generate() before load()")
        if any(r.images for r in requests) and len(requests) > 1:
            # A request with images runs alone: its pixels belong to its own rows (no padding
            # shifts the M-RoPE positions the model derives from the image grid).
            return [g for r in requests for g in self.generate([r])]
        import torch

        prompts = [self._prompt_ids(r) for r in requests]
        width = max(len(p) for p in prompts)
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        max_new = max(r.max_tokens for r in requests)
        top_n = max(r.logprobs for r in requests)
        stops = sorted({s for r in requests for s in r.stop})
        kwargs: _GenerateKwargs = {}
        if stops:
            # transformers' own stop-string criterion (what is under test), not a post-hoc cut.
            kwargs["stop_strings"] = stops
            kwargs["tokenizer"] = self.tokenizer
        if any(r.ignore_eos for r in requests):
            kwargs["eos_token_id"] = None if all(r.ignore_eos for r in requests) else self._eos_ids()
        pixels = self._pixels(requests[0].images, ids)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=max_new,
                do_sample=False, num_beams=1, output_logits=True, return_dict_in_generate=True,
                pad_token_id=pad, **kwargs, **pixels,
            )
        seqs = out.sequences[:, width:].cpu()
        logits = torch.stack(list(out.logits), dim=1).float().cpu() if out.logits else None
        return [self._one(req, prompts[i], seqs[i].tolist(), logits[i] if logits is not None else None, top_n)
                for i, req in enumerate(requests)]

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]

    def _one(self, req: GenRequest, prompt: list[int], seq: list[int], logits: torch.Tensor | None,
             top_n: int) -> Generation:
        eos = set() if req.ignore_eos else set(self._eos_ids())
        pad = int(self.tokenizer.pad_token_id)
        tokens: list[int] = []
        finish = "length"
        for tok in seq[: req.max_tokens]:
            tokens.append(int(tok))
            if tok in eos:
                finish = "stop"
                break
        if finish == "length" and len(tokens) < req.max_tokens and tokens and tokens[-1] == pad:
            finish = "stop"  # padded after an EOS that equals pad
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if req.stop:
            text, hit = apply_stop(text, req.stop)
            if hit:
                finish = "stop"
                tokens = self._tokens_covering(tokens, req.stop)
        tops: list[dict[int, float]] | None = None
        if req.logprobs and logits is not None:
            import torch

            lp = torch.log_softmax(logits[: len(tokens)], dim=-1)
            tops = scored_from_logprobs(lp, tokens, max(top_n, req.logprobs)).top_logprobs
        return Generation(token_ids=tokens, text=text, finish_reason=finish, prompt_tokens=len(prompt),
                          completion_tokens=len(tokens), top_logprobs=tops, prompt_ids=prompt,
                          extra={"images": list(req.images)} if req.images else {})

    def _pixels(self, images: list[str], ids: torch.Tensor) -> dict[str, Any]:
        """The model's image inputs for one request's ``images`` at the model's dtype and device,
        with the token types of ``ids`` (1 at an image pad) that M-RoPE's positions are built from."""
        if not images:
            return {}
        if self.images is None:
            raise FrameworkError("transformers: images given to a model without a vision tower")
        inputs = self.images.pixels(images)
        dtype = next(self.model.parameters()).dtype
        return {"pixel_values": inputs["pixel_values"].to(self.device, dtype),
                "image_grid_thw": inputs["image_grid_thw"].to(self.device),
                "mm_token_type_ids": (ids == self.images.pad_id).long().to(self.device)}

    def _tokens_covering(self, tokens: list[int], stops: list[str]) -> list[int]:
        """The shortest token prefix whose text contains a stop string (the tokens the model
        actually produced before it was told to stop)."""
        for n in range(1, len(tokens) + 1):
            if apply_stop(self.tokenizer.decode(tokens[:n], skip_special_tokens=True), stops)[1]:
                return tokens[:n]
        return tokens

    def attn_implementation(self) -> str | None:
        """The attention implementation transformers resolved at load (``sdpa``, ``eager`` …)."""
        config = getattr(self.model, "config", None)
        return getattr(config, "_attn_implementation", None) if config is not None else None

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """One forward pass over the left-padded batch: each position's log-softmax."""
        if self.model is None:
            raise FrameworkError("transformers: score() before load()")
        import torch

        if any(r.images for r in requests):
            return [self._score_images(r) if r.images else self.score([r])[0] for r in requests]
        width = max(len(r.token_ids) for r in requests)
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.tensor([[pad] * (width - len(r.token_ids)) + list(r.token_ids) for r in requests], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r.token_ids)) + [1] * len(r.token_ids) for r in requests],
                            dtype=torch.long)
        # Left padding shifts every row: positions must count real tokens only, as generate() does.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                position_ids=positions.to(self.device)).logits
        out: list[Scored] = []
        for row, req in enumerate(requests):
            offset = width - len(req.token_ids)
            # The logits at position i predict token i + 1.
            lp = torch.log_softmax(logits[row, offset + req.start - 1: width - 1].double().cpu(), dim=-1)
            out.append(scored_from_logprobs(lp, req.token_ids[req.start:], req.top_k))
        return out

    def _score_images(self, req: ScoreRequest) -> Scored:
        """A sequence with images, alone: the model derives its M-RoPE positions from the ids and
        the image grids (given positions would be the text-only ones)."""
        import torch

        ids = torch.tensor([list(req.token_ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                **self._pixels(req.images, ids)).logits
        lp = torch.log_softmax(logits[0, req.start - 1: len(req.token_ids) - 1].double().cpu(), dim=-1)
        return scored_from_logprobs(lp, req.token_ids[req.start:], req.top_k)

    def torch_model(self) -> Any:
        return self.model

    def implementations(self) -> dict[str, str | None]:
        """Attention implementation, MoE experts path, and the module class of each layer type."""
        if self.model is None:
            return {}
        facts: dict[str, str | None] = {"attention": self.attn_implementation()}
        experts = getattr(self.model.config, "_experts_implementation", None)
        if experts:
            facts["moe_experts"] = experts
        for name, module in self.model.named_modules():
            kind = type(module).__name__
            leaf = name.rsplit(".", 1)[-1]
            if kind.endswith(("RMSNorm", "LayerNorm")) and "norm" not in facts:
                facts["norm"] = f"{kind} (module forward in torch ops)"
            elif leaf == "act_fn" and "activation" not in facts:
                facts["activation"] = f"{kind} (torch op)"
        return facts

    def describe(self) -> FrameworkFacts:
        facts: FrameworkFacts = {"framework": self.name, "transformers": _version("transformers"),
                                 "device": self.device, "dtype": self.dtype, "attention": self.attn_implementation()}
        if self.images is not None:
            facts["image_inputs"] = self.images.how
        return facts

    def shutdown(self) -> None:
        self.model = None
        self.tokenizer = None
        self.images = None
        import gc

        gc.collect()


def scored_from_logprobs(lp: torch.Tensor, tokens: list[int], top_k: int) -> Scored:
    """``Scored`` from a [positions, vocab] log-probability tensor and the scored tokens."""
    import torch

    vals, idx = lp.topk(min(top_k, lp.shape[-1]), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None])[:, 0].tolist()
    tops = []
    for pos, tok in enumerate(tokens):
        row = {int(i): float(v) for i, v in zip(idx[pos].tolist(), vals[pos].tolist(), strict=False)}
        row.setdefault(int(tok), float(chosen[pos]))
        tops.append(row)
    return Scored(token_logprobs=[float(v) for v in chosen], top_logprobs=tops)
