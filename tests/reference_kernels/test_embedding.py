"""Embedding reference: exact row gather and id bounds."""

from __future__ import annotations

import numpy as np
import pytest

from reference_kernels.embedding import embedding


def test_embedding_gathers_rows_including_repeats_and_the_last_row() -> None:
    table = np.arange(12.0).reshape(4, 3)
    out = embedding(np.array([3, 0, 3, 1]), table)
    assert out.tolist() == [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0], [9.0, 10.0, 11.0], [3.0, 4.0, 5.0]]


def test_embedding_large_ids_are_not_truncated() -> None:
    table = np.zeros((151936, 1))
    table[151935, 0] = 1.0
    table[151935 - 65536, 0] = 2.0
    assert embedding(np.array([151935]), table).tolist() == [[1.0]]


def test_embedding_rejects_ids_out_of_range() -> None:
    table = np.zeros((4, 2))
    for bad in ([-1], [4]):
        with pytest.raises(ValueError):
            embedding(np.array(bad), table)
    with pytest.raises(ValueError):
        embedding(np.array([0.0]), table)
