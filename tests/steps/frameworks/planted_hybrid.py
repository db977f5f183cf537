"""Mamba2 kernel defects planted in transformers' real path, for the hybrid family's step-4
tests (``embedded:tiny-hybrid``, docs/families.md).

Each adapter is the real transformers adapter (:mod:`tests.steps.frameworks.planted`'s
pattern: the defect is on only while the adapter computes) with one of the two state-space
kernels of the Granite-hybrid modelling module swapped for a faulty one: the chunked scan
(prefill, and teacher-forced scoring) and the single-token state update (each cached decode
step). Those module functions are where ``mamba_ssm``'s kernels plug in when installed, i.e.
where a vendor's SSM kernel would sit. Ladders name them as
``framework: "tests.steps.frameworks.planted_hybrid:NAME"``.

- :class:`SsmStateNotCarried`: every decode step starts from a zeroed SSM state (a state-cache
  slot that is not read back: the recurrence restarts at each token). Prefill and scoring
  are untouched, so only a check that decodes with the cache can see it.
- :class:`SsmNoDSkip`: the ``D * x`` skip connection is dropped in both kernels.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tests.steps.frameworks.planted import _Planted

MODULE = "transformers.models.granitemoehybrid.modeling_granitemoehybrid"


@contextlib.contextmanager
def _swapped(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """The modelling module's function ``name`` replaced by ``make(original)`` for the block
    (the mixer looks it up at call time, so the swap reaches the running model)."""
    import importlib

    module = importlib.import_module(MODULE)
    original = getattr(module, name)
    setattr(module, name, make(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def _fresh_state(update: Callable[..., Any]) -> Callable[..., Any]:
    def stateless_update(state: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        state.zero_()  # the previous tokens' state is lost: the update starts from nothing
        return update(state, *args, **kwargs)

    return stateless_update


def _no_d(kernel: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(kernel)

    def without_d(*args: Any, **kwargs: Any) -> Any:
        # The mixer passes D by position to one kernel and by keyword to the other; both
        # skip the D * x term when D is None.
        bound = signature.bind(*args, **kwargs)
        bound.arguments["D"] = None
        return kernel(*bound.args, **bound.kwargs)

    return without_d


class SsmStateNotCarried(_Planted):
    display_name = "planted: Mamba2 state not carried between decode steps"

    def defect(self) -> contextlib.AbstractContextManager[None]:
        return _swapped("mamba2_selective_state_update", _fresh_state)


class SsmNoDSkip(_Planted):
    display_name = "planted: Mamba2 D skip connection dropped"

    @contextlib.contextmanager
    def defect(self) -> Iterator[None]:
        with _swapped("mamba2_chunk_scan", _no_d), _swapped("mamba2_selective_state_update", _no_d):
            yield
