"""Session fixtures: the embedded synthetic models, written once per test session.

They live under a session temporary folder (``root=``), never in the user's cache, and
``ADAPTCHECK_CACHE_DIR`` is left alone so other tests keep their stable cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.frameworks.synthetic import ensure_model


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the session's synthetic models are written to."""
    return tmp_path_factory.mktemp("synthetic-models")


@pytest.fixture(scope="session")
def tiny_llama(synthetic_root: Path) -> Path:
    """Folder of ``embedded:tiny-llama`` (seed 0)."""
    return ensure_model("tiny-llama", root=synthetic_root)


@pytest.fixture(scope="session")
def tiny_qwen2_d80(synthetic_root: Path) -> Path:
    """Folder of ``embedded:tiny-qwen2-d80`` (seed 0): q/k/v bias, head_dim 80."""
    return ensure_model("tiny-qwen2-d80", root=synthetic_root)


@pytest.fixture(scope="session")
def tiny_moe(synthetic_root: Path) -> Path:
    """Folder of ``embedded:tiny-moe`` (seed 0): the MoE variant vLLM on CPU serves."""
    return ensure_model("tiny-moe", root=synthetic_root)
