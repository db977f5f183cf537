"""docs/compatibility.md is generated from matrices/: the counts a reader sees are the data's."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.compat.docgen import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


def test_compatibility_page_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), \
        "regenerate: python -m adaptcheck.compat.docgen > docs/compatibility.md"


def test_page_counts_every_accelerator_backend() -> None:
    text = render()
    for backend in ("cuda", "rocm", "hygon", "ascend", "xpu", "cambricon", "musa", "metax"):
        assert f"\n| {backend} | " in text and f"\n## {backend}\n" in text
