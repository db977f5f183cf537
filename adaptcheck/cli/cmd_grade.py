"""``adaptcheck grade``: recompute the grade of a results file; exit 1 below ``--require``, or
when a feature named by ``--require-feature`` (docs/features.md) or a model family named by
``--require-family`` (docs/families.md) is not certified.

Also the CI entry point for an existing results.json: ``--junit PATH`` writes its JUnit XML.
A file edited after its run or without digest is refused (exit 5) — CI must not certify a
forged file — unless ``--allow-unverified``, which grades it and marks every output unverified.
"""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.base.errors import GradeBelowRequired, UnknownNameError, UsageError
from adaptcheck.base.families import FAMILIES, FAMILY_TABLE
from adaptcheck.base.features import FEATURE_TABLE, FEATURES, TagTable
from adaptcheck.base.schemas.certificate import certificate_subject
from adaptcheck.base.schemas.ladder import LEVELS
from adaptcheck.base.trusted import ALLOW_HELP, ALLOW_OPTION, load_verified
from adaptcheck.cli.output import Format, Output
from adaptcheck.cli.render import print_grade
from adaptcheck.grade import level_at_least
from adaptcheck.runfolder import regrade


def check_level(level: str) -> str:
    """Validate an L1-L5 level argument."""
    if level not in LEVELS:
        raise UsageError(f"--require {level!r} is not a level", hint="use one of " + ", ".join(LEVELS))
    return level


def check_names(table: TagTable, values: list[str] | None, example: str) -> list[str]:
    """Validate ``--require-feature`` / ``--require-family`` values (repeatable, comma-separated)
    into known names of ``table``.

    An unknown name is a usage error (exit 2) with its "did you mean"; so is a value that names
    nothing (``--require-feature ,``): a gate on nothing would pass vacuously.
    """
    if not values:
        return []
    option = f"--require-{table.noun}"
    names, problems = table.parse(values)
    if problems:
        plural = "features" if table.noun == "feature" else "families"
        raise UnknownNameError(f"{option}: " + "; ".join(problems),
                               hint=f"known {plural}: " + ", ".join(table.names))
    if not names:
        raise UsageError(f"{option} names no {table.noun}", hint=f"e.g. {option} {example}")
    return names


def check_features(values: list[str] | None) -> list[str]:
    """Validate ``--require-feature`` values (:func:`check_names`)."""
    return check_names(FEATURE_TABLE, values, "spec_decode,fp8_kv_cache")


def grade(
    results_path: Path = typer.Argument(..., metavar="RESULTS.json", help="results.json written by 'adaptcheck run'."),
    require: str | None = typer.Option(None, "--require", "-r", help="Exit 1 unless the grade is at least this level (L1-L5)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml."),
    require_feature: list[str] | None = typer.Option(
        None, "--require-feature", metavar="NAME[,NAME…]",
        help="Exit 1 unless each named serving feature is certified (repeatable or comma-separated): "
        + ", ".join(FEATURES) + "."),
    require_family: list[str] | None = typer.Option(
        None, "--require-family", metavar="NAME[,NAME…]",
        help="Exit 1 unless each named model family is certified (repeatable or comma-separated): "
        + ", ".join(FAMILIES) + "."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write JUnit XML (one test case per check, plus 'grade' "
                                      "and one per feature and per family) to this path."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=ALLOW_HELP),
) -> None:
    """Print the grade and the blockers for the next level, one per line.

    Exit codes:
      0  the grade meets --require and every --require-feature / --require-family is certified
      1  the grade is below --require, or a required feature or family is not certified (one line each)
      2  usage error (e.g. --require L9, an unknown --require-feature or --require-family name)
      3  the file is unreadable or not a valid results.json
      5  the file was edited after its run or carries no digest (see --allow-unverified)
    """
    if require is not None:
        check_level(require)
    features = check_features(require_feature)
    families = check_names(FAMILY_TABLE, require_family, "mla,moe")
    out = Output(fmt)
    stored, integrity = load_verified(results_path, allow_unverified)
    results = regrade(stored)
    unverified = integrity.unverified_reason
    if unverified:
        # Grading trusts the checks in the file: when nothing vouches for them, say so first.
        out.info(f"UNVERIFIED ({unverified}): {integrity.message}; graded because of {ALLOW_OPTION}",
                 style="bold red")
    if results.grade.level != stored.grade.level:
        out.info(f"note: the file says {stored.grade.level}, but its checks and rules give {results.grade.level};"
                 " using the recomputed grade", style="yellow")
    print_grade(out, results)
    level_meets = require is None or level_at_least(results.grade.level, require)
    missing = [results.feature(name) for name in features if not results.feature(name).certified]
    for row in missing:
        # One line each, greppable: the feature, then its status and why.
        out.info(f"required feature {row.name}: {row.label}", style="bold red")
    missing_families = [results.family(name) for name in families if not results.family(name).certified]
    for fam in missing_families:
        out.info(f"required family {fam.name}: {fam.label}", style="bold red")
    if junit is not None:
        from adaptcheck.report.junit import write_junit

        write_junit(results, junit, require, unverified=unverified, required_features=features,
                    required_families=families)
        out.info(f"junit:   {junit}")
    subject = certificate_subject(results)
    out.data({"grade": results.grade.level, "name": results.grade.name, "required": require,
              "meets": level_meets and not missing and not missing_families,
              # Beside the level, never folded into it (docs/features.md): each row's status and the checks behind it.
              "features": {row.name: {"status": row.status.value, "reason": row.reason, "label": row.label,
                                      "checks": row.checks} for row in results.feature_rows()},
              "required_features": features, "features_not_certified": [row.name for row in missing],
              # The model families the same way (docs/families.md); 'model': the model under test is of it.
              "families": {fam.name: {"status": fam.status.value, "reason": fam.reason, "label": fam.label,
                                      "checks": fam.checks, "model": fam.model} for fam in results.family_rows()},
              "model_families": results.model.families, "required_families": families,
              "families_not_certified": [fam.name for fam in missing_families],
              "blockers": results.grade.blockers, "steps_not_run": results.grade.steps_not_run,
              "integrity": integrity.status.value, "verified": integrity.intact,
              "unverified_reason": unverified,
              # What the grade certifies (docs/ci.md): the model with its digest and dtype, the frameworks, and
              # 'deployment': the deployment under test as results.json holds it (null in a file older than 1.7).
              "subject": subject.line(), **subject.model_dump(mode="json")})
    problems = [] if level_meets else [f"grade {results.grade.level} is below the required {require}"]
    if missing:
        problems.append("required feature(s) not certified: "
                        + ", ".join(f"{row.name} ({row.status.value})" for row in missing))
    if missing_families:
        problems.append("required family(ies) not certified: "
                        + ", ".join(f"{fam.name} ({fam.status.value})" for fam in missing_families))
    if problems:
        raise GradeBelowRequired("; ".join(problems))
