"""Test fixture: a vLLM general plugin.

vLLM calls ``register()`` in every process it starts (the engine core and each tensor-parallel
worker); adaptcheck only reads the entry point's metadata and never imports this module.

By default ``register`` does nothing: the plugin exists to be discovered. With
``ADAPTCHECK_PLANT=tp_drop_partial_sum`` in the environment it plants a defect that only a
tensor-parallel deployment meets: tensor-parallel rank 1 contributes zeros to every all-reduce of
the TP group, so each row-parallel layer sums one rank's partial product instead of all of them
(tests/steps/frameworks/test_deployment_run.py: a deployment at TP 2 must fail its reference
check, and the same deployment without the variable must pass).
"""

import os


def register() -> None:
    """Plant the defect the environment names, in this vLLM process; otherwise nothing."""
    if os.environ.get("ADAPTCHECK_PLANT") != "tp_drop_partial_sum":
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
