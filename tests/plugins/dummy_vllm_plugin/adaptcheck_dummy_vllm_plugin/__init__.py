"""Test fixture: a vLLM general plugin.

vLLM calls ``register()`` in every process it starts (the engine core and each tensor-parallel
worker); adaptcheck only reads the entry point's metadata and never imports this module.

By default ``register`` does nothing: the plugin exists to be discovered. ``ADAPTCHECK_PLANT`` in
the environment plants a defect in every vLLM process (tests/steps/frameworks/test_deployment_run.py,
benchmarks/deployment_planted.py: the planted deployment must fail its reference check, the same
deployment without the variable must pass):

- ``tp_drop_partial_sum``: tensor-parallel rank 1 contributes zeros to every all-reduce of the TP
  group, so each row-parallel layer sums one rank's partial product (only a TP deployment meets it);
- ``activation_gelu``: the device's SwiGLU activation kernel computes GELU instead of SiLU
  (``SiluAndMul``, the path vLLM's CPU backend runs), a wrong activation on the device.
"""

import os


def register() -> None:
    """Plant the defect the environment names, in this vLLM process; otherwise nothing."""
    plant = os.environ.get("ADAPTCHECK_PLANT")
    if plant == "activation_gelu":
        _plant_activation()
    if plant != "tp_drop_partial_sum":
        return
    import torch
    from vllm.distributed.parallel_state import GroupCoordinator

    if getattr(GroupCoordinator, "_adaptcheck_planted", False):
        return
    real = GroupCoordinator._all_reduce_out_place

    def dropped(self: GroupCoordinator, input_: torch.Tensor) -> torch.Tensor:
        if str(self.unique_name).startswith("tp") and self.rank_in_group == 1:
            input_ = torch.zeros_like(input_)  # this rank's partial sum never reaches the others
        return real(self, input_)

    GroupCoordinator._all_reduce_out_place = dropped
    GroupCoordinator._adaptcheck_planted = True


def _plant_activation() -> None:
    import torch
    import torch.nn.functional as F
    from vllm.model_executor.layers.activation import SiluAndMul

    def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d]) * x[..., d:]

    SiluAndMul.forward_native = staticmethod(gelu_and_mul)
