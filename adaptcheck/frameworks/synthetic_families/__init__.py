"""The embedded model families beyond dense and Mixtral-style MoE: each module registers its
variants and its :class:`~adaptcheck.frameworks.synthetic.ArchWriter` with
:func:`adaptcheck.frameworks.synthetic.register` when imported (docs/families.md).
"""

import importlib

FAMILY_MODULES: tuple[str, ...] = ("moe_families", "hybrid", "vlm", "quantized")
"""Module names under this package, imported in this order."""

for _name in FAMILY_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
