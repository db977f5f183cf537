"""Operator families: each module exports ``OPS: list[OpDef]`` (case model, inputs, reference,
native torch implementation). Adding an op: docs/adding-an-op.md."""
