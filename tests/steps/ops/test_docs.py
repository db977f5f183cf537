"""docs/ops.md (the provider interface) is generated from the catalog and must stay current."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.steps.ops.catalog import FAMILIES, all_ops
from adaptcheck.steps.ops.docgen import render


def test_ops_doc_is_current() -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "ops.md"
    assert doc.read_text() == render(), "regenerate: python -m adaptcheck.steps.ops.docgen > docs/ops.md"


def test_every_family_is_present_with_a_torch_implementation() -> None:
    from adaptcheck.steps.ops.providers.torch_provider import TorchProvider

    ops = all_ops()
    assert {op.family for op in ops.values()} == set(FAMILIES)
    missing = [name for name in ops if TorchProvider().get(name) is None]
    assert missing == []
