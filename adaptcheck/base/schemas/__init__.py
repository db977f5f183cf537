"""Pydantic schemas: the ladder spec, the captured environment and the run results."""
