"""The matrix page: one row per combination, grade colouring, blockers, untrusted text escaped."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from markupsafe import escape

from adaptcheck.fleet import merge_results
from adaptcheck.fleet.html import render_fleet

from .runs import FleetRuns, derive, fleet_runs_fixture  # noqa: F401 - a fixture

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


class _Rows(HTMLParser):
    """Collects tag names, attributes and the ids of table rows."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.row_ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs
        if tag == "tr" and dict(attrs).get("id"):
            self.row_ids.append(str(dict(attrs)["id"]))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Rows:
    parser = _Rows()
    parser.feed(page)
    return parser


def test_page_has_a_row_per_combination_with_grades_and_blockers(fleet_runs: FleetRuns) -> None:
    matrix = merge_results(fleet_runs.all)
    page = render_fleet(matrix)
    parsed = _parse(page)
    assert parsed.row_ids == [f"row-{r.id}" for r in matrix.rows]
    text = " ".join(parsed.text)
    for row in matrix.rows:
        assert all(b in text for b in row.latest_blockers)
        assert all(h in text for h in row.hosts)
        assert all(r.run_id in text for r in row.runs)
    cpu = next(r for r in matrix.rows if r.key.backend == "cpu")
    assert cpu.key.versions["torch"] in text
    # Grade colouring is by class: the dummy row's L0 and the cpu row's L4.
    classes = [v for k, v in parsed.attrs if k == "class"]
    assert "grade g-L0" in classes and "grade g-L4" in classes
    assert "<script" not in page and "http://" not in page.replace("http-equiv", "")
    assert "default-src 'none'" in page


def test_hostile_machine_text_is_escaped(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    evil = derive(fleet_runs.cpu_high, tmp_path / "evil.json", run_id="evil-run",
                  **{"device.device_name": HOSTILE, "environment.accelerators.0.name": HOSTILE,
                     "environment.hostname": HOSTILE})
    garbage = tmp_path / f"{HOSTILE.replace('/', '_')}.json"
    garbage.write_text("nope")
    page = render_fleet(merge_results([evil, garbage]))
    parsed = _parse(page)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert not any(k.startswith("on") for k, _ in parsed.attrs)
    assert str(escape(HOSTILE)) in page  # shown, as text
    assert HOSTILE in " ".join(parsed.text)


def test_skipped_inputs_are_listed(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    page = render_fleet(merge_results([fleet_runs.cpu_high, missing]))
    assert str(missing) in page and "no such results file" in page
