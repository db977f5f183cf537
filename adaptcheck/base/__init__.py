"""The base layer: what every other layer may import, and which imports only itself.

Pydantic schemas of the files adaptcheck reads and writes (``schemas/``), data loading
(``yamldata``, ``safejson``, ``paths``), the error map (``errors``), redaction and terminal
safety, integrity digests, the plugin loader, dtypes and process plumbing (``procs``). The
layering rule is tested (tests/test_layers.py); the architecture: README, "Architecture".
"""
