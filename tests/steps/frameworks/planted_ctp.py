"""Planted defects for ``framework.compile`` and ``framework.tensor_parallel`` (tests and
benchmarks/feature_compile_tp.py only; docs/features.md).

* :class:`PaddedSizesCompiled` (ladder ``framework: "tests.steps.frameworks.planted_ctp:PaddedSizesCompiled"``):
  vLLM in process whose *compiled* model differs from eager only at the step sizes that a CUDA
  graph would pad (3, 5, 6, 7 tokens: between the captured sizes 1, 2, 4, 8). The eager path
  and every other size are untouched, so prompts submitted one at a time agree with eager and
  only a batch of 3 or 5 shows the defect.
* :class:`DropRankPartial` (ladder ``engine_args: {worker_extension_cls:
  "tests.steps.frameworks.planted_ctp.DropRankPartial"}``): vLLM imports this class in every
  worker process it starts (its public ``worker_extension_cls`` hook); importing this module
  makes the CPU communicator's all-reduce drop every rank's partial sum but rank 0's. At world
  size 1 vLLM never calls the communicator, so only the tensor-parallel instance is wrong.
"""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from adaptcheck.frameworks.base import LoadOptions
from adaptcheck.frameworks.vllm_fw import VllmFramework

PADDED_SIZES = frozenset({3, 5, 6, 7})
"""Token counts a CUDA graph captured at 1, 2, 4, 8 would pad; the planted compiled path is wrong there."""


def _plant_dropped_partial() -> None:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    if getattr(CpuCommunicator.all_reduce, "_planted", False):
        return
    original = CpuCommunicator.all_reduce

    def all_reduce(self: Any, input_: Any) -> Any:
        if self.rank_in_group != 0:
            input_.zero_()  # this rank's partial sum never reaches the reduction
        return original(self, input_)

    all_reduce._planted = True  # type: ignore[attr-defined]
    CpuCommunicator.all_reduce = all_reduce  # type: ignore[method-assign]


class DropRankPartial:
    """vLLM's ``worker_extension_cls``: no methods of its own; importing its module plants the defect."""


_plant_dropped_partial()


def _plant_padded_sizes(model: Any) -> int:
    """Wrap the compiled dispatcher of every torch.compile'd module in ``model`` (run in the worker)."""
    import torch

    planted = 0
    for mod in model.modules():
        cls = type(mod)
        if getattr(mod, "do_not_compile", True) or getattr(cls.__call__, "_planted", False):
            continue
        original = cls.__call__

        def call(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            out = _original(self, *args, **kwargs)
            if self.do_not_compile or not isinstance(out, torch.Tensor) or out.shape[0] not in PADDED_SIZES:
                return out
            # The last row of the step comes out scaled (a replay that mixes in a zeroed padding row):
            # after the final norm this flattens that token's distribution; its argmax mostly survives.
            out = out.clone()
            out[-1] = out[-1] * 0.5
            return out

        call._planted = True  # type: ignore[attr-defined]
        cls.__call__ = call
        planted += 1
    return planted


class PaddedSizesCompiled(VllmFramework):
    """vLLM in process whose compiled path is wrong at padded batch sizes only."""

    name = "planted_padded_sizes_compiled"

    def load(self, opts: LoadOptions, device: str) -> float:
        took = super().load(opts, device)
        # In process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one rank) the model lives in this process.
        self.llm.apply_model(_plant_padded_sizes)
        return took


TEACHER: dict[str, JsonValue] = {"prompts": 3, "long_prompt_tokens": 128, "max_tokens": 16}
"""The quick ladder's float64 teacher: its CPU control scales the same-framework bound. A smaller
one (1 prompt of 8 tokens) gave a control too quiet for bf16 run-to-run noise: healthy compile
and TP failed the distributions row on seed 1."""


def compile_checks() -> list[dict[str, JsonValue]]:
    """One ladder for every compile outcome: healthy, eager under compile (defect 1), and the
    compiled path wrong at padded sizes (defect 2). Ids: compile.healthy / .eager / .padded."""
    def check(id_: str, **params: JsonValue) -> dict[str, JsonValue]:
        return {"id": id_, "step": 4, "kind": "framework.compile",
                "params": {"framework": "vllm", "teacher": dict(TEACHER), "max_tokens": 12, **params}}

    return [check("compile.healthy"),
            check("compile.eager", engine_args={"compilation_config": {"mode": 0}}),
            check("compile.padded", framework=f"{__name__}:PaddedSizesCompiled")]


def tensor_parallel_checks() -> list[dict[str, JsonValue]]:
    """Healthy TP 2 on the CPU and the dropped partial sum. Ids: tp.healthy / tp.dropped."""
    def check(id_: str, **params: JsonValue) -> dict[str, JsonValue]:
        return {"id": id_, "step": 4, "kind": "framework.tensor_parallel",
                "params": {"framework": "vllm", "compile": False, "teacher": dict(TEACHER), "max_tokens": 12, **params}}

    return [check("tp.healthy"),
            check("tp.dropped", engine_args={"worker_extension_cls": f"{__name__}.DropRankPartial"})]
