"""The heap freeze around the load generator's measured window (adaptcheck/perf/gcguard.py).

What must hold: while frozen, a full collection does not traverse (nor free) what was alive
before the freeze; after the thaw everything is collectable again (no leak); overlapping
freezes unfreeze only with the last thaw; and the load generator really holds the freeze
during its measured window, and not after it.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from adaptcheck.openai_client.records import StreamChunk
from adaptcheck.perf import loadgen
from adaptcheck.perf.gcguard import HeapFreeze
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig
from adaptcheck.perf.workload import PromptFactory, Shape, Workload


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage_cycle() -> weakref.ref[_Cycle]:
    """A cycle nobody refers to (only the cyclic collector frees it), watched by a weak reference."""
    return weakref.ref(_Cycle())


@pytest.fixture(autouse=True)
def _clean_gc() -> Any:
    gc.collect()
    yield
    assert gc.get_freeze_count() == 0, "a test left the heap frozen"


def test_frozen_garbage_waits_for_the_thaw() -> None:
    cycle = _garbage_cycle()
    heap = HeapFreeze()
    heap.freeze()
    try:
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert cycle() is not None  # frozen: not traversed, not freed
    finally:
        heap.thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert cycle() is None  # thawed: collected as usual


def test_garbage_made_inside_the_window_is_still_collected() -> None:
    heap = HeapFreeze()
    heap.freeze()
    try:
        cycle = _garbage_cycle()
        gc.collect()
        assert cycle() is None
    finally:
        heap.thaw()


def test_overlapping_freezes_thaw_with_the_last_one_and_thaw_is_idempotent() -> None:
    a, b = HeapFreeze(), HeapFreeze()
    a.freeze()
    b.freeze()
    a.thaw()
    a.thaw()  # twice: no effect on b's freeze
    assert gc.get_freeze_count() > 0
    b.thaw()
    assert gc.get_freeze_count() == 0
    HeapFreeze().thaw()  # never frozen: nothing happens
    off = HeapFreeze(enabled=False)
    off.freeze()
    assert gc.get_freeze_count() == 0
    off.thaw()


@pytest.mark.parametrize("freeze", [True, False])
def test_the_load_generator_freezes_its_measured_window_only(monkeypatch: pytest.MonkeyPatch, freeze: bool) -> None:
    seen: list[int] = []  # the freeze count when each request was sent

    async def fake_completion(self: Any, body: dict[str, Any], *, timeout_s: float) -> Any:
        t = time.perf_counter()
        seen.append(gc.get_freeze_count())
        await asyncio.sleep(0)
        return SimpleNamespace(t_send=t, text="ab", finish_reason="length", prompt_tokens=4, completion_tokens=2,
                               token_ids=[1, 2], chunks=[StreamChunk(t=t + 0.001, text="a", n_tokens=1),
                                                         StreamChunk(t=t + 0.002, text="b", n_tokens=1)])

    async def no_learn(self: Any, control: Any, cfg: Any) -> None:
        return None

    monkeypatch.setattr(loadgen.StreamClient, "completion", fake_completion)
    monkeypatch.setattr(LoadGenerator, "_learn", no_learn)
    gen = LoadGenerator("http://127.0.0.1:9/v1", Workload([Shape(8, 2)], PromptFactory(None), seed=1))
    gen.freeze_gc = freeze
    result = gen.run(RunConfig(arrival="concurrency", level=2, num_requests=4, warmup_requests=2,
                               sample_server=False), level_index=0, run=0)
    assert len(result.measured) == 4 and all(r.error is None for r in result.records)
    warm, window = seen[:2], seen[2:]  # the warm-up requests go first
    assert warm == [0, 0]  # the warm-up is not frozen (its connections are made then)
    assert all((n > 0) == freeze for n in window), seen
    assert gc.get_freeze_count() == 0  # thawed when the run ends
