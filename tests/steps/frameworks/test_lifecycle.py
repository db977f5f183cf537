"""The shared framework instance: reused by checks that agree, kept when an adapter has nothing to load."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.frameworks.base import (
    Availability,
    Framework,
    FrameworkUnavailable,
    Generation,
    GenRequest,
    LoadOptions,
)
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.frameworks.lifecycle import SCRATCH_KEY, acquire, release

HERE = __name__  # this module, by the name the framework registry imports it under


class CountingFramework(Framework):
    """Loads nothing; counts loads and shutdowns so a test sees what the session did."""

    name = "counting"
    display_name = "counting"
    loads: ClassVar[int] = 0
    shutdowns: ClassVar[int] = 0

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)

    def load(self, opts: LoadOptions, device: str) -> float:
        type(self).loads += 1
        return 0.0

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        return [Generation(token_ids=[], text="", finish_reason="length") for _ in requests]

    def shutdown(self) -> None:
        type(self).shutdowns += 1


@pytest.fixture
def ctx(tmp_path: Path) -> CheckContext:
    CountingFramework.loads = CountingFramework.shutdowns = 0
    return CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path,
                        model=ModelSpec(name="embedded:tiny-llama", precision="fp32"))


def test_same_options_reuse_the_loaded_instance(ctx: CheckContext) -> None:
    first = acquire(ctx, f"{HERE}:CountingFramework", "a")
    again = acquire(ctx, f"{HERE}:CountingFramework", "b")
    assert again is first and CountingFramework.loads == 1 and first.loaded_by == "a"
    other = acquire(ctx, f"{HERE}:CountingFramework", "c", compile=True)
    assert other is not first and CountingFramework.loads == 2 and CountingFramework.shutdowns == 1
    release(ctx)
    assert CountingFramework.shutdowns == 2 and SCRATCH_KEY not in ctx.scratch


def test_an_endpoint_without_endpoint_url_does_not_shut_the_running_framework_down(ctx: CheckContext) -> None:
    # Step 4's endpoint checks run between vllm_serve's and step 5's: without --endpoint they
    # must not cost the run the server step 5 reuses.
    active = acquire(ctx, f"{HERE}:CountingFramework", "a")
    with pytest.raises(FrameworkUnavailable, match="--endpoint"):
        acquire(ctx, "endpoint", "b")
    assert ctx.scratch[SCRATCH_KEY] is active and CountingFramework.shutdowns == 0
    release(ctx)
