"""The deployment under test: the serve command a user will run, as adaptcheck read it.

``adaptcheck run --serve 'vllm serve MODEL --tensor-parallel-size 8 …'`` hands adaptcheck the
command the user deploys. The installed engine's own argument parser reads it
(:mod:`adaptcheck.frameworks.deployment`); what it resolved to is this record. Steps 4 and 5 load
and serve exactly these engine arguments, a feature check toggles only its own feature, and the
certificate names the deployment (``results.json``'s ``deployment``, the report's first screen,
``grade --format json``, JUnit). Without ``--serve`` the run certifies a deployment adaptcheck
writes itself (``source: adaptcheck``), and says so.

Docs: docs/deployment.md.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

DeploymentSource = Literal["user", "adaptcheck"]
DeploymentEngine = Literal["vllm", "sglang", "transformers", "server"]
CompileMode = Literal["eager", "compiled", "per check"]

DEPLOYED_FEATURE_ARGS: dict[str, str] = {
    "tensor_parallel": "tensor_parallel_size > 1",
    "prefix_caching": "enable_prefix_caching",
    "fp8_kv_cache": "kv_cache_dtype fp8*",
    "spec_decode": "speculative_config",
    "graph_capture": "not enforce_eager",
    "chunked_prefill": "enable_chunked_prefill",
}
"""The serving features a deployment can turn on, and the engine argument that turns each on
(the features table marks them ``deployed``; docs/deployment.md, "Deployed features")."""


class Deployment(BaseModel):
    """What the certificate certifies: one engine, one model, one set of engine arguments."""

    model_config = ConfigDict(extra="forbid")

    source: DeploymentSource = Field(description="'user': the --serve command given; 'adaptcheck': no --serve, "
                                     "the ladder's model at adaptcheck's own settings (each check chooses its own).")
    engine: DeploymentEngine = Field(description="'vllm' (vllm serve / its api_server module), 'sglang' "
                                     "(sglang.launch_server), 'server' (any other OpenAI-compatible server, "
                                     "started as given), or for adaptcheck's own deployment where vLLM is not "
                                     "installed 'transformers' (transformers serve).")
    engine_version: str | None = Field(default=None, description="The engine's installed version, when known.")
    command: list[str] = Field(default_factory=list, description="The command as given, split into words "
                               "(empty for adaptcheck's own deployment).")
    normalized: str = Field(default="", description="The command as the engine's parser resolved it: the engine, "
                            "the model and every argument that differs from the engine's default, sorted.")
    digest: str = Field(default="", description="SHA-256 of the normalized command: two runs certified the same "
                        "deployment exactly when their digests agree.")
    model: str = Field(description="The model served: a local folder or file, or adaptcheck's model name.")
    engine_args: dict[str, JsonValue] = Field(default_factory=dict, description="Engine arguments that differ from "
                                              "the engine's defaults (vLLM ``EngineArgs`` names), model, "
                                              "served_model_name, host and port excluded.")
    server_args: list[str] = Field(default_factory=list, description="The command's arguments that are the "
                                   "server's rather than the engine's (host, port, API key …, vLLM's frontend "
                                   "options), kept for `vllm serve` and step 5.")
    dtype: str | None = Field(default=None, description="The dtype argument as given ('auto': the model's own).")
    quantization: str | None = Field(default=None, description="The quantization argument, when given.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="Tensor-parallel ranks.")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="Pipeline-parallel stages.")
    max_model_len: int | None = Field(default=None, description="Context length served (None: the model's own).")
    kv_cache_dtype: str = Field(default="auto", description="KV-cache dtype ('auto': the model's dtype).")
    enable_prefix_caching: bool | None = Field(default=None, description="Prefix caching as given (None: the "
                                               "engine's default).")
    compile_mode: CompileMode = Field(default="per check", description="'eager' (enforce_eager), 'compiled' (the "
                                      "engine's default graph capture / torch.compile), or 'per check' "
                                      "(adaptcheck's own deployment: each check says its own).")
    host: str | None = Field(default=None, description="The host the command binds (a command started as given: "
                             "SGLang or another server).")
    port: int | None = Field(default=None, description="The port the command listens on (a command started as given: "
                             "SGLang or another server).")
    features: list[str] = Field(default_factory=list, description="The serving features the deployment turns on "
                                "(base.features names): certified through the deployment's own checks.")

    @property
    def given(self) -> bool:
        """Whether the user gave the deployment (``--serve``)."""
        return self.source == "user"

    @property
    def world_size(self) -> int:
        """Ranks the engine runs: tensor × pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def summary(self) -> str:
        """One line for the run header, the grade and the report's first screen."""
        if not self.given:
            return (f"adaptcheck's own deployment: {self.model} at adaptcheck's settings "
                    f"(each check chooses its own engine arguments; give --serve to certify yours)")
        parts = [f"{self.engine}{' ' + self.engine_version if self.engine_version else ''}",
                 f"TP {self.tensor_parallel_size}", f"PP {self.pipeline_parallel_size}"]
        if self.max_model_len:
            parts.append(f"max_model_len {self.max_model_len}")
        parts += [f"KV cache {self.kv_cache_dtype}", self.compile_mode]
        return f"{shlex.join(self.command)} ({', '.join(parts)}; digest {self.digest[:12]})"


def deployment_digest(engine: str, model: str, engine_args: dict[str, JsonValue], server_args: list[str]) -> str:
    """The digest of a normalized deployment (sorted keys, compact JSON)."""
    blob = json.dumps({"engine": engine, "model": model, "engine_args": engine_args, "server_args": server_args},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def normalized_text(engine: str, model: str, engine_args: dict[str, JsonValue], server_args: list[str]) -> str:
    """The normalized command as one line: ``engine model --flag value …`` with sorted flags."""
    words = [engine, model]
    for name in sorted(engine_args):
        value = engine_args[name]
        words += [f"--{name.replace('_', '-')}",
                  json.dumps(value, sort_keys=True, separators=(",", ":")) if not isinstance(value, str) else value]
    return shlex.join(words + list(server_args))


def deployed_features(args: dict[str, JsonValue], tensor_parallel_size: int, compile_mode: str) -> list[str]:
    """The serving features these engine arguments turn on, in the features table's order."""
    on: list[str] = []
    if tensor_parallel_size > 1:
        on.append("tensor_parallel")
    if args.get("enable_prefix_caching") is True:
        on.append("prefix_caching")
    if compile_mode == "compiled":
        on.append("graph_capture")
    if args.get("speculative_config"):
        on.append("spec_decode")
    if str(args.get("kv_cache_dtype") or "auto").startswith("fp8"):
        on.append("fp8_kv_cache")
    if args.get("enable_chunked_prefill") is True:
        on.append("chunked_prefill")
    order = list(DEPLOYED_FEATURE_ARGS)
    return sorted(on, key=order.index)
