"""Test fixture: a vLLM general plugin whose ``register`` does nothing.

vLLM would call ``register()`` in every process it starts; adaptcheck only reads the
entry point's metadata and never imports this module.
"""


def register() -> None:
    """Nothing to register: the plugin exists to be discovered."""
