"""Backends: one class per device family, discovered through the ``adaptcheck.backends`` entry points."""
