"""Keeps the garbage collector's full collections out of a timed window (the load generator's).

Why: CPython's cyclic collector stops the whole process while it traverses a generation, and
the oldest generation of a worker that imported torch and transformers holds ~370,000 objects:
one full collection of it took ~220 ms on the 2-core development machine (measured; noisy
host) — several TTFTs of the tiny model, every stream of the run stalled at once. It comes
when enough objects have survived into the oldest generation (the records of earlier runs,
each stream's chunks), so it lands in one run and not in the next: run-to-run variance that
is the client's, not the server's.

What: :meth:`HeapFreeze.freeze` calls :func:`gc.freeze` — every object alive now moves to
the permanent generation, which no collection traverses — and :meth:`HeapFreeze.thaw`
calls :func:`gc.unfreeze`, which puts them back into the oldest generation. Both only splice
lists (O(1)); no collection is forced (a forced full collection would itself cost the
220 ms, once per run). Young collections still run during the window and only see objects
created since the freeze, so garbage cycles made there are still freed and memory stays
bounded over a long window (the soak); whatever was garbage when frozen is freed after
the thaw. ``vllm bench serve`` freezes its heap the same way before its benchmark
(``vllm.utils.gc_utils.freeze_gc_heap``), but for good; a library must give it back.

Nesting and threads: the freeze is process-wide, so only the outermost of overlapping
freezes (a second load generator in another thread) acts, and the last thaw unfreezes.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_depth = 0


class HeapFreeze:
    """Freeze the heap for one timed window; :meth:`thaw` is idempotent and safe without a freeze."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._frozen = False

    def freeze(self) -> None:
        global _depth
        if not self.enabled or self._frozen:
            return
        with _lock:
            if _depth == 0:
                gc.freeze()
            _depth += 1
            self._frozen = True

    def thaw(self) -> None:
        global _depth
        if not self._frozen:
            return
        with _lock:
            _depth -= 1
            self._frozen = False
            if _depth == 0:
                gc.unfreeze()
