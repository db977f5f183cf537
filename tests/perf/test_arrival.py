"""One arrival type (adaptcheck.perf.arrival) for the load generator, both step-5 checks and the report.

What a pattern is (open loop, one wave, closed loop) and how its level reads are facts of the
type: changing them in arrival.py alone changes what ``perf.serving`` and ``perf.soak``
accept, what the load generator does and what the report writes. A source guard keeps the
pattern names from being compared as strings anywhere else.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from adaptcheck.perf import arrival as arrival_mod
from adaptcheck.perf.arrival import TIMED, Arrival, poisson_arrivals
from adaptcheck.perf.loadgen import RunConfig
from adaptcheck.report.perf_serving import level_legend, level_text, level_words
from adaptcheck.steps.perf.serving import ServingParams
from adaptcheck.steps.perf.soak import SoakParams
from tests.report.test_perf_report import scenario, serving, view
from tests.report.test_soak_report import only, perf, soak_check

PKG = Path(__file__).resolve().parents[2] / "adaptcheck"


def test_every_pattern_is_exactly_one_kind_of_loop_and_parses_from_its_name() -> None:
    for a in Arrival:
        assert [a.open_loop, a.one_wave, a.closed_loop].count(True) == 1, a
        assert Arrival.parse(a.value) is a and f"{a}" == str(a) == a.value
    assert TIMED == (Arrival.CONCURRENCY, Arrival.POISSON)
    assert [Arrival.parse(v) for v in ("", None, "Poisson", 3, "constant")] == [None] * 5


def test_both_checks_and_the_load_generator_take_the_one_type() -> None:
    assert ServingParams.model_fields["arrival"].annotation is Arrival
    assert SoakParams.model_fields["arrival"].annotation is Arrival
    assert {f.name: f.type for f in dataclasses.fields(RunConfig)}["arrival"] in (Arrival, "Arrival")
    for a in Arrival:  # every pattern, under the name a ladder writes
        levels = [0.5] if a.open_loop else [4]
        assert ServingParams(scenario="x", arrival=a.value, levels=levels).arrival is a
        assert RunConfig(arrival=a.value, level=4, num_requests=4).arrival is a
    for a in TIMED:
        assert SoakParams(framework="endpoint", arrival=a.value).arrival is a
    with pytest.raises(ValidationError, match="a soak holds a load for a duration: arrival burst is not one"):
        SoakParams(framework="endpoint", arrival="burst")
    with pytest.raises(ValueError, match="arrival must be one of burst, concurrency, poisson, not 'constant'"):
        RunConfig(arrival="constant", level=1, num_requests=1)


def test_a_patterns_facts_changed_once_change_both_checks_the_load_generator_and_the_report(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Make 'concurrency' an open loop at a rate, in arrival.py only: a stand-in for a new
    # pattern, which is a member and a facts row there (an enum gains no member at run time).
    assert scenario(view([serving("c", arrival="concurrency")]), "c").levels[0].level == "1"
    with pytest.raises(ValidationError, match="whole numbers"):
        ServingParams(scenario="x", arrival="concurrency", levels=[0.5])

    open_facts = dataclasses.replace(arrival_mod._FACTS[Arrival.POISSON], level_word="rate", level_axis="rate axis",
                                     text="{} rps", legend="at {}/s", load="{} rps (open loop)")
    monkeypatch.setitem(arrival_mod._FACTS, Arrival.CONCURRENCY, open_facts)

    assert ServingParams(scenario="x", arrival="concurrency", levels=[0.5]).levels == [0.5]
    assert SoakParams(framework="endpoint", arrival="concurrency", level=1.5).level == 1.5
    cfg = RunConfig(arrival="concurrency", level=2, num_requests=4)
    assert cfg.deadline_s() == 3 * 4 / 2 + 60  # an open loop's deadline: three times its expected span
    # The report: table, legend, header and axis of a scenario, and a soak's load.
    assert (level_text(2, "concurrency"), level_legend(2, "concurrency")) == ("2 rps", "at 2/s")
    assert level_words("concurrency") == ("rate", "rate axis")
    s = scenario(view([serving("c", arrival="concurrency")]), "c")
    assert (s.level_word, s.levels[0].level) == ("rate", "1 rps")
    load = {f.label: f.value for f in only(perf([soak_check()])).offered}["load"]
    assert load == "2 rps (open loop)"


def test_old_results_read_as_before() -> None:
    # Results name patterns as strings; a name this version does not know reads as a bare level.
    assert [level_text(2.5, a) for a in ("poisson", "concurrency", "burst", "weird", "")] == \
        ["2.5 req/s", "2.5", "2.5", "2.5", "2.5"]
    assert [level_legend(4, a) for a in ("concurrency", "poisson", "burst", "weird")] == \
        ["c=4", "4 req/s", "burst 4", "4"]
    assert level_words("weird") == ("level", "level")
    loads = [{f.label: f.value for f in only(perf([soak_check(soak={"arrival": a, "level": 2, "duration_s": 30})]))
              .offered}["load"] for a in ("poisson", "concurrency", "weird", None)]
    assert loads == ["2 req/s (Poisson arrivals)", "2 requests in flight", "2 requests in flight",
                     "2 requests in flight"]


def test_only_open_loops_have_send_times_of_their_own() -> None:
    assert Arrival.POISSON.send_times(5.0, 7, count=50) == poisson_arrivals(5.0, 7, count=50)
    with pytest.raises(ValueError, match="not an open loop"):
        Arrival.CONCURRENCY.send_times(5.0, 7, count=5)


def _name_uses(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines comparing with, or keying a dict by, a pattern's name as a string literal."""
    def literal(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in names
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(literal(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(literal(k) for k in node.keys):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_types_own_decides_by_a_patterns_name() -> None:
    names = {a.value for a in Arrival}
    found = [f"{path.relative_to(PKG.parent)}:{line}" for path in sorted(PKG.rglob("*.py"))
             if path != PKG / "perf" / "arrival.py"
             for line in _name_uses(ast.parse(path.read_text(encoding="utf-8")), names)]
    assert found == [], "ask adaptcheck.perf.arrival.Arrival instead of comparing its names"
    # The guard bites: the report's former branch is caught.
    assert _name_uses(ast.parse('x = "a" if arrival == "poisson" else "b"'), names) == [1]
    assert _name_uses(ast.parse('d = {"burst": 1}.get(arrival)'), names) == [1]
