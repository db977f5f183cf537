"""The vllm op provider maps its ops by the one table in adaptcheck.frameworks.vllm_ops.

The report reads the same table (tests/report/test_teacher_forced_section.py); here: the
provider keeps no copy of its own, the table names only catalog ops, and every layer-class row
gives the report a kernel name to look for. Runs without vLLM (the table never imports it).
"""

from __future__ import annotations

import pytest

from adaptcheck.frameworks import vllm_ops
from adaptcheck.frameworks.vllm_ops import VLLM_OPS, VllmOp, custom_op_layers
from adaptcheck.steps.ops.catalog import all_ops
from adaptcheck.steps.ops.providers import vllm_attention as va
from adaptcheck.steps.ops.providers import vllm_provider as vp


def test_the_provider_reads_its_kernels_notes_layers_and_gaps_from_the_table() -> None:
    with_kernels = {op for op, o in VLLM_OPS.items() if o.kernels}
    assert set(vp.ADAPTERS) == with_kernels, "an adapter without a table row, or a row without its adapter"
    assert {op: (m.fn, m.kernels, m.note) for op, m in vp.MAPPINGS.items()} == \
        {op: (vp.ADAPTERS[op], VLLM_OPS[op].kernels, VLLM_OPS[op].note) for op in with_kernels}
    assert vp.LAYER_CLASSES == {op: o.layer for op, o in VLLM_OPS.items() if o.layer}
    assert vp.NO_KERNEL == {op: o.no_kernel for op, o in VLLM_OPS.items() if o.no_kernel}
    assert va.CONTIGUOUS_BLOCK_SIZE is vllm_ops.CONTIGUOUS_BLOCK_SIZE


def test_the_table_names_catalog_ops_each_with_a_kernel_or_a_reason() -> None:
    assert set(VLLM_OPS) <= set(all_ops())
    assert [op for op, o in VLLM_OPS.items() if bool(o.kernels) == bool(o.no_kernel)] == []


def test_every_layer_row_gives_the_report_a_class_and_a_kernel_name() -> None:
    # A layer row without a kernel name would be dropped by custom_op_layers, silently unmarked.
    layers = custom_op_layers()
    assert set(layers) == {op for op, o in VLLM_OPS.items() if o.layer}
    for op, (cls, kernel) in layers.items():
        assert cls and "." not in cls and ":" not in cls, op
        assert kernel.startswith("_C::"), op


@pytest.mark.parametrize(("entry", "served"), [
    (VllmOp(("_C.rms_norm",), layer="m:RMSNorm"), ("RMSNorm", "_C::rms_norm")),
    (VllmOp(("_C.a", "_C.b"), layer="m:Two"), ("Two", "_C::a")),
    (VllmOp(layer="m:GELU", layer_kernel="_C::gelu", no_kernel="none here"), ("GELU", "_C::gelu")),
    (VllmOp(("pkg.mod:fn",), layer="m:Py"), ("Py", None)),  # a Python path is no dispatcher op
    (VllmOp(("_C.cpu_fused_moe",)), (None, None)),
])
def test_the_served_kernel_is_the_adapters_first_in_the_dispatchers_spelling(
        entry: VllmOp, served: tuple[str | None, str | None]) -> None:
    assert (entry.layer_class, entry.served_kernel) == served
