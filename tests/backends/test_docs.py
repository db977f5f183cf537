"""docs/backends.md's contract block is generated from the Backend class and must stay current."""

from __future__ import annotations

from adaptcheck.backends.docgen import DOC, declarations, hooks, render


def test_backends_doc_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text == render(text), "regenerate: python -m adaptcheck.backends.docgen"


def test_every_declaration_and_hook_is_documented() -> None:
    missing = [name for name, doc in declarations() if not doc.strip()]
    assert missing == [], f"Backend attributes without a docstring: {missing}"
    names = {sig.split("(")[0] for sig, _ in hooks()}
    assert {"probe", "_probe", "inventory", "parse_smi", "data_path", "runtime_versions"} <= names
    undocumented = [sig for sig, doc in hooks() if not doc.strip()]
    assert undocumented == []
