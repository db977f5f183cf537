"""Embedding-lookup reference: out[t] = table[ids[t]], an exact row gather."""

from __future__ import annotations

import numpy as np


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Row ``ids[t]`` of ``table`` for every token t.

    Ids are checked against [0, V) first: NumPy would silently wrap a negative id to a row
    from the end, which is exactly the kind of bug (a truncated index) the op is checked for.
    """
    ids = np.asarray(ids)
    table = np.asarray(table)
    if ids.ndim != 1 or table.ndim != 2:
        raise ValueError(f"expected ids [T] and table [V, H], got {ids.shape} and {table.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got {ids.dtype}")
    vocab = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"ids outside [0, {vocab}): min {ids.min()}, max {ids.max()}")
    out = np.empty((ids.shape[0], table.shape[1]), dtype=table.dtype)
    for t, row in enumerate(ids):
        out[t] = table[int(row)]
    return out
