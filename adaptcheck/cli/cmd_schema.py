"""``adaptcheck schema``: print the JSON Schema of results.json or of a ladder file."""

from __future__ import annotations

import json

import typer
from pydantic import BaseModel

from adaptcheck.base.errors import UsageError, did_you_mean
from adaptcheck.base.schemas.ladder import LadderSpec
from adaptcheck.base.schemas.results import RunResults

SCHEMAS: dict[str, type[BaseModel]] = {"results": RunResults, "ladder": LadderSpec}


def schema(which: str = typer.Argument("results", help="results or ladder.")) -> None:
    """Print a JSON Schema on stdout."""
    model = SCHEMAS.get(which)
    if model is None:
        raise UsageError(f"no schema {which!r}", hint=did_you_mean(which, list(SCHEMAS)))
    typer.echo(json.dumps(model.model_json_schema(), indent=2))
