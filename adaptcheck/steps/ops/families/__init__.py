"""Operator families: each module exports ``OPS: list[OpDef]`` (case model, inputs, reference)."""
