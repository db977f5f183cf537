"""Inference frameworks behind one interface, shared by step 4 (bring-up) and step 5 (perf): the
adapter contract, the adapters, model sources and the servers adaptcheck launches. The modules
and how they fit: docs/frameworks.md.
"""
