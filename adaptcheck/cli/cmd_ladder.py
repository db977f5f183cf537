"""``adaptcheck ladder show``: a ladder as it runs, ``extends:`` merged and grade rules included.

The YAML it prints is the text a run folder stores as ``ladder.yaml`` (for a ladder that
extends another, generated from the merged data; for a flat one, the file itself with its
grade include written out), so what is shown is exactly what a run would execute and
``--resume`` would re-read. ``--format table`` lists the checks and which file gave each
its values; ``--format json`` the resolved ladder as JSON.
"""

from __future__ import annotations

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.ladder.loader import load_ladder

app = typer.Typer(name="ladder", help="Ladders: print one resolved (extends merged, grade rules included).",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})


@app.command("show")
def show(
    name: str = typer.Argument(..., help="Built-in ladder name (quick, standard) or a YAML path."),
    # yaml by default, unlike the listing commands: the ladder file is the thing asked for.
    fmt: Format = typer.Option(Format.YAML, "--format", "-f", help="yaml (the resolved ladder file), json, or "
                               "table (its checks and where each one's values come from)."),
) -> None:
    """Print a ladder resolved: what a run of it executes and stores as ladder.yaml."""
    out = Output(fmt)
    ladder = load_ladder(name)
    if fmt is Format.YAML:
        out.document(ladder.text)
        return
    if fmt is Format.JSON:
        out.data(ladder.data)
        return
    chain = " extends ".join(s.removeprefix("builtin:") for s in (ladder.source, *ladder.parents))
    spec = ladder.spec
    out.table(f"Ladder {spec.id} {spec.version} ({chain}): {len(spec.checks)} checks",
              ["id", "step", "kind", "time limit s", "from"],
              [[c.id, c.step, c.kind, f"{spec.timeout_for(c):g}",
                ", ".join(s.removeprefix("builtin:") for s in ladder.origins.get(c.id, ()))]
               for c in spec.checks])
